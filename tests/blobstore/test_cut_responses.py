"""Answers cut at a random byte (status line, headers or body) by a proxy in front of the real S3 and
Azure test servers: every operation still returns the right result, retried within the store's attempts,
and a store whose every answer is cut fails with one error naming the object, bucket or container, and
endpoint.

``BLOBSTATE_CUT_TRIES=<n>`` cuts each operation's answer ``n`` times (default 8).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blobstate.blobstore import BlobStore, BlobStoreError, open_blob_store
from faultproxy import FaultProxy

TRIES = int(os.environ.get("BLOBSTATE_CUT_TRIES", "8"))
DATA = b"committed bytes " * 40


@pytest.fixture(params=["s3", "azure"])
def cut_store(request: pytest.FixtureRequest) -> Iterator[tuple[BlobStore, FaultProxy]]:
    """A store on a real server through the cutting proxy, with the proxy."""
    url = request.getfixturevalue(f"{request.param}_cut_url")
    proxy = request.getfixturevalue(f"{request.param}_fault_proxy")
    store = open_blob_store(url)
    yield store, proxy
    proxy.disarm()
    store.close()


def _prepare(store: BlobStore, i: int) -> None:
    store.put(f"pending/{i}", DATA, ttl=60)
    store.put(f"permanent/{i}", DATA)


Check = Callable[[BlobStore, int, Path], None]


def _put(store: BlobStore, i: int, tmp: Path) -> None:
    store.put(f"new/{i}", DATA, ttl=60)
    assert store.get(f"new/{i}") == DATA and store.has_ttl(f"new/{i}")


def _put_file(store: BlobStore, i: int, tmp: Path) -> None:
    source = tmp / f"source-{i}"
    source.write_bytes(DATA)
    store.put(f"new/{i}", source)
    assert store.get(f"new/{i}") == DATA and not store.has_ttl(f"new/{i}")


def _create(store: BlobStore, i: int, tmp: Path) -> None:
    # A create whose answer was lost finds its own bytes on the retry: still created by this call.
    assert store.put_if_absent(f"new/{i}", DATA + b"%d" % i, ttl=60) is True
    assert store.get(f"new/{i}") == DATA + b"%d" % i and store.has_ttl(f"new/{i}")


def _create_existing(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.put_if_absent(f"permanent/{i}", b"other") is False
    assert store.get(f"permanent/{i}") == DATA


def _get(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.get(f"permanent/{i}") == DATA


def _get_file(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.get_file(f"permanent/{i}", tmp / f"target-{i}") == len(DATA)
    assert (tmp / f"target-{i}").read_bytes() == DATA


def _delete(store: BlobStore, i: int, tmp: Path) -> None:
    store.delete_if_exists(f"permanent/{i}")
    assert not store.exists(f"permanent/{i}")


def _delete_strict(store: BlobStore, i: int, tmp: Path) -> None:
    store.delete(f"permanent/{i}")  # the retry after a lost answer finds it gone: that is success
    assert not store.exists(f"permanent/{i}")


def _remove_ttl(store: BlobStore, i: int, tmp: Path) -> None:
    store.remove_ttl(f"pending/{i}")
    assert not store.has_ttl(f"pending/{i}")


def _has_ttl(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.has_ttl(f"pending/{i}") is True


def _has_no_ttl(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.has_ttl(f"permanent/{i}") is False


def _exists(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.exists(f"permanent/{i}") is True


def _missing(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.exists(f"absent/{i}") is False


def _list(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.list("pending/") == sorted(f"pending/{j}" for j in range(i + 1))


def _list_sizes(store: BlobStore, i: int, tmp: Path) -> None:
    assert store.list_sizes("permanent/") == {f"permanent/{j}": len(DATA) for j in range(i + 1)}


OPERATIONS: dict[str, Check] = {
    "put": _put,
    "put file": _put_file,
    "put_if_absent": _create,
    "put_if_absent lost": _create_existing,
    "get": _get,
    "get_file": _get_file,
    "delete": _delete,
    "delete strict": _delete_strict,
    "remove_ttl": _remove_ttl,
    "has_ttl pending": _has_ttl,
    "has_ttl permanent": _has_no_ttl,
    "exists": _exists,
    "exists missing": _missing,
    "list": _list,
    "list_sizes": _list_sizes,
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_an_answer_cut_anywhere_is_retried_to_the_right_result(
    cut_store: tuple[BlobStore, FaultProxy], operation: str, tmp_path: Path
) -> None:
    store, proxy = cut_store
    check = OPERATIONS[operation]
    before = proxy.counts.cuts
    for i in range(TRIES):
        _prepare(store, i)
        proxy.arm(1)
        check(store, i, tmp_path)
        proxy.disarm()
    assert proxy.counts.cuts - before >= TRIES, "the proxy did not cut every first answer"


@pytest.mark.parametrize("operation", ["has_ttl", "get"])
@pytest.mark.parametrize("backend", ["s3", "azure"])
def test_answers_cut_on_every_attempt_fail_naming_object_container_and_endpoint(
    backend: str, operation: str, request: pytest.FixtureRequest
) -> None:
    """The store's attempts are the only retries: a body cut short is not tried again inside the SDK
    (Azure's downloader would, three times, a second apart), so the retry budget a user sets holds."""
    url = request.getfixturevalue(f"{backend}_cut_url")
    proxy: FaultProxy = request.getfixturevalue(f"{backend}_fault_proxy")
    with open_blob_store(url) as store:
        store.put("heads/1.json", DATA * 100, ttl=60)  # 64 KB: nearly every cut falls in the body
        before = proxy.counts.cuts
        proxy.rng.seed(0)
        proxy.cut_randomly(1.0)
        try:
            with pytest.raises(BlobStoreError) as raised:
                getattr(store, operation)("heads/1.json")
        finally:
            proxy.disarm()
        message = str(raised.value)
        assert proxy.counts.cuts - before == 8  # CUT_RETRY_OPTIONS: max_attempts=8
        container = url.split("://", 1)[1].split("/", 1)[0]
        assert "root/heads/1.json" in message and repr(container) in message, message
        assert f"127.0.0.1:{proxy.port}" in message and "after 8 attempts" in message, message
        assert "\n" not in message
        secrets = ("testing", "Eby8vdM02xNOcqFl") if backend == "s3" else ("Eby8vdM02xNOcqFl",)
        assert not any(s in message.replace("test-", "") for s in secrets), message


class _LargestCut(random.Random):
    """Draws the largest offset the proxy may cut an answer at: the cut that keeps the most of it."""

    def random(self) -> float:  # type: ignore[override]
        return 0.0

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
        return (start if stop is None else stop) - 1


@pytest.mark.parametrize("operation", ["has_ttl", "get"])
@pytest.mark.parametrize("backend", ["s3", "azure"])
def test_the_cut_that_keeps_the_most_of_an_answer_still_loses_it(
    backend: str, operation: str, request: pytest.FixtureRequest
) -> None:
    """Every cut the proxy makes costs an attempt, so the exact counts above hold: a chunked answer
    (azurite's tags) missing only the blank lines after its last chunk is read whole by the client, so the
    proxy never cuts there."""
    url = request.getfixturevalue(f"{backend}_cut_url").replace("max_attempts=8", "max_attempts=1")
    proxy: FaultProxy = request.getfixturevalue(f"{backend}_fault_proxy")
    with open_blob_store(url) as store:
        store.put("heads/1.json", DATA, ttl=60)
        rng, proxy.rng = proxy.rng, _LargestCut()
        proxy.arm(1)
        try:
            with pytest.raises(BlobStoreError, match="failed after 1 attempts"):
                getattr(store, operation)("heads/1.json")
        finally:
            proxy.disarm()
            proxy.rng = rng


def test_a_break_in_a_later_range_of_a_large_azure_object_refetches_only_that_range(
    azure_cut_url: str, azure_fault_proxy: FaultProxy
) -> None:
    """Over 32 MiB an object comes in 4 MiB ranges after the first 32 MiB: a break in one of those is
    fetched again alone (the SDK's own retry, kept there), not by repeating the whole download."""
    data = os.urandom(36 * 1024 * 1024)
    gets = []

    def second_get(method: str, target: str) -> bool:
        if method == "GET":
            gets.append(target)
        return len(gets) == 2 and method == "GET"

    with open_blob_store(azure_cut_url) as store:
        store.put("big", data)
        before = azure_fault_proxy.counts.cuts
        azure_fault_proxy.cut_when(second_get)
        try:
            assert store.get("big") == data
        finally:
            azure_fault_proxy.disarm()
        assert azure_fault_proxy.counts.cuts - before == 1
        assert len(gets) == 3, "the whole object was downloaded again"
