"""The blob store contract, run against every backend (local directory, memory, S3 via moto, Azure via
azurite)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import (
    BlobNotFoundError,
    BlobStore,
    BlobStoreError,
    InvalidBlobNameError,
    TransientBlobError,
    open_blob_store,
)

RACERS = 6
RACE_ROUNDS = 3
NATIVE_EXPIRY = ("s3", "azure")
"""Backends whose store expires pending objects itself (lifecycle rules), so ``expire`` does nothing."""
HOSTILE_NAMES = ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a\x00b", "", ".blobstate-ttl/x"]


def backend(store: BlobStore) -> str:
    """The backend of ``store``: local, memory, s3 or azure."""
    return {
        "LocalBlobStore": "local",
        "MemoryBlobStore": "memory",
        "S3BlobStore": "s3",
        "AzureBlobStore": "azure",
    }[type(store).__name__]


@contextlib.contextmanager
def failing(
    store: BlobStore, primitive: str, failures: int, on_fail: Callable[..., None] | None = None
) -> Iterator[list[tuple[Any, ...]]]:
    """Make the first ``failures`` calls of the real backend's ``primitive`` raise TransientBlobError.

    Yields the list of every call's arguments. The wrapper is an instance attribute shadowing the
    backend's method, so everything else is the real backend.
    """
    real = getattr(store, primitive)
    calls: list[tuple[Any, ...]] = []

    def wrapper(*args: Any) -> Any:
        calls.append(args)
        if len(calls) <= failures:
            if on_fail is not None:
                on_fail(*args)
            raise TransientBlobError(f"injected failure {len(calls)} of {primitive}")
        return real(*args)

    setattr(store, primitive, wrapper)
    try:
        yield calls
    finally:
        delattr(store, primitive)


@pytest.fixture
def fast_retry(blob_store: BlobStore) -> BlobStore:
    """The backend store with near-zero backoff, so retry tests stay quick."""
    blob_store.backoff_seconds = 0.001
    return blob_store


# --------------------------------------------------------------------------- round trips
def test_bytes_round_trip_and_overwrite(blob_store: BlobStore) -> None:
    blob_store.put("state/0/1/5_abc.delta", b"first")
    assert blob_store.get("state/0/1/5_abc.delta") == b"first"
    blob_store.put("state/0/1/5_abc.delta", bytearray(b"second, longer"))
    assert blob_store.get("state/0/1/5_abc.delta") == b"second, longer"
    blob_store.put("state/0/1/5_abc.delta", memoryview(b"3rd"))
    assert blob_store.get("state/0/1/5_abc.delta") == b"3rd"


def test_empty_object(blob_store: BlobStore, tmp_path: Path) -> None:
    blob_store.put("empty", b"")
    empty_file = tmp_path / "empty-src"
    empty_file.write_bytes(b"")
    blob_store.put("empty-from-file", empty_file)
    assert blob_store.get("empty") == b""
    assert blob_store.get("empty-from-file") == b""
    target = tmp_path / "out"
    assert blob_store.get_file("empty", target) == 0
    assert target.read_bytes() == b""
    assert blob_store.list() == ["empty", "empty-from-file"]


def test_multi_megabyte_file_round_trip(blob_store: BlobStore, tmp_path: Path) -> None:
    payload = os.urandom(5 * 1024 * 1024 + 123)
    source = tmp_path / "source.bin"
    source.write_bytes(payload)
    blob_store.put("blobs/0/0/big", source)
    blob_store.put("blobs/0/0/big-bytes", payload)
    target = tmp_path / "target.bin"
    assert blob_store.get_file("blobs/0/0/big", target) == len(payload)
    assert target.read_bytes() == payload
    assert blob_store.get("blobs/0/0/big-bytes") == payload


def test_a_bounded_get_reads_at_most_one_byte_past_its_bound(blob_store: BlobStore) -> None:
    """``get(name, max_bytes=n)``: a reader that knows an object's size reads no more than n + 1 bytes of
    it, so a larger (damaged or foreign) object fails its size check without being read whole."""
    payload = os.urandom(3 * 1024 * 1024 + 7)
    blob_store.put("snapshots/0/0/5_abc.index", payload)
    blob_store.put("empty", b"")
    assert blob_store.get("snapshots/0/0/5_abc.index", max_bytes=len(payload)) == payload
    assert blob_store.get("snapshots/0/0/5_abc.index", max_bytes=len(payload) + 100) == payload
    assert blob_store.get("snapshots/0/0/5_abc.index", max_bytes=1000) == payload[:1001]
    assert blob_store.get("snapshots/0/0/5_abc.index", max_bytes=0) == payload[:1]
    assert blob_store.get("empty", max_bytes=0) == b""
    assert blob_store.get("empty", max_bytes=10) == b""
    with pytest.raises(BlobNotFoundError):
        blob_store.get("snapshots/0/0/6_missing.index", max_bytes=10)
    with pytest.raises(ValueError, match="max_bytes must not be negative"):
        blob_store.get("empty", max_bytes=-1)


def test_get_file_replaces_an_existing_longer_file(blob_store: BlobStore, tmp_path: Path) -> None:
    blob_store.put("short", b"abc")
    target = tmp_path / "target"
    target.write_bytes(b"x" * 10_000)
    assert blob_store.get_file("short", str(target)) == 3
    assert target.read_bytes() == b"abc"


def test_put_from_a_missing_file_names_the_file_and_writes_nothing(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError) as info:
        blob_store.put("x", missing)
    assert "does-not-exist" in str(info.value)
    assert not blob_store.exists("x")
    assert blob_store.list() == []


# --------------------------------------------------------------------------- missing objects and deletes
@pytest.mark.parametrize(
    "operation",
    ["get", "get_file", "delete", "remove_ttl", "has_ttl"],
)
def test_missing_object_raises_blob_not_found_naming_it(
    blob_store: BlobStore, tmp_path: Path, operation: str
) -> None:
    blob_store.put("state/0/1/other", b"x")
    name = "state/0/1/7_missing.delta"
    args: tuple[Any, ...] = (name, tmp_path / "out") if operation == "get_file" else (name,)
    with pytest.raises(BlobNotFoundError) as info:
        getattr(blob_store, operation)(*args)
    assert info.value.name == name
    assert name in str(info.value)
    assert not (tmp_path / "out").exists()


def test_delete(blob_store: BlobStore) -> None:
    blob_store.put("a/b/c", b"1")
    blob_store.put("a/b/d", b"2")
    blob_store.delete("a/b/c")
    assert not blob_store.exists("a/b/c")
    assert blob_store.get("a/b/d") == b"2"
    assert blob_store.list() == ["a/b/d"]
    with pytest.raises(BlobNotFoundError, match="a/b/c"):
        blob_store.delete("a/b/c")
    blob_store.delete("a/b/d")
    assert blob_store.list() == []
    blob_store.put("a/b/c", b"again")  # the emptied directories can be written to again
    assert blob_store.get("a/b/c") == b"again"


def test_delete_if_exists(blob_store: BlobStore) -> None:
    blob_store.put("x", b"1")
    assert blob_store.delete_if_exists("x") is True
    assert blob_store.delete_if_exists("x") is False
    assert not blob_store.exists("x")


def test_exists(blob_store: BlobStore) -> None:
    assert not blob_store.exists("d/x")
    blob_store.put("d/x", b"1")
    assert blob_store.exists("d/x")
    assert not blob_store.exists("d")  # a "directory" is not an object
    assert not blob_store.exists("d/x/y")


# --------------------------------------------------------------------------- listing
def test_holds_nothing_until_the_first_object(blob_store: BlobStore) -> None:
    """What tells a mistyped object-store path ("nothing is stored under it") from a location that holds
    something other than a checkpoint."""
    assert blob_store.holds_nothing()
    blob_store.put("deep/down/x", b"1", ttl=60)
    assert not blob_store.holds_nothing()
    blob_store.delete("deep/down/x")
    assert blob_store.holds_nothing()


def test_list_prefix_semantics(blob_store: BlobStore) -> None:
    names = ["b", "ab", "a/bc", "a/b/d", "a/b/c", "a/b/e/f"]
    for name in names:
        blob_store.put(name, name.encode())
    assert blob_store.list() == sorted(names)
    assert blob_store.list("") == sorted(names)
    assert blob_store.list("a") == ["a/b/c", "a/b/d", "a/b/e/f", "a/bc", "ab"]
    assert blob_store.list("a/") == ["a/b/c", "a/b/d", "a/b/e/f", "a/bc"]
    assert blob_store.list("a/b") == ["a/b/c", "a/b/d", "a/b/e/f", "a/bc"]
    assert blob_store.list("a/b/") == ["a/b/c", "a/b/d", "a/b/e/f"]
    assert blob_store.list("a/b/c") == ["a/b/c"]
    assert blob_store.list("a/b/e/") == ["a/b/e/f"]
    assert blob_store.list("zzz") == []
    assert blob_store.list("zzz/") == []
    assert blob_store.list("a/x/y/") == []


def test_list_sizes_gives_each_object_its_size(blob_store: BlobStore) -> None:
    blob_store.put("s/empty", b"")
    blob_store.put("s/a", b"x" * 1000, ttl=60)
    blob_store.put_if_absent("s/b/c", b"abc")
    blob_store.put("t", b"outside the prefix")
    assert blob_store.list_sizes("s/") == {"s/a": 1000, "s/b/c": 3, "s/empty": 0}
    assert list(blob_store.list_sizes()) == blob_store.list()


def test_list_does_not_show_bookkeeping(blob_store: BlobStore) -> None:
    blob_store.put("x", b"1", ttl=60)
    blob_store.put_if_absent("y", b"2", ttl=60)
    assert blob_store.list() == ["x", "y"]
    assert blob_store.list(".blob") == []


def test_list_many_objects_sorted(blob_store: BlobStore) -> None:
    names = [f"blobs/0/{i % 3}/{i:04d}" for i in range(120)]
    blob_store.run_parallel(lambda n: blob_store.put(n, b"."), names)
    assert blob_store.list("blobs/") == sorted(names)
    assert blob_store.list("blobs/0/1/") == sorted(n for n in names if n.startswith("blobs/0/1/"))


# --------------------------------------------------------------------------- TTLs
def test_ttl_set_and_removed(blob_store: BlobStore, tmp_path: Path) -> None:
    blob_store.put("pending", b"1", ttl=3600)
    source = tmp_path / "src"
    source.write_bytes(b"file")
    blob_store.put("pending-file", source, ttl=3600)
    blob_store.put("permanent", b"2")
    assert blob_store.has_ttl("pending")
    assert blob_store.has_ttl("pending-file")
    assert not blob_store.has_ttl("permanent")
    blob_store.remove_ttl("pending")
    assert not blob_store.has_ttl("pending")
    blob_store.remove_ttl("pending")  # idempotent
    blob_store.remove_ttl("permanent")
    assert not blob_store.has_ttl("permanent")
    assert blob_store.get("pending") == b"1"
    assert blob_store.get("permanent") == b"2"


def test_overwrite_sets_the_new_ttl_state(blob_store: BlobStore) -> None:
    blob_store.put("x", b"1", ttl=3600)
    blob_store.put("x", b"2")
    assert not blob_store.has_ttl("x")
    blob_store.put("x", b"3", ttl=3600)
    assert blob_store.has_ttl("x")


def test_failed_pending_overwrite_leaves_a_permanent_object_permanent(
    blob_store: BlobStore, tmp_path: Path
) -> None:
    blob_store.put("commits/1.json", b"committed")
    with pytest.raises(FileNotFoundError):
        blob_store.put("commits/1.json", tmp_path / "missing", ttl=60)
    assert not blob_store.has_ttl("commits/1.json")
    assert blob_store.expire(time.time() + 10**9) == []
    assert blob_store.get("commits/1.json") == b"committed"


def test_failed_pending_overwrite_keeps_the_old_expiry(blob_store: BlobStore, tmp_path: Path) -> None:
    blob_store.put("x", b"pending", ttl=60)
    with pytest.raises(FileNotFoundError):
        blob_store.put("x", tmp_path / "missing", ttl=10**6)
    assert blob_store.has_ttl("x")
    if backend(blob_store) not in NATIVE_EXPIRY:
        assert blob_store.expire(time.time() + 120) == ["x"]


def test_delete_forgets_the_ttl(blob_store: BlobStore) -> None:
    blob_store.put("x", b"1", ttl=3600)
    blob_store.delete("x")
    blob_store.put_if_absent("x", b"2")
    assert not blob_store.has_ttl("x")


def test_remove_ttl_on_a_deleted_object(blob_store: BlobStore) -> None:
    blob_store.put("x", b"1", ttl=3600)
    blob_store.delete("x")
    with pytest.raises(BlobNotFoundError, match="'x'"):
        blob_store.remove_ttl("x")


def test_expire_deletes_only_pending_objects_past_their_ttl(blob_store: BlobStore) -> None:
    if backend(blob_store) in NATIVE_EXPIRY:
        pytest.skip("S3 and Azure expire through lifecycle rules (test_s3_lifecycle.py, test_azure.py)")
    now = time.time()
    blob_store.put("state/0/0/1_a.delta", b"short", ttl=10)
    blob_store.put("state/0/0/1_b.delta", b"long", ttl=1000)
    blob_store.put("state/0/0/1_c.delta", b"committed", ttl=10)
    blob_store.remove_ttl("state/0/0/1_c.delta")
    blob_store.put("commits/1.json", b"permanent")
    blob_store.put_if_absent("state/0/0/2_d.delta", b"short too", ttl=10)
    assert blob_store.expire(now) == []
    assert blob_store.expire(now + 100) == ["state/0/0/1_a.delta", "state/0/0/2_d.delta"]
    assert blob_store.list() == ["commits/1.json", "state/0/0/1_b.delta", "state/0/0/1_c.delta"]
    assert blob_store.expire(now + 100) == []
    assert blob_store.expire(now + 10_000) == ["state/0/0/1_b.delta"]
    assert blob_store.list() == ["commits/1.json", "state/0/0/1_c.delta"]
    assert blob_store.get("state/0/0/1_c.delta") == b"committed"


def test_expiry_needs_no_setup_where_gc_expires(blob_store: BlobStore) -> None:
    if backend(blob_store) in NATIVE_EXPIRY:
        pytest.skip("S3 and Azure need lifecycle rules (test_s3_lifecycle.py, test_azure.py)")
    assert blob_store.expiry_problem() is None
    blob_store.install_expiry_rule()  # nothing to install
    assert blob_store.list() == []
    assert blob_store.expiry_problem() is None


# --------------------------------------------------------------------------- put_if_absent
def test_put_if_absent(blob_store: BlobStore) -> None:
    assert blob_store.put_if_absent("commits/1.json", b"mine") is True
    assert blob_store.put_if_absent("commits/1.json", b"theirs") is False
    assert blob_store.get("commits/1.json") == b"mine"
    assert not blob_store.has_ttl("commits/1.json")


def test_put_if_absent_loser_never_makes_the_winner_pending(blob_store: BlobStore) -> None:
    assert blob_store.put_if_absent("metadata.json", b"winner") is True
    assert blob_store.put_if_absent("metadata.json", b"loser", ttl=60) is False
    assert not blob_store.has_ttl("metadata.json")
    assert blob_store.put_if_absent("pending.json", b"winner", ttl=60) is True
    assert blob_store.put_if_absent("pending.json", b"loser") is False
    assert blob_store.has_ttl("pending.json")
    assert blob_store.get("pending.json") == b"winner"


def _race_worker(url: str, payload: bytes, barrier: Any, results: Any) -> None:
    """One racer: for each round, wait for all racers, then try to create the round's object."""
    store = open_blob_store(url)
    try:
        for round_ in range(RACE_ROUNDS):
            barrier.wait(timeout=120)
            results.put((round_, payload, store.put_if_absent(f"commits/{round_}.json", payload)))
    finally:
        store.close()


