"""No secret a blob store URL, option or endpoint carries ever appears in a message: :func:`redact` on each
form, then every error ``open_blob_store`` and the stores' operations raise for URLs and options that
carry planted secrets (an S3 key in the query, userinfo before the bucket, an endpoint with a password,
Azure SAS tokens, account keys and connection strings), pointed at a port nothing listens on."""

from __future__ import annotations

import base64
import socket
import traceback
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.blobstore.redact import MASK, RedactedError, redact, scrub_chain
from blobstate.blobstore.schemes import hadoop_location, location_without_options
from blobstate.errors import BlobstateError, BlobStoreError

AKID = "AKIAPLANTEDKEYID0001"
S3_SECRET = "PlantedSecretAccessKey0002"
S3_TOKEN = "PlantedSessionToken0003"
USERINFO_KEY = "AKIAPLANTEDUSERINFO04"
USERINFO_SECRET = "PlantedUserinfoSecret0005"
SLASH_SECRET = "Planted/Slash+Secret0006"
"""AWS secrets may hold a ``/``, which a URL parser takes for the start of the path."""
ENDPOINT_USER = "planteduser0007"
ENDPOINT_PASS = "PlantedEndpointPass0008"
ENCODED_PASS = "PlantedEncodedPass0009"
KEYWORD_PASS = "PlantedKeywordPass0010"
SAS_SIG = "PlantedSasSignature0011"
ACCOUNT_KEY = base64.b64encode(b"planted-account-key-0012").decode()
CONNECTION_KEY = base64.b64encode(b"planted-connection-key-0013").decode()
ENV_ACCOUNT_KEY = base64.b64encode(b"planted-environment-key-0014").decode()
AZURE_ENDPOINT_PASS = "PlantedAzureEndpointPass0015"
AZURE_USERINFO_PASS = "PlantedAzureUserinfoPass0016"

PLANTED = (
    AKID,
    S3_SECRET,
    S3_TOKEN,
    USERINFO_KEY,
    USERINFO_SECRET,
    SLASH_SECRET,
    *SLASH_SECRET.split("/"),
    ENDPOINT_USER,
    ENDPOINT_PASS,
    ENCODED_PASS,
    KEYWORD_PASS,
    SAS_SIG,
    ACCOUNT_KEY,
    CONNECTION_KEY,
    ENV_ACCOUNT_KEY,
    AZURE_ENDPOINT_PASS,
    AZURE_USERINFO_PASS,
)
"""Every planted secret (and the pieces of the one holding slashes)."""

FAST = "connect_timeout=1&max_attempts=1"


