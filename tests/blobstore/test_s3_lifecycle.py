"""S3 store specifics against a real S3-protocol server (moto): lifecycle rule, tags, layout, errors."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from blobstate.blobstore import BlobNotFoundError, BlobStoreError, TransientBlobError, open_blob_store
from blobstate.blobstore.base import ExpiryCheck
from blobstate.blobstore.expiry import warn_unless_pending_objects_expire
from blobstate.blobstore.s3 import ENDPOINT_ENV, S3BlobStore, parse_s3_url

MiB = 1024 * 1024


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    """A plain boto3 client on the test server, to look at what the store wrote."""
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def store(s3_url: str) -> Iterator[S3BlobStore]:
    s = open_blob_store(s3_url)
    assert isinstance(s, S3BlobStore)
    yield s
    s.close()


def _tags(s3: Any, bucket: str, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


# --------------------------------------------------------------------------- lifecycle
def test_install_lifecycle_rule_expires_pending_objects_under_the_prefix(store: S3BlobStore, s3: Any) -> None:
    store.install_lifecycle_rule(days=30)
    rules = s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    assert len(rules) == 1
    rule = rules[0]
    assert rule["Status"] == "Enabled"
    assert rule["Expiration"] == {"Days": 30}
    assert rule["Filter"] == {
        "And": {"Prefix": "root/", "Tags": [{"Key": "blobstate-pending", "Value": "true"}]}
    }


def test_reinstalling_replaces_our_rule_and_keeps_other_rules(store: S3BlobStore, s3: Any) -> None:
    foreign = {
        "ID": "someone-elses-rule",
        "Filter": {"Prefix": "logs/"},
        "Status": "Enabled",
        "Expiration": {"Days": 90},
    }
    s3.put_bucket_lifecycle_configuration(Bucket=store.bucket, LifecycleConfiguration={"Rules": [foreign]})
    store.install_lifecycle_rule(days=30)
    store.install_lifecycle_rule(days=7)
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]}
    assert set(rules) == {"someone-elses-rule", store.lifecycle_rule_id}
    assert rules[store.lifecycle_rule_id]["Expiration"] == {"Days": 7}
    assert rules["someone-elses-rule"]["Expiration"] == {"Days": 90}
    assert store.lifecycle_rules() == list(
        s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    )


def test_lifecycle_rule_for_a_whole_bucket_filters_on_the_tag_alone(s3_url: str, s3: Any) -> None:
    bucket, _ = parse_s3_url(s3_url)
    with open_blob_store(f"s3://{bucket}") as store:
        assert isinstance(store, S3BlobStore)
        store.install_lifecycle_rule(days=3)
    (rule,) = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert rule["Filter"] == {"Tag": {"Key": "blobstate-pending", "Value": "true"}}
    assert rule["Expiration"] == {"Days": 3}


def test_lifecycle_rule_needs_at_least_a_day(store: S3BlobStore) -> None:
    with pytest.raises(ValueError, match="at least 1 day"):
        store.install_lifecycle_rule(days=0)


def test_expire_is_left_to_the_lifecycle_rule(store: S3BlobStore) -> None:
    store.put("pending", b"1", ttl=1)
    assert store.expire(now=10**12) == []
    assert store.exists("pending")


def test_expiry_problem_without_a_rule_says_how_to_install_it(store: S3BlobStore) -> None:
    problem = store.expiry_problem()
    assert problem is not None
    assert f"prefix 'root/' of bucket {store.bucket!r}" in problem
    assert f"blobstate gc {store.url} --install-lifecycle" in problem


def test_expiry_problem_is_none_once_the_rule_is_installed(store: S3BlobStore, s3: Any) -> None:
    store.install_expiry_rule()
    assert store.expiry_problem() is None
    (rule,) = s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    assert rule["ID"] == store.lifecycle_rule_id
    assert rule["Expiration"] == {"Days": 30}


def _set_rules(s3: Any, bucket: str, *rules: dict[str, Any]) -> None:
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": list(rules)})


PENDING = {"Key": "blobstate-pending", "Value": "true"}


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        # a whole-bucket rule on the pending tag covers every prefix
        ({"ID": "all", "Filter": {"Tag": PENDING}, "Status": "Enabled", "Expiration": {"Days": 2}}, None),
        (
            {"ID": "off", "Filter": {"Tag": PENDING}, "Status": "Disabled", "Expiration": {"Days": 2}},
            "no enabled lifecycle rule expires pending objects",
        ),
        (
            {
                "ID": "elsewhere",
                "Filter": {"And": {"Prefix": "other/", "Tags": [PENDING]}},
                "Status": "Enabled",
                "Expiration": {"Days": 2},
            },
            "no enabled lifecycle rule",
        ),
        (
            {
                "ID": "part",
                "Filter": {"And": {"Prefix": "root/state/", "Tags": [PENDING]}},
                "Status": "Enabled",
                "Expiration": {"Days": 2},
            },
            "no enabled lifecycle rule",
        ),
        (
            {
                "ID": "other-tag",
                "Filter": {"Tag": {"Key": "blobstate-pending", "Value": "false"}},
                "Status": "Enabled",
                "Expiration": {"Days": 2},
            },
            "no enabled lifecycle rule",
        ),
        (
            {"ID": "wipe", "Filter": {"Prefix": "ro"}, "Status": "Enabled", "Expiration": {"Days": 9}},
            "'wipe' .* expires every object under 'ro', so it would delete committed state",
        ),
        (
            {"ID": "wipe-all", "Filter": {}, "Status": "Enabled", "Expiration": {"Days": 9}},
            "'wipe-all' .* expires every object in the bucket",
        ),
    ],
)
def test_expiry_problem_judges_the_bucket_rules(
    store: S3BlobStore, s3: Any, rule: dict[str, Any], problem: str | None
) -> None:
    _set_rules(s3, store.bucket, rule)
    if problem is None:
        assert store.expiry_problem() is None
    else:
        assert re.search(problem, store.expiry_problem() or "")


def test_expiry_problem_names_our_rule_when_it_is_disabled(store: S3BlobStore, s3: Any) -> None:
    store.install_expiry_rule()
    (rule,) = s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    _set_rules(s3, store.bucket, {**rule, "Status": "Disabled"})
    problem = store.expiry_problem() or ""
    assert f"lifecycle rule {store.lifecycle_rule_id!r} of bucket {store.bucket!r} is disabled" in problem
    assert "--install-lifecycle" in problem
    store.install_expiry_rule()
    assert store.expiry_problem() is None


# --------------------------------------------------------------------------- tags and layout
def test_pending_tag_is_set_at_put_and_removed(store: S3BlobStore, s3: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"file")
    store.put("a/pending", b"1", ttl=60)
    store.put("a/pending-file", source, ttl=60)
    store.put_if_absent("a/pending-once", b"1", ttl=60)
    store.put("a/permanent", b"1")
    for name in ("a/pending", "a/pending-file", "a/pending-once"):
        assert _tags(s3, store.bucket, f"root/{name}") == {"blobstate-pending": "true"}
        store.remove_ttl(name)
        assert _tags(s3, store.bucket, f"root/{name}") == {}
    assert _tags(s3, store.bucket, "root/a/permanent") == {}


def test_names_live_under_the_prefix_and_nothing_else_is_listed(store: S3BlobStore, s3: Any) -> None:
    store.put("state/0/1/1_u.delta", b"d")
    assert s3.get_object(Bucket=store.bucket, Key="root/state/0/1/1_u.delta")["Body"].read() == b"d"
    for key in ("rootx/y", "other/z", "root/dir/", "state/0/1/1_u.delta"):
        s3.put_object(Bucket=store.bucket, Key=key, Body=b"not ours")
    assert store.list() == ["state/0/1/1_u.delta"]
    assert store.list("state/") == ["state/0/1/1_u.delta"]
    assert not store.exists("dir")


def test_list_pages_through_every_page(s3_url: str, s3: Any) -> None:
    with open_blob_store(s3_url, list_page_size=7) as store:
        names = [f"blobs/0/0/{i:03d}" for i in range(40)]
        store.run_parallel(lambda n: store.put(n, b""), names)
        assert store.list("blobs/") == names
        assert store.list("blobs/0/0/01") == names[10:20]


def test_multipart_upload_keeps_content_and_tag(s3_url: str, s3: Any, tmp_path: Path) -> None:
    payload = os.urandom(11 * MiB + 7)
    source = tmp_path / "big"
    source.write_bytes(payload)
    with open_blob_store(s3_url, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB) as store:
        assert isinstance(store, S3BlobStore)
        store.put("blobs/big", source, ttl=60)
        assert "-" in s3.head_object(Bucket=store.bucket, Key="root/blobs/big")["ETag"]  # multipart
        assert store.has_ttl("blobs/big")
        target = tmp_path / "back"
        assert store.get_file("blobs/big", target) == len(payload)
        assert target.read_bytes() == payload


# --------------------------------------------------------------------------- configuration
def test_endpoint_option_wins_over_the_environment(
    s3_url: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENDPOINT_ENV, f"http://127.0.0.1:{_closed_port()}")
    with open_blob_store(s3_url, endpoint_url=s3_endpoint) as store:
        store.put("x", b"1")
        assert store.get("x") == b"1"


def test_endpoint_comes_from_the_environment(s3_url: str, s3_endpoint: str) -> None:
    assert os.environ[ENDPOINT_ENV] == s3_endpoint
    with open_blob_store(s3_url) as store:
        assert isinstance(store, S3BlobStore)
        assert store.endpoint_url == s3_endpoint
        assert store.region == "us-east-1"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3://b/../x", "s3://b/p?x=1"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        open_blob_store(url, endpoint_url="http://127.0.0.1:1")


# --------------------------------------------------------------------------- errors
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_is_transient_and_retried(s3_url: str) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    with (
        open_blob_store(s3_url, endpoint_url=dead, max_attempts=2, backoff_seconds=0.001) as store,
        pytest.raises(BlobStoreError, match=r"get 'state/x' in s3://.* failed after 2 attempts") as info,
    ):
        store.get("state/x")
    assert isinstance(info.value.__cause__, TransientBlobError)


class _ErrorServer:
    """A real HTTP server answering every request with one S3 error, counting requests."""

    def __init__(self, status: int, code: str) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                outer.requests += 1
                self._drain()
                body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected"
                body += "</Message></Error>"
                data = body.encode() if self.command != "HEAD" else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body.encode())))
                self.end_headers()
                self.wfile.write(data)

            def _drain(self) -> None:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        self.rfile.read(size + 2)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b""):
                                pass
                            return
                self.rfile.read(int(self.headers.get("Content-Length") or 0))

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "code", "transient"),
    [
        (503, "SlowDown", True),
        (500, "InternalError", True),
        (429, "TooManyRequests", True),
        (409, "ConditionalRequestConflict", True),
        (403, "AccessDenied", False),
    ],
)
def test_error_answers_are_mapped(s3_endpoint: str, status: int, code: str, transient: bool) -> None:
    server = _ErrorServer(status, code)
    try:
        with open_blob_store(
            "s3://bucket/p", endpoint_url=server.url, max_attempts=3, backoff_seconds=0.001
        ) as store:
            for operation in (
                lambda: store.get("commits/4.json"),
                lambda: store.put_if_absent("commits/4.json", b"c"),
            ):
                server.requests = 0
                with pytest.raises(BlobStoreError, match=r"'commits/4.json'") as info:
                    operation()
                assert not isinstance(info.value, BlobNotFoundError)
                assert code in str(info.value)
                assert server.requests == (3 if transient else 1)
                assert isinstance(info.value.__cause__, TransientBlobError) == transient
    finally:
        server.close()


def test_precondition_failed_answer_means_not_created(s3_endpoint: str) -> None:
    server = _ErrorServer(412, "PreconditionFailed")
    try:
        with open_blob_store("s3://bucket/p", endpoint_url=server.url, backoff_seconds=0.001) as store:
            assert store.put_if_absent("commits/4.json", b"c") is False
        assert server.requests == 1
    finally:
        server.close()


def test_expiry_problem_when_the_lifecycle_configuration_may_not_be_read(s3_endpoint: str) -> None:
    server = _ErrorServer(403, "AccessDenied")
    try:
        with open_blob_store("s3://bucket/p", endpoint_url=server.url) as store:
            problem = store.expiry_problem() or ""
        assert "cannot read the lifecycle configuration of bucket 'bucket'" in problem
        assert "s3:GetLifecycleConfiguration" in problem
    finally:
        server.close()


# --------------------------------------------------------------------------- the check at a query's start
def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("blobstate")]


def test_a_query_start_warns_once_naming_the_bucket_and_the_rule_to_add(
    store: S3BlobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="blobstate")
    check = warn_unless_pending_objects_expire(store)
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING and check.problem is not None and check.unknown is None
    message = record.getMessage()
    assert "\n" not in message
    assert f"bucket {store.bucket!r}" in message and store.url in message
    assert f"add lifecycle rule {store.lifecycle_rule_id!r}" in message
    assert "tagged blobstate-pending=true under 'root/' 30 days after creation" in message
    assert f"blobstate gc {store.url} --install-lifecycle" in message

    store.install_expiry_rule()
    caplog.clear()
    check = warn_unless_pending_objects_expire(store)
    assert check.problem is None and check.unknown is None and _records(caplog) == []


def test_a_query_start_warns_of_a_rule_that_would_delete_committed_state(
    store: S3BlobStore, s3: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store.install_expiry_rule()
    rules = s3.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    wipe = {"ID": "wipe", "Filter": {"Prefix": "root/"}, "Status": "Enabled", "Expiration": {"Days": 9}}
    _set_rules(s3, store.bucket, *rules, wipe)
    caplog.set_level(logging.DEBUG, logger="blobstate")
    warn_unless_pending_objects_expire(store)
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING and "'wipe'" in record.getMessage()
    assert "would delete committed state" in record.getMessage()


def test_a_query_start_only_notes_at_debug_level_what_it_cannot_check(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="blobstate")
    server = _ErrorServer(403, "AccessDenied")
    try:
        with open_blob_store("s3://bucket/p", endpoint_url=server.url) as denied:
            check = warn_unless_pending_objects_expire(denied)
    finally:
        server.close()
    (record,) = _records(caplog)
    assert record.levelno == logging.DEBUG and check.problem is None
    assert "cannot read the lifecycle configuration of bucket 'bucket'" in record.getMessage()
    caplog.clear()
    with open_blob_store(str(tmp_path / "local")) as local:  # blobstate gc expires its pending objects
        assert warn_unless_pending_objects_expire(local) == ExpiryCheck()
    assert _records(caplog) == []