def _race_in_threads(url: str, payloads: list[bytes]) -> list[tuple[int, bytes, bool]]:
    barrier = threading.Barrier(len(payloads))
    results: queue.Queue[tuple[int, bytes, bool]] = queue.Queue()
    threads = [threading.Thread(target=_race_worker, args=(url, p, barrier, results)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results.get_nowait() for _ in range(results.qsize())]


def _race_in_processes(url: str, payloads: list[bytes]) -> list[tuple[int, bytes, bool]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(payloads))
    results = ctx.Queue()
    processes = [ctx.Process(target=_race_worker, args=(url, p, barrier, results)) for p in payloads]
    for p in processes:
        p.start()
    try:
        collected = [results.get(timeout=180) for _ in range(len(payloads) * RACE_ROUNDS)]
        for p in processes:
            p.join(timeout=60)
        assert [p.exitcode for p in processes] == [0] * len(payloads)
        return collected
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()


def test_put_if_absent_race_has_exactly_one_winner(blob_store: BlobStore, blob_store_url: str) -> None:
    payloads = [f"racer {i} ".encode() * (i + 1) for i in range(RACERS)]
    if backend(blob_store) == "memory":  # in-process by nature: race threads
        results = _race_in_threads(blob_store_url, payloads)
    else:  # real, separate processes
        results = _race_in_processes(blob_store_url, payloads)
    assert len(results) == RACERS * RACE_ROUNDS
    for round_ in range(RACE_ROUNDS):
        winners = [payload for r, payload, won in results if r == round_ and won]
        assert len(winners) == 1, f"round {round_}: {len(winners)} winners"
        assert blob_store.get(f"commits/{round_}.json") == winners[0]


# --------------------------------------------------------------------------- hostile names
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_hostile_names_are_rejected_by_every_operation(
    blob_store: BlobStore, tmp_path: Path, name: str
) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"payload")
    operations: list[Callable[[], object]] = [
        lambda: blob_store.put(name, b"x"),
        lambda: blob_store.put(name, source),
        lambda: blob_store.put(name, b"x", ttl=10),
        lambda: blob_store.put_if_absent(name, b"x"),
        lambda: blob_store.get(name),
        lambda: blob_store.get_file(name, tmp_path / "out"),
        lambda: blob_store.delete(name),
        lambda: blob_store.delete_if_exists(name),
        lambda: blob_store.remove_ttl(name),
        lambda: blob_store.has_ttl(name),
        lambda: blob_store.exists(name),
    ]
    if name:  # the empty prefix lists everything
        operations.append(lambda: blob_store.list(name))
        operations.append(lambda: blob_store.list(name + "/"))
    for operation in operations:
        with pytest.raises(InvalidBlobNameError):
            operation()
    assert blob_store.list() == []
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- retries
def _setup_object(store: BlobStore) -> None:
    store.put("obj", b"content", ttl=60)