def assert_hidden(text: str, what: str = "") -> None:
    """No planted secret in ``text`` (percent-encoded or not)."""
    for secret in PLANTED:
        assert secret not in text and quote(secret, safe="") not in text, f"{secret} shown{what}: {text}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"s3://b/p?access_key_id={AKID}&secret_access_key={S3_SECRET}&session_token={S3_TOKEN}&read_timeout=3",
            "s3://b/p?access_key_id=***&secret_access_key=***&session_token=***&read_timeout=3",
        ),
        (f"in 's3://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/p?x=1': no", "in 's3://***@bucket/p?x=1': no"),
        (f"s3://{USERINFO_KEY}:{SLASH_SECRET}@bucket/p", "s3://***@bucket/p"),
        (
            f"at http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:9/x, then",
            "at http://***@127.0.0.1:9/x, then",
        ),
        (
            f"s3://b/p?endpoint_url=http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:9&max_attempts=1",
            "s3://b/p?endpoint_url=http://***@127.0.0.1:9&max_attempts=1",
        ),
        (
            "s3://b/p?endpoint_url=" + quote(f"http://{ENDPOINT_USER}:{ENCODED_PASS}@127.0.0.1:9", safe=""),
            "s3://b/p?endpoint_url=http%3A%2F%2F***%40127.0.0.1%3A9",
        ),
        (f"https://{ENDPOINT_USER}@host/p", "https://***@host/p"),
        (
            f"az://container@acct.blob.core.windows.net/p?sas_token=sv=2025&sp=rl&sig={SAS_SIG}",
            "az://container@acct.blob.core.windows.net/p?sas_token=***&sp=rl&sig=***",
        ),
        (f"az://c1/p?account_key={ACCOUNT_KEY}&io_threads=2", "az://c1/p?account_key=***&io_threads=2"),
        (
            f"az://c1/p?connection_string=AccountName=a;AccountKey={CONNECTION_KEY};EndpointSuffix=x",
            "az://c1/p?connection_string=***;AccountKey=***;EndpointSuffix=x",
        ),
        (
            f"abfss://{ENDPOINT_USER}:{AZURE_USERINFO_PASS}@acct.dfs.core.windows.net/p",
            "abfss://***@acct.dfs.core.windows.net/p",
        ),
        (f"url: /acct/c/blob?sv=1&sig={SAS_SIG} (Caused by", "url: /acct/c/blob?sv=1&sig=*** (Caused by"),
        (
            f"AccountName=a;AccountKey={CONNECTION_KEY};BlobEndpoint=x",
            "AccountName=a;AccountKey=***;BlobEndpoint=x",
        ),
        (
            f'Invalid bucket name "{USERINFO_KEY}:{USERINFO_SECRET}@bucket": must',
            'Invalid bucket name "***@bucket": must',
        ),
        (
            f'Invalid bucket name "{USERINFO_KEY}:{SLASH_SECRET}@bucket": must',
            'Invalid bucket name "***@bucket": must',
        ),
    ],
)
def test_each_form_of_secret_is_masked(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent
    assert_hidden(expected)


@pytest.mark.parametrize(
    "text",
    [
        "s3://bucket/prefix?read_timeout=30&max_attempts=2",
        "az://container@acct.blob.core.windows.net/prefix",
        "abfss://state@acct.dfs.core.windows.net/ckpt/_spark",
        "http://127.0.0.1:9000/devstoreaccount1 and https://[::1]:9000/p",
        "memory://abc, file:///tmp/a:b@c/d and /tmp/x:y@z",
        "exists 'metadata.json' in s3://b/p failed after 1 attempts in 0.0 s (endpoint http://127.0.0.1:9)",
        "error: version 3 of /tmp/ck is not committed (the latest is 2; retained 1..2)",
    ],
)
def test_text_without_secrets_is_left_alone(text: str) -> None:
    assert redact(text) == text


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, then closed: nothing listens there, a connection is refused
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> int:
    """A port nothing listens on; credentials from the environment planted (Azure) or test keys (S3)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in (
        "BLOBSTATE_S3_ENDPOINT",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL",
        "BLOBSTATE_AZURE_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", ENV_ACCOUNT_KEY)
    return _closed_port()


def secret_urls(port: int) -> dict[str, str]:
    """Every form a URL can carry a secret in, pointed at ``port`` (nothing listens there)."""
    endpoint = f"http://127.0.0.1:{port}"
    azure_endpoint = f"{endpoint}/devstoreaccount1"
    sas = f"sv=2025-11-05&sp=rwdlact&sig={SAS_SIG}"
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={CONNECTION_KEY};"
        f"BlobEndpoint={azure_endpoint}"
    )
    keys = f"access_key_id={AKID}&secret_access_key={S3_SECRET}&session_token={S3_TOKEN}"
    return {
        "s3 keys in the query": f"s3://bucket/prefix?{keys}&endpoint_url={endpoint}&{FAST}",
        "s3 userinfo": f"s3://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/prefix?endpoint_url={endpoint}&{FAST}",
        "s3a userinfo": f"s3a://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/prefix?endpoint_url={endpoint}",
        "s3 userinfo with a slash": f"s3://{USERINFO_KEY}:{SLASH_SECRET}@bucket/prefix?endpoint_url={endpoint}",
        "s3 endpoint userinfo": (
            f"s3://bucket/prefix?{keys}&endpoint_url=http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:{port}"
            f"&{FAST}"
        ),
        "s3 endpoint userinfo encoded": (
            "s3://bucket/prefix?endpoint_url="
            + quote(f"http://{ENDPOINT_USER}:{ENCODED_PASS}@127.0.0.1:{port}", safe="")
            + f"&{FAST}"
        ),
        "s3 endpoint not http": f"s3://bucket/prefix?endpoint_url=ftp://{ENDPOINT_USER}:{ENDPOINT_PASS}@host",
        "s3 keys and a bad option": f"s3://bucket/prefix?{keys}&read_timeout=never",
        "s3 keys and a fragment": f"s3://bucket/prefix?{keys}#frag",
        "s3 keys and an option twice": f"s3://bucket/prefix?{keys}&max_attempts=1&max_attempts=2",
        "az sas encoded": (
            f"az://container@devstoreaccount1.blob.core.windows.net/p?sas_token={quote(sas, safe='')}"
        ),
        "az sas plain": f"az://container/p?sas_token={sas}&endpoint_url={azure_endpoint}",
        "az account key": f"az://container/p?account_key={quote(ACCOUNT_KEY, safe='')}",
        "az connection string": f"az://container/p?connection_string={quote(connection, safe='')}",
        "az connection string plain": f"az://container/p?connection_string={connection}",
        "az sas and a bad option": f"az://container/p?sas_token={quote(sas, safe='')}&io_threads=none",
        "az endpoint userinfo": (
            f"az://container/p?endpoint_url=http://{ENDPOINT_USER}:{AZURE_ENDPOINT_PASS}@127.0.0.1:{port}"
            f"/devstoreaccount1&{FAST}"
        ),
        "az endpoint with a sas": (
            "az://container/p?endpoint_url=" + quote(f"{azure_endpoint}?{sas}", safe="") + f"&{FAST}"
        ),
        "abfss userinfo": f"abfss://{ENDPOINT_USER}:{AZURE_USERINFO_PASS}@devstoreaccount1.dfs.core.windows.net/p",
        "az userinfo": f"az://{ENDPOINT_USER}:{AZURE_USERINFO_PASS}@devstoreaccount1.blob.core.windows.net/p",
        "unknown scheme": f"gs://{USERINFO_KEY}:{USERINFO_SECRET}@bucket/p?secret={S3_SECRET}",
        "file URL userinfo": f"file://{ENDPOINT_USER}:{ENDPOINT_PASS}@host/tmp/checkpoint",
    }


def secret_options(port: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """Secrets given as keywords of ``open_blob_store`` (where they are accepted)."""
    azure_endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    fast: dict[str, Any] = {"connect_timeout": 1, "max_attempts": 1}
    keys = {"access_key_id": AKID, "secret_access_key": S3_SECRET, "session_token": S3_TOKEN}
    return {
        "s3 keys": ("s3://bucket/prefix", {"endpoint_url": f"http://127.0.0.1:{port}", **keys, **fast}),
        "s3 endpoint userinfo": (
            "s3://bucket/prefix",
            {"endpoint_url": f"http://{ENDPOINT_USER}:{KEYWORD_PASS}@127.0.0.1:{port}", **keys, **fast},
        ),
        "s3 secret given twice": (
            f"s3://bucket/prefix?{'&'.join(f'{k}={v}' for k, v in keys.items())}",
            {"secret_access_key": "another-one", "access_key_id": AKID},
        ),
        "az sas": (
            "az://container/p",
            {"endpoint_url": azure_endpoint, "sas_token": f"sig={SAS_SIG}", **fast},
        ),
        "az account key": (
            "az://container/p",
            {"endpoint_url": azure_endpoint, "account_key": ACCOUNT_KEY, **fast},
        ),
        "az endpoint userinfo": (
            "az://container/p",
            {"endpoint_url": f"http://{ENDPOINT_USER}:{AZURE_ENDPOINT_PASS}@127.0.0.1:{port}/x", **fast},
        ),
        "az connection string": (
            "az://container/p",
            {
                "connection_string": (
                    f"AccountName=devstoreaccount1;AccountKey={CONNECTION_KEY};"
                    f"BlobEndpoint=http://{ENDPOINT_USER}:{AZURE_ENDPOINT_PASS}@127.0.0.1:{port}/devstoreaccount1"
                ),
                **fast,
            },
        ),
        "az connection string with a sas": (
            "az://container/p",
            {
                "connection_string": (
                    f"BlobEndpoint={azure_endpoint};SharedAccessSignature=sv=1&sig={SAS_SIG}"
                ),
                **fast,
            },
        ),
    }


def traceback_text(error: BaseException) -> str:
    """The whole traceback Python prints for ``error`` (a Spark task's log, a driver's), every exception
    it was raised from or while handling included."""
    return "".join(traceback.format_exception(error))


def _operations(store: BlobStore) -> Iterator[tuple[str, Callable[[], object]]]:
    yield "exists", lambda: store.exists("metadata.json")
    yield "get", lambda: store.get("metadata.json")
    yield "put", lambda: store.put("x/1", b"1", ttl=60)
    yield "put_if_absent", lambda: store.put_if_absent("x/2", b"2")
    yield "list", lambda: store.list("commits/")
    yield "has_ttl", lambda: store.has_ttl("x/1")
    yield "delete", lambda: store.delete("x/1")
    yield "expiry_problem", store.expiry_problem
    yield "install_expiry_rule", store.install_expiry_rule


def _check_store_and_its_errors(url: str, options: dict[str, Any]) -> int:
    """Open ``url`` and run every operation; every message, repr and URL must hide every secret. Returns
    how many errors were checked."""
    try:
        store = open_blob_store(url, **options)
    except Exception as error:  # refused at open: one error, checked
        assert_hidden(str(error), f" by open_blob_store({url!r})")
        assert_hidden(repr(error), f" by open_blob_store({url!r})")
        assert_hidden(traceback_text(error), f" in the traceback of open_blob_store({url!r})")
        return 1
    checked = 0
    with store:
        for text in (store.url, repr(store), str(getattr(store, "endpoint", ""))):
            assert_hidden(text, " by the store")
        check = store.check_expiry()
        assert_hidden(f"{check.problem} {check.unknown}", " by check_expiry")
        for name, operation in _operations(store):
            try:
                operation()
            except Exception as error:
                assert isinstance(error, BlobstateError), f"{name}: {error!r}"
                assert_hidden(str(error), f" by {name} on {url!r}")
                assert_hidden(repr(error), f" by {name} on {url!r}")
                assert_hidden(traceback_text(error), f" in the traceback of {name} on {url!r}")
                checked += 1
    return checked


def test_no_url_form_shows_its_secrets_in_any_error(port: int) -> None:
    for case, url in secret_urls(port).items():
        assert _check_store_and_its_errors(url, {}) >= 1, case


def test_no_keyword_option_shows_its_secret_in_any_error(port: int) -> None:
    for case, (url, options) in secret_options(port).items():
        assert _check_store_and_its_errors(url, options) >= 1, case


def test_the_checkpoint_url_of_a_query_is_refused_without_its_secrets(port: int) -> None:
    """What ``transform_with_state`` asks of its checkpoint before it opens the store (the options added
    to the URL, Spark's own location beside it) refuses a bad URL with a message that hides its secrets."""
    from blobstate.engine.config import QueryConfig, checkpoint_store_url

    config = QueryConfig.build({}, {})
    for case, url in secret_urls(port).items():
        for ask in (lambda u: checkpoint_store_url(u, config), hadoop_location, location_without_options):
            try:
                ask(url)
            except Exception as error:
                assert isinstance(error, BlobstateError), f"{case}: {error!r}"
                assert_hidden(str(error), f" ({case})")


def test_keys_before_the_bucket_are_refused_before_any_request(port: int) -> None:
    for secret in (USERINFO_SECRET, SLASH_SECRET):
        url = f"s3://{USERINFO_KEY}:{secret}@bucket/prefix?endpoint_url=http://127.0.0.1:{port}"
        with pytest.raises(ValueError, match=r"carries credentials before the bucket name") as refused:
            open_blob_store(url)
        assert "s3://***@bucket/prefix" in str(refused.value)
        assert_hidden(str(refused.value))


def test_an_s3_endpoint_with_credentials_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="carries credentials") as refused:
        open_blob_store("s3://bucket/p", endpoint_url=f"http://{ENDPOINT_USER}:{ENDPOINT_PASS}@127.0.0.1:9")
    assert "http://***@127.0.0.1:9" in str(refused.value)
    assert_hidden(str(refused.value))
    monkeypatch.setenv("BLOBSTATE_S3_ENDPOINT", f"https://{ENDPOINT_USER}:{ENDPOINT_PASS}@s3.example.com")
    with pytest.raises(ValueError, match=r"BLOBSTATE_S3_ENDPOINT.*carries credentials") as refused:
        open_blob_store("s3://bucket/p")
    assert_hidden(str(refused.value))


def test_missing_s3_credentials_name_the_endpoint_without_its_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, port: int
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    url = f"s3://bucket/prefix?endpoint_url=http://127.0.0.1:{port}&{FAST}"
    with (
        open_blob_store(url) as store,
        pytest.raises(BlobstateError, match="no usable AWS credentials") as caught,
    ):
        store.exists("x")
    assert f"http://127.0.0.1:{port}" in str(caught.value) and MASK not in str(caught.value)


def test_reading_a_moved_querys_watermark_shows_no_secret(port: int) -> None:
    """``blobstate.last_watermark_ms`` (the move recipe) names the checkpoint in its errors: redacted."""
    from blobstate import last_watermark_ms

    for case, url in secret_urls(port).items():
        with pytest.raises(BlobstateError) as refused:
            last_watermark_ms(url)
        assert_hidden(str(refused.value), f" ({case})")


class _TextOfItsOwn(Exception):
    """A library exception whose text is not its arguments (as Azure's HTTP errors append the body)."""

    def __str__(self) -> str:
        return f"request GET http://127.0.0.1:1/container/blob?sv=2025-11-05&sig={SAS_SIG} failed"


def test_a_chain_of_library_errors_shows_no_secret_and_keeps_what_failed() -> None:
    try:
        try:
            try:
                raise ConnectionError(f"Max retries exceeded with url: /container/blob?sv=1&sig={SAS_SIG}")
            except ConnectionError as refused:
                raise _TextOfItsOwn() from refused
        except _TextOfItsOwn as failed:
            raise BlobStoreError("get 'metadata.json' in az://container/p failed") from failed
    except BlobStoreError as error:
        assert scrub_chain(error) is error
        text = traceback_text(error)
        # the exception raised from is also the one being handled: both links lead to its stand-in
        assert isinstance(error.__cause__, RedactedError) and error.__context__ is error.__cause__
        assert_hidden(str(error.__context__), " by the context of a scrubbed error")
    assert_hidden(text, " in a scrubbed chain")
    # what failed and how is still there: each exception's type, the redacted URLs, the frames
    assert "ConnectionError: Max retries exceeded with url: /container/blob?sv=1&sig=***" in text
    assert (
        f"{__name__}._TextOfItsOwn: request GET http://127.0.0.1:1/container/blob?sv=2025-11-05&sig=***"
        in text
    )
    assert "raise _TextOfItsOwn() from refused" in text
    assert "BlobStoreError: get 'metadata.json' in az://container/p failed" in text


def test_a_library_error_reaching_the_caller_keeps_its_type_and_loses_its_secret() -> None:
    error = ConnectionError(f"Max retries exceeded with url: /container/blob?sv=1&sig={SAS_SIG}")
    assert scrub_chain(error) is error and type(error) is ConnectionError
    assert_hidden(traceback_text(error), " in a library error scrubbed")
    assert str(error) == "Max retries exceeded with url: /container/blob?sv=1&sig=***"
