"""An S3 endpoint that accepts connections and never answers: every operation fails within its budget.

The endpoint is a real TCP server on 127.0.0.1 (``silent_endpoint`` in tests/conftest.py). Timing is only
bounded loosely (well under the 5 minutes the old defaults took); the counts of connections the server
got say how many attempts were made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import BlobStore, BlobStoreError, open_blob_store
from blobstate.blobstore.s3 import S3BlobStore

FAST = {"connect_timeout": 1, "read_timeout": 0.5, "backoff_seconds": 0.01}
LOOSE_BOUND_SECONDS = 60.0


def test_a_get_fails_within_the_configured_budget_naming_endpoint_bucket_and_object(
    silent_endpoint: Any,
) -> None:
    with open_blob_store(
        "s3://bucket/root", endpoint_url=silent_endpoint.url, max_attempts=2, **FAST
    ) as store:
        started = time.monotonic()
        with pytest.raises(BlobStoreError) as info:
            store.get("state/x")
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert "get 'state/x' in s3://bucket/root failed after 2 attempts" in message
    assert f"endpoint {silent_endpoint.url}" in message
    assert "bucket 'bucket'" in message and "key 'root/state/x'" in message
    assert "read_timeout" in message and "reachable" in message  # what to check, what to raise
    assert silent_endpoint.connections == 2
    assert elapsed < LOOSE_BOUND_SECONDS


def test_options_given_in_the_url_query_apply(silent_endpoint: Any) -> None:
    url = "s3://bucket/root?connect_timeout=1&read_timeout=0.5&max_attempts=3&backoff_seconds=0.01"
    with open_blob_store(url, endpoint_url=silent_endpoint.url) as store:
        assert isinstance(store, S3BlobStore)
        assert store.url == "s3://bucket/root"
        with pytest.raises(BlobStoreError, match="failed after 3 attempts"):
            store.get("x")
    assert silent_endpoint.connections == 3


def test_the_endpoint_itself_can_be_a_url_option(silent_endpoint: Any) -> None:
    from urllib.parse import quote

    url = (
        f"s3://bucket/root?endpoint_url={quote(silent_endpoint.url, safe='')}&max_attempts=1&read_timeout=0.5"
    )
    with (
        open_blob_store(url) as store,
        pytest.raises(BlobStoreError, match=f"endpoint {silent_endpoint.url}"),
    ):
        store.exists("x")
    assert silent_endpoint.connections == 1


def _operations(tmp_path: Path) -> dict[str, Callable[[BlobStore], Any]]:
    source = tmp_path / "source"
    source.write_bytes(b"file")
    return {
        "put": lambda s: s.put("a", b"1", ttl=60),
        "put file": lambda s: s.put("a", source),
        "put_if_absent": lambda s: s.put_if_absent("a", b"1"),
        "get": lambda s: s.get("a"),
        "get_file": lambda s: s.get_file("a", tmp_path / "target"),
        "exists": lambda s: s.exists("a"),
        "delete": lambda s: s.delete("a"),
        "delete_if_exists": lambda s: s.delete_if_exists("a"),
        "has_ttl": lambda s: s.has_ttl("a"),
        "remove_ttl": lambda s: s.remove_ttl("a"),
        "list": lambda s: s.list("state/"),
        "list_sizes": lambda s: s.list_sizes(),
        "expiry_problem": lambda s: s.expiry_problem(),
        "install_expiry_rule": lambda s: s.install_expiry_rule(),
    }


@pytest.fixture
def silent_store(silent_endpoint: Any) -> Iterator[BlobStore]:
    with open_blob_store(
        "s3://bucket/root", endpoint_url=silent_endpoint.url, max_attempts=1, **FAST
    ) as store:
        yield store


OPERATIONS = [
    "put",
    "put file",
    "put_if_absent",
    "get",
    "get_file",
    "exists",
    "delete",
    "delete_if_exists",
    "has_ttl",
    "remove_ttl",
    "list",
    "list_sizes",
    "expiry_problem",
    "install_expiry_rule",
]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_fails_within_its_budget(
    silent_store: BlobStore, silent_endpoint: Any, operation: str, tmp_path: Path
) -> None:
    call = _operations(tmp_path)[operation]
    started = time.monotonic()
    with pytest.raises(BlobStoreError, match=f"endpoint {silent_endpoint.url}, bucket 'bucket'"):
        call(silent_store)
    assert time.monotonic() - started < LOOSE_BOUND_SECONDS
    assert silent_endpoint.connections == 1


def test_bulk_work_on_a_silent_endpoint_costs_one_budget_not_one_per_item(silent_endpoint: Any) -> None:
    with (
        open_blob_store(
            "s3://bucket/root", endpoint_url=silent_endpoint.url, io_threads=2, max_attempts=1, **FAST
        ) as store,
        pytest.raises(BlobStoreError, match="failed after 1 attempts"),
    ):
        store.run_parallel(store.get, [f"blobs/{i}" for i in range(20)])
    # The two items running when the first timed out; none of the other 18 was started.
    assert silent_endpoint.connections == 2


def test_the_default_budget_is_about_a_minute(s3_endpoint: str) -> None:
    with open_blob_store("s3://bucket/root") as store:
        assert isinstance(store, S3BlobStore)
        config = store._client.meta.config
        per_attempt = config.connect_timeout + config.read_timeout
        backoff = 1.5 * store.backoff_seconds * (2 ** (store.max_attempts - 1) - 1)
        worst = store.max_attempts * per_attempt + backoff
        assert worst <= 65, f"{store.max_attempts} attempts of {per_attempt} s: {worst} s"
        assert worst == pytest.approx(store.settings.worst_case_seconds)