RETRY_CASES: list[
    tuple[str, Callable[[BlobStore, Path], object], Callable[[BlobStore, Path, object], None]]
] = [
    ("_put_bytes", lambda s, d: s.put("new", b"fresh"), lambda s, d, r: _eq(s.get("new"), b"fresh")),
    ("_put_if_absent", lambda s, d: s.put_if_absent("new", b"once"), lambda s, d, r: _eq(r, True)),
    ("_get_bytes", lambda s, d: s.get("obj"), lambda s, d, r: _eq(r, b"content")),
    (
        "_get_file",
        lambda s, d: s.get_file("obj", d / "o"),
        lambda s, d, r: _eq((d / "o").read_bytes(), b"content"),
    ),
    ("_delete", lambda s, d: s.delete("obj"), lambda s, d, r: _eq(s.exists("obj"), False)),
    ("_remove_ttl", lambda s, d: s.remove_ttl("obj"), lambda s, d, r: _eq(s.has_ttl("obj"), False)),
    ("_has_ttl", lambda s, d: s.has_ttl("obj"), lambda s, d, r: _eq(r, True)),
    ("_exists", lambda s, d: s.exists("obj"), lambda s, d, r: _eq(r, True)),
    ("_list", lambda s, d: s.list(""), lambda s, d, r: _eq(r, ["obj"])),
]


