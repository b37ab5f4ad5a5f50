"""S3 credentials and addressing as Spark users configure them: options, profiles, the AWS env chain.

Requests go to the real moto server of the fixtures; a botocore ``before-send`` hook only observes the
signed request (the access key id in its Authorization header, its URL).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import BlobStoreError, open_blob_store
from blobstate.blobstore.redact import redact
from blobstate.blobstore.s3 import S3BlobStore
from blobstate.blobstore.s3_options import S3OptionError, s3_url_with_options
from blobstate.engine.config import QueryConfig, checkpoint_store_url

SECRET = "s3cr3t-never-shown-0123456789"
TOKEN = "t0ken-never-shown-0123456789"


def _observe(store: S3BlobStore) -> list[Any]:
    """The requests ``store`` sends from now on (observed, not changed)."""
    sent: list[Any] = []
    store._client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request))
    return sent


def _key_id(request: Any) -> str:
    """The access key id a SigV4-signed request was signed with."""
    auth = request.headers["Authorization"]
    auth = auth.decode() if isinstance(auth, bytes) else auth
    return auth.split("Credential=", 1)[1].split("/", 1)[0]


@pytest.fixture
def aws_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """AWS config and credentials files with profile ``blobtest`` (key id AKIAPROFILE), as the env names."""
    config = tmp_path / "config"
    config.write_text("[profile blobtest]\nregion = us-east-1\n")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[blobtest]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return tmp_path


def test_profile_option_signs_with_the_profiles_keys(s3_url: str, aws_files: Path) -> None:
    with open_blob_store(s3_url, profile="blobtest") as store:
        sent = _observe(store)
        store.put("a", b"1")
        assert store.get("a") == b"1"
    assert {_key_id(r) for r in sent} == {"AKIAPROFILE"}


def test_profile_from_the_query_and_from_aws_profile(
    s3_url: str, aws_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_blob_store(f"{s3_url}?profile=blobtest") as store:
        sent = _observe(store)
        store.put("a", b"1")
    assert _key_id(sent[0]) == "AKIAPROFILE"
    # No option: boto3's chain, where AWS_PROFILE wins over the environment's keys only when they are unset.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_PROFILE", "blobtest")
    with open_blob_store(s3_url) as store:
        sent = _observe(store)
        store.put("b", b"2")
    assert _key_id(sent[0]) == "AKIAPROFILE"


def test_explicit_keys_override_the_environment_and_aws_profile(
    s3_url: str, aws_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "blobtest")
    with open_blob_store(
        s3_url, access_key_id="AKIAEXPLICIT", secret_access_key=SECRET, session_token=TOKEN
    ) as store:
        sent = _observe(store)
        store.put("a", b"1")
        assert SECRET not in repr(store.settings) and TOKEN not in repr(store.settings)
    assert _key_id(sent[0]) == "AKIAEXPLICIT"
    token = sent[0].headers["X-Amz-Security-Token"]
    assert (token.decode() if isinstance(token, bytes) else token) == TOKEN


def test_a_missing_profile_is_one_clear_error(s3_url: str, aws_files: Path) -> None:
    with pytest.raises(BlobStoreError, match=r"nosuch.*named by the profile option.*AWS_CONFIG_FILE"):
        open_blob_store(s3_url, profile="nosuch")


def test_path_style_requests(s3_url: str) -> None:
    with open_blob_store(s3_url, path_style=True) as store:
        sent = _observe(store)
        store.put("a", b"1")
    bucket = s3_url.split("/")[2]
    assert f"127.0.0.1:{sent[0].url.split(':')[2].split('/')[0]}/{bucket}/root/a" in sent[0].url


def test_virtual_addressing_puts_the_bucket_in_the_host(s3_endpoint: str) -> None:
    # botocore never puts a bucket before an IP address, so the endpoint is named "localhost"; the bucket's
    # host name does not resolve, so the request fails after it was built: only its URL counts.
    endpoint = s3_endpoint.replace("127.0.0.1", "localhost")
    url = "s3://vbucket/root?addressing_style=virtual&max_attempts=1"
    with open_blob_store(url, path_style=False, endpoint_url=endpoint) as store:
        sent = _observe(store)
        with pytest.raises(BlobStoreError):
            store.put("a", b"1")
    assert sent[0].url.startswith(f"http://vbucket.{endpoint.removeprefix('http://')}/root/a")


def test_conflicting_and_incomplete_credentials_are_rejected_without_the_secret() -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        (f"s3://b/p?secret_access_key={SECRET}", {}, "must be given together"),
        ("s3://b/p", {"session_token": TOKEN}, "session_token needs access_key_id"),
        ("s3://b/p?profile=x", {"access_key_id": "AKIA", "secret_access_key": SECRET}, "give one of them"),
        ("s3://b/p?path_style=true", {"addressing_style": "virtual"}, "disagree"),
        ("s3://b/p?addressing_style=sideways", {}, "auto, virtual, path"),
        (f"s3://b/p?access_key_id=A&secret_access_key={SECRET}", {"secret_access_key": "other"}, "differs"),
        (f"s3://b/p?secret_access_key={SECRET}#frag", {}, "fragment"),
        ("s3://b/p", {"secret_access_key": 12345678901234}, "non-empty string"),
    ]
    for url, options, named in cases:
        with pytest.raises(S3OptionError, match=named) as caught:
            open_blob_store(url, endpoint_url="http://127.0.0.1:1", **options)
        assert SECRET not in str(caught.value) and "12345678901234" not in str(caught.value)


def test_redacted_url_masks_the_keys_and_nothing_else() -> None:
    url = s3_url_with_options(
        "s3://b/p", {"access_key_id": "AKIA1", "secret_access_key": SECRET, "read_timeout": 3}
    )
    assert SECRET in url  # it travels to the tasks with the URL
    assert redact(url) == "s3://b/p?access_key_id=***&secret_access_key=***&read_timeout=3.0"


def test_spark_conf_names_reach_the_store_url() -> None:
    conf = {
        "spark.blobstate.s3.profile": "blobtest",
        "spark.blobstate.s3.path_style": "true",
        "spark.blobstate.s3.endpoint_url": "http://127.0.0.1:9000",
    }
    config = QueryConfig.build(conf, {})
    assert config.blob_store_options == {
        "profile": "blobtest",
        "path_style": True,
        "endpoint_url": "http://127.0.0.1:9000",
    }
    url = checkpoint_store_url("s3://b/ckpt", config)
    assert url == "s3://b/ckpt?profile=blobtest&path_style=True&endpoint_url=http%3A%2F%2F127.0.0.1%3A9000"
    assert QueryConfig.build({}, {"blob_store_options": {"access_key_id": "AKIA1"}}).blob_store_options
    with pytest.raises(S3OptionError, match=r"path_style.*expected true or false"):
        QueryConfig.build({"spark.blobstate.s3.path_style": "maybe"}, {})


@pytest.fixture
def moto_checks_keys(s3_endpoint: str) -> Iterator[None]:
    """Make the moto server check access keys (its IAM knows none), and stop checking afterwards."""

    def reset(count: str) -> None:
        request = urllib.request.Request(
            f"{s3_endpoint}/moto-api/reset-auth", data=count.encode(), headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(request, timeout=10).close()

    reset("0")
    try:
        yield
    finally:
        reset("inf")


def test_wrong_keys_give_one_error_naming_bucket_and_endpoint(
    s3_url: str, s3_endpoint: str, moto_checks_keys: None
) -> None:
    bucket = s3_url.split("/")[2]
    with open_blob_store(s3_url, access_key_id="AKIAWRONG", secret_access_key=SECRET) as store:
        with pytest.raises(BlobStoreError) as caught:
            store.put("a", b"1")
        message = str(caught.value)
        with pytest.raises(BlobStoreError) as caught_get:
            store.get("a")
    assert f"bucket {bucket!r}" in message and s3_endpoint in message
    assert "rejected the credentials" in message and "AKIAWRONG" in message
    assert SECRET not in message and SECRET not in str(caught_get.value)
    assert "rejected the credentials" in str(caught_get.value)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_the_endpoint_falls_back_to_the_aws_variables(
    s3_url: str, s3_endpoint: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLOBSTATE_S3_ENDPOINT")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv(variable, s3_endpoint)
    with open_blob_store(s3_url) as store:
        sent = _observe(store)
        store.put("a", b"1")
    assert sent[0].url.startswith(f"{s3_endpoint}/{s3_url.split('/')[2]}/root/a")  # path style by default