def _eq(actual: object, expected: object) -> None:
    assert actual == expected


@pytest.mark.parametrize(("primitive", "call", "check"), RETRY_CASES, ids=[c[0] for c in RETRY_CASES])
def test_transient_errors_are_retried(
    fast_retry: BlobStore,
    tmp_path: Path,
    primitive: str,
    call: Callable[[BlobStore, Path], object],
    check: Callable[[BlobStore, Path, object], None],
) -> None:
    _setup_object(fast_retry)
    with failing(fast_retry, primitive, failures=2) as calls:
        result = call(fast_retry, tmp_path)
    assert len(calls) == 3
    check(fast_retry, tmp_path, result)


def test_put_from_a_file_re_reads_the_file_on_every_try(fast_retry: BlobStore, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"version 0")
    versions = iter(range(1, 10))

    def rewrite(name: str, path: Path, ttl: float | None) -> None:
        # The file changes between tries: only a fresh read each try can store the last version.
        path.write_bytes(f"version {next(versions)}".encode())

    with failing(fast_retry, "_put_file", failures=3, on_fail=rewrite) as calls:
        fast_retry.put("from-file", source, ttl=60)
    assert len(calls) == 4
    assert all(isinstance(c[1], Path) and c[1] == source for c in calls)
    assert fast_retry.get("from-file") == b"version 3"
    assert fast_retry.has_ttl("from-file")


def test_retries_give_up_after_max_attempts_naming_the_object(fast_retry: BlobStore) -> None:
    fast_retry.max_attempts = 3
    with failing(fast_retry, "_put_bytes", failures=100) as calls, pytest.raises(BlobStoreError) as info:
        fast_retry.put("state/0/3/9_xyz.delta", b"data")
    assert len(calls) == 3
    assert "state/0/3/9_xyz.delta" in str(info.value)
    assert "3 attempts" in str(info.value)
    assert isinstance(info.value.__cause__, TransientBlobError)
    assert not fast_retry.exists("state/0/3/9_xyz.delta")


def test_non_transient_errors_are_not_retried(fast_retry: BlobStore) -> None:
    with failing(fast_retry, "_get_bytes", failures=0) as calls, pytest.raises(BlobNotFoundError):
        fast_retry.get("missing")
    assert len(calls) == 1


# --------------------------------------------------------------------------- the I/O pool
def test_run_parallel_returns_results_in_order(blob_store: BlobStore) -> None:
    names = [f"p/{i:03d}" for i in range(40)]
    blob_store.run_parallel(lambda n: blob_store.put(n, n.encode()), names)
    assert blob_store.run_parallel(blob_store.get, names) == [n.encode() for n in names]


def test_run_parallel_raises_the_first_failure_after_running_items_finish(blob_store_url: str) -> None:
    # After a failure nothing new starts (one dead endpoint costs one retry budget, not one per item),
    # but what is already running finishes before the error is raised.
    with open_blob_store(blob_store_url, io_threads=2) as store:
        store.put("present", b"1")
        failed = threading.Event()
        done: list[str] = []

        def fetch(name: str) -> bytes:
            if name == "slow":
                assert failed.wait(30)
                time.sleep(0.2)
            try:
                data = store.get("present" if name in ("slow", "later") else name)
            except BlobNotFoundError:
                failed.set()
                raise
            done.append(name)
            return data

        with pytest.raises(BlobNotFoundError, match="absent"):
            store.run_parallel(fetch, ["slow", "absent", *["later"] * 20])
        assert done == ["slow"]


def test_run_parallel_refuses_to_run_inside_its_own_pool(blob_store: BlobStore) -> None:
    nested = blob_store.submit(lambda: blob_store.run_parallel(lambda x: x, [1, 2]))
    with pytest.raises(RuntimeError, match="inside the blob store's own I/O pool"):
        nested.result(timeout=60)
