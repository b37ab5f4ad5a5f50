"""RocksStateStore against real RocksDB databases in tmp_path."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from blobstate.lineage.delta import ChangeOp
from blobstate.state import store as store_module
from blobstate.state.store import (
    NotAStoreError,
    RocksStateStore,
    StateStoreError,
    StoreClosedError,
    StoreLockedError,
    StoreTuning,
)

PUT, DELETE, CLEAR = ChangeOp.PUT, ChangeOp.DELETE, ChangeOp.CLEAR


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksStateStore]:
    with RocksStateStore.open(tmp_path / "store") as s:
        yield s


@contextmanager
def sync_every(n: int) -> Iterator[None]:
    """Move the overlay into RocksDB every ``n`` writes, to exercise reads that mix both."""
    old = store_module.SYNC_EVERY
    store_module.SYNC_EVERY = n
    try:
        yield
    finally:
        store_module.SYNC_EVERY = old


def contents(s: RocksStateStore) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every column family's items, in key order."""
    return {cf: list(s.items(cf)) for cf in s.column_families()}


# ---------------------------------------------------------------------------------------------- basics
@pytest.mark.parametrize("every", [1, 2, 65536])
def test_put_get_delete_clear_across_column_families(tmp_path: Path, every: int) -> None:
    with sync_every(every), RocksStateStore.open(tmp_path / "s") as s:
        s.put("counts", b"a", b"1")
        s.put("counts", b"b", b"2")
        s.put("names", b"a", b"alice")
        assert s.get("counts", b"a") == b"1"
        assert s.get("names", b"a") == b"alice"
        assert s.get("counts", b"zz") is None
        assert s.get("no-such-cf", b"a") is None

        s.put("counts", b"a", b"11")
        assert s.get("counts", b"a") == b"11"
        s.delete("counts", b"a")
        s.delete("counts", b"never-there")
        assert s.get("counts", b"a") is None
        assert s.get("counts", b"b") == b"2"

        s.clear("counts")
        assert s.get("counts", b"b") is None
        assert list(s.items("counts")) == []
        assert s.get("names", b"a") == b"alice", "clear touches only its own column family"
        s.put("counts", b"c", b"3")
        assert list(s.items("counts")) == [(b"c", b"3")]
        assert s.column_families() == ["counts", "names"]


def test_empty_values_and_keys_are_values(store: RocksStateStore) -> None:
    store.put("cf", b"", b"empty key")
    store.put("cf", b"k", b"")
    assert store.get("cf", b"") == b"empty key"
    assert store.get("cf", b"k") == b""
    store.flush()
    assert store.get("cf", b"k") == b""
    assert list(store.items("cf")) == [(b"", b"empty key"), (b"k", b"")]


def test_column_family_named_default_is_an_ordinary_state(store: RocksStateStore) -> None:
    store.put("default", b"k", b"v")
    store.clear("default")
    store.put("default", b"k2", b"v2")
    assert list(store.items("default")) == [(b"k2", b"v2")]


def test_column_families_and_data_survive_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with RocksStateStore.open(path) as s:
        s.put("a", b"k1", b"v1")
        s.put("b", b"k2", b"v2")
        s.put("emptied", b"k", b"v")
        s.delete("emptied", b"k")
        s.clear("cleared")
    with RocksStateStore.open(path, create=False) as s:
        assert s.column_families() == ["a", "b", "cleared", "emptied"]
        assert s.get("a", b"k1") == b"v1"
        assert s.get("b", b"k2") == b"v2"
        assert list(s.items("emptied")) == []
        s.put("a", b"k3", b"v3")
    with RocksStateStore.open(path) as s:
        assert list(s.items("a")) == [(b"k1", b"v1"), (b"k3", b"v3")]


@pytest.mark.parametrize("every", [1, 65536])
def test_items_scans_a_prefix_in_key_order_including_unflushed_writes(tmp_path: Path, every: int) -> None:
    keys = [
        b"user\x01b",
        b"user\x01a",
        b"user\x02",
        b"user",
        b"usep",
        b"user\xff\xff",
        b"\xff\xff",
        b"\xff\xff\x00",
    ]
    with sync_every(every), RocksStateStore.open(tmp_path / "s") as s:
        for i, key in enumerate(keys):
            s.put("cf", key, b"%d" % i)
        s.delete("cf", b"user\x01a")
        s.put("other", b"user\x01z", b"elsewhere")
        got = list(s.items("cf", b"user"))
        assert [k for k, _ in got] == [b"user", b"user\x01b", b"user\x02", b"user\xff\xff"]
        assert dict(got)[b"user\x02"] == b"2"
        assert [k for k, _ in s.items("cf", b"user\x01")] == [b"user\x01b"]
        assert [k for k, _ in s.items("cf", b"\xff\xff")] == [b"\xff\xff", b"\xff\xff\x00"]
        assert [k for k, _ in s.items("cf")] == sorted(set(keys) - {b"user\x01a"})
        assert list(s.items("cf", b"nothing")) == []
        assert list(s.items("no-such-cf")) == []


def test_multi_get_and_put_many_agree_with_get_and_put(tmp_path: Path) -> None:
    with sync_every(3), RocksStateStore.open(tmp_path / "s") as s:
        s.put_many("cf", [(b"k%d" % i, b"v%d" % i) for i in range(10)])
        s.delete("cf", b"k4")
        s.put("cf", b"k5", b"new")
        keys = [b"k9", b"k4", b"k5", b"missing", b"k0"]
        assert s.multi_get("cf", keys) == [s.get("cf", k) for k in keys] == [b"v9", None, b"new", None, b"v0"]
        assert s.multi_get("no-such-cf", [b"a", b"b"]) == [None, None]
        log = list(s.take_changelog())
        assert log[:10] == [(PUT, "cf", b"k%d" % i, b"v%d" % i) for i in range(10)]
        assert log[10:] == [(DELETE, "cf", b"k4", None), (PUT, "cf", b"k5", b"new")]


def test_non_bytes_keys_and_values_fail_at_the_call(store: RocksStateStore) -> None:
    with pytest.raises(TypeError, match="bytes"):
        store.put("cf", "text", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        store.put("cf", b"k", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        store.delete("cf", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        store.put_many("cf", [(b"k", b"v"), (b"k2", "v2")])  # type: ignore[list-item]
    assert list(store.take_changelog()) == []
    store.flush()


# ---------------------------------------------------------------------------------------------- changelog
def test_changelog_captures_exactly_the_writes_in_order_and_take_resets(store: RocksStateStore) -> None:
    assert list(store.take_changelog()) == []
    assert store.changelog_bytes == 0
    store.put("a", b"k1", b"v1")
    store.put("b", b"k1", b"xyz")
    store.delete("a", b"k2")
    store.clear("b")
    store.put("a", b"k1", b"v2")
    store.get("a", b"k1")
    list(store.items("a"))
    assert store.changelog_bytes == (1 + 2 + 2) + (1 + 2 + 3) + (1 + 2) + 1 + (1 + 2 + 2)
    assert list(store.take_changelog()) == [
        (PUT, "a", b"k1", b"v1"),
        (PUT, "b", b"k1", b"xyz"),
        (DELETE, "a", b"k2", None),
        (CLEAR, "b", b"", None),
        (PUT, "a", b"k1", b"v2"),
    ]
    assert list(store.take_changelog()) == []
    assert store.changelog_bytes == 0
    store.put("c", b"k", b"v")
    assert store.changelog_bytes == 3
    assert list(store.take_changelog()) == [(PUT, "c", b"k", b"v")]


def test_apply_replays_without_capturing(tmp_path: Path) -> None:
    with RocksStateStore.open(tmp_path / "s") as s:
        n = s.apply([(PUT, "a", b"k", b"v"), (DELETE, "a", b"gone", None), (PUT, "b", b"k", b"w")])
        assert n == 3
        assert list(s.take_changelog()) == []
        assert s.changelog_bytes == 0
        assert contents(s) == {"a": [(b"k", b"v")], "b": [(b"k", b"w")]}


def test_clear_then_put_in_one_changelog_replays_onto_existing_state(tmp_path: Path) -> None:
    base = [(PUT, "cf", b"old1", b"x"), (PUT, "cf", b"old2", b"y"), (PUT, "keep", b"k", b"z")]
    with RocksStateStore.open(tmp_path / "original") as s:
        s.apply(base)
        s.put("cf", b"before", b"1")
        s.clear("cf")
        s.put("cf", b"after", b"2")
        s.put("cf", b"old1", b"3")
        log = list(s.take_changelog())
        expected = contents(s)
    assert expected == {"cf": [(b"after", b"2"), (b"old1", b"3")], "keep": [(b"k", b"z")]}
    with RocksStateStore.open(tmp_path / "replica") as r:
        r.apply(base)
        r.put("cf", b"unsynced-write-of-the-replica", b"!")  # cleared by the replayed CLEAR too
        r.take_changelog()
        r.apply(log)
        assert contents(r) == expected


def test_apply_in_several_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "APPLY_BATCH", 7)
    records = [(PUT, f"cf{i % 3}", b"k%03d" % i, b"v%d" % i) for i in range(50)]
    records.insert(20, (CLEAR, "cf1", b"", None))
    records += [(DELETE, "cf0", b"k%03d" % i, None) for i in range(0, 50, 3)]
    with RocksStateStore.open(tmp_path / "s") as s:
        assert s.apply(records) == len(records)
        assert [k for k, _ in s.items("cf0")] == []
        assert [k for k, _ in s.items("cf1")] == [b"k%03d" % i for i in range(22, 50, 3)]
        assert len(list(s.items("cf2"))) == 16


def test_apply_names_the_bad_record(store: RocksStateStore) -> None:
    with pytest.raises(StateStoreError, match=r"record #1.*unknown op"):
        store.apply([(PUT, "a", b"k", b"v"), (9, "a", b"k", None)])
    with pytest.raises(StateStoreError, match=r"record #0.*no value"):
        store.apply([(PUT, "a", b"k", None)])
    with pytest.raises(StateStoreError, match=re.escape(str(store.path))):
        store.apply([(PUT, "a", "text-key", b"v")])


_cf_names = st.sampled_from(["a", "b", "default"])
_keys = st.binary(max_size=3).map(lambda b: b"p" + b) | st.sampled_from([b"", b"p", b"q", b"\xff"])
_ops = st.one_of(
    st.tuples(st.just(PUT), _cf_names, _keys, st.binary(max_size=8)),
    st.tuples(st.just(DELETE), _cf_names, _keys, st.none()),
    st.tuples(st.just(CLEAR), _cf_names, st.just(b""), st.none()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.lists(_ops, max_size=20),
    ops=st.lists(_ops, max_size=60),
    every=st.sampled_from([1, 4, 65536]),
    checks=st.lists(st.tuples(_cf_names, _keys), max_size=10),
)
def test_replaying_the_changelog_reproduces_the_store(
    base: list, ops: list, every: int, checks: list[tuple[str, bytes]]
) -> None:
    model: dict[str, dict[bytes, bytes]] = {}

    def model_apply(records: list) -> None:
        for op, cf, key, value in records:
            state = model.setdefault(cf, {})
            if op == PUT:
                state[key] = value
            elif op == DELETE:
                state.pop(key, None)
            else:
                state.clear()

    with tempfile.TemporaryDirectory() as tmp, sync_every(every):
        root = Path(tmp)
        with RocksStateStore.open(root / "original") as original:
            original.apply(base)
            model_apply(base)
            for op, cf, key, value in ops:
                if op == PUT:
                    original.put(cf, key, value)
                elif op == DELETE:
                    original.delete(cf, key)
                else:
                    original.clear(cf)
            model_apply(ops)
            for cf, key in checks:
                assert original.get(cf, key) == model.get(cf, {}).get(key)
            log = list(original.take_changelog())
            assert log == ops
            want = {cf: sorted(kv.items()) for cf, kv in model.items()}
            assert contents(original) == want
            for cf in model:
                assert list(original.items(cf, b"p")) == [kv for kv in want[cf] if kv[0].startswith(b"p")]
        with RocksStateStore.open(root / "replica") as replica:
            replica.apply(base)
            replica.apply(log)
            assert contents(replica) == want
        with RocksStateStore.open(root / "original", create=False) as reopened:
            assert contents(reopened) == want


# ---------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_opens_with_the_same_content_and_ignores_later_writes(tmp_path: Path) -> None:
    with RocksStateStore.open(tmp_path / "s") as s:
        s.apply([(PUT, "a", b"k%04d" % i, b"v" * 20) for i in range(2000)])
        s.flush()
        s.put("a", b"unflushed", b"in the overlay")
        s.put("b", b"k", b"v")
        s.delete("a", b"k0000")
        before = contents(s)
        dest = s.checkpoint(tmp_path / "checkpoints" / "cp")
        assert dest == tmp_path / "checkpoints" / "cp"
        wal = [p for p in dest.iterdir() if p.suffix == ".log"]
        assert all(p.stat().st_size == 0 for p in wal), "the checkpoint must not need a write-ahead log"

        s.put("a", b"k0001", b"changed")
        s.clear("b")
        s.put("c", b"new", b"cf")
        s.flush()
        with RocksStateStore.open(dest, create=False) as cp:
            assert contents(cp) == before
            assert cp.get("a", b"unflushed") == b"in the overlay"
            cp.put("a", b"written-in-checkpoint", b"x")
        assert s.get("a", b"written-in-checkpoint") is None
        assert s.get("a", b"k0001") == b"changed"


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.put("a", b"k2", b"v2"),
        lambda s: s.delete("a", b"k"),
        lambda s: s.clear("a"),
        lambda s: s.put_columns("a", [b"k3"], [b"v3"]),
        lambda s: s.apply([(PUT, "a", b"k4", b"v4")]),
    ],
    ids=["put", "delete", "clear", "put_columns", "apply"],
)
def test_a_flush_after_a_flush_writes_only_what_came_between(tmp_path: Path, write: Any) -> None:
    """A second flush with nothing new is skipped (a commit's checkpoint, then its close), but every kind
    of write in between is flushed into a new file."""
    with RocksStateStore.open(tmp_path / "s") as s:
        s.put("a", b"k", b"v")
        s.flush()
        files = len(s._open_db().live_files())
        s.flush()
        assert len(s._open_db().live_files()) == files
        write(s)
        s.flush()
        assert len(s._open_db().live_files()) == files + 1
        after = contents(s)
    with RocksStateStore.open(tmp_path / "s", create=False) as reopened:
        assert contents(reopened) == after


def test_checkpoint_refuses_an_existing_target(store: RocksStateStore, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(StateStoreError, match=r"taken.*already exists"):
        store.checkpoint(tmp_path / "taken")


# ---------------------------------------------------------------------------------------------- errors
def test_opening_a_directory_that_is_not_a_store_names_the_path(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a database")
    with pytest.raises(NotAStoreError, match=re.escape(str(junk))):
        RocksStateStore.open(junk)
    with pytest.raises(NotAStoreError, match=re.escape(str(junk))):
        RocksStateStore.open(junk, create=False)
    with pytest.raises(NotAStoreError, match="not a directory"):
        RocksStateStore.open(junk / "notes.txt")
    assert sorted(p.name for p in junk.iterdir()) == ["notes.txt"], "nothing was created among the files"


def test_open_without_create_does_not_create(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(NotAStoreError, match=re.escape(str(missing)) + ".*create=False"):
        RocksStateStore.open(missing, create=False)
    assert not missing.exists()


def test_a_broken_store_is_refused_naming_the_path(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "CURRENT").write_text("MANIFEST-000099\n")
    with pytest.raises(StateStoreError, match=re.escape(str(broken))):
        RocksStateStore.open(broken)


def test_a_database_with_foreign_column_families_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign"
    db = Rdict(str(path), Options(raw_mode=True))
    cf = db.create_column_family("something-else", Options(raw_mode=True))
    del cf
    db.close()
    with pytest.raises(NotAStoreError, match="something-else"):
        RocksStateStore.open(path)


def test_a_store_locked_by_another_open_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with RocksStateStore.open(path) as s:
        s.put("a", b"k", b"v")
        with pytest.raises(StoreLockedError, match=re.escape(str(path))):
            RocksStateStore.open(path)
    with RocksStateStore.open(path) as again:  # closing released the lock
        assert again.get("a", b"k") == b"v"


def test_a_store_locked_by_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    RocksStateStore.open(path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from blobstate.state.store import RocksStateStore as S; "
            f"s = S.open({str(path)!r}); print('open', flush=True); sys.stdin.read(); s.close()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError, match=re.escape(str(path))):
            RocksStateStore.open(path)
    finally:
        holder.communicate("", timeout=60)
    RocksStateStore.open(path).close()


def test_close_is_idempotent_and_a_closed_store_refuses_use(tmp_path: Path) -> None:
    s = RocksStateStore.open(tmp_path / "s")
    s.put("a", b"k", b"v")
    s.close()
    s.close()
    assert s.closed
    for call in (
        lambda: s.get("a", b"k"),
        lambda: s.put("a", b"k", b"v"),
        lambda: s.delete("a", b"k"),
        lambda: s.clear("a"),
        lambda: s.items("a"),
        lambda: s.multi_get("a", [b"k"]),
        lambda: s.apply([]),
        lambda: s.flush(),
        lambda: s.checkpoint(tmp_path / "cp"),
        lambda: s.column_families(),
    ):
        with pytest.raises(StoreClosedError, match=re.escape(str(tmp_path / "s"))):
            call()


def test_reopening_a_store_keeps_a_bounded_number_of_rocksdb_info_logs(tmp_path: Path) -> None:
    path = tmp_path / "s"
    for i in range(12):
        with RocksStateStore.open(path) as s:
            s.put("a", b"k", str(i).encode())
        with RocksStateStore.open(path, read_only=True) as s:
            assert s.get("a", b"k") == str(i).encode()
    logs = sorted(p.name for p in path.iterdir() if p.name.startswith("LOG"))
    assert len(logs) <= 2, logs
    assert "LOG" in logs


def _options_files(path: Path) -> list[str]:
    return sorted(f.name for f in path.iterdir() if re.fullmatch(r"OPTIONS-[0-9]+", f.name))


def test_a_closed_store_keeps_no_options_file_and_reopens_with_its_data(tmp_path: Path) -> None:
    """rocksdict parses a store's newest OPTIONS file at every open, then uses the options it is given:
    a store removes them just before it closes, so its next open skips the parse. While it is open it has
    its own (RocksDB writes one at every read-write open), so its checkpoints are complete, also after
    another open was refused; read-only stores are left as they are."""
    path = tmp_path / "s"
    with RocksStateStore.open(path) as s:
        s.put("a", b"k", b"v1")
        assert _options_files(path)
        with pytest.raises(StoreLockedError):
            RocksStateStore.open(path)
        checkpoint = s.checkpoint(tmp_path / "cp")
    assert _options_files(path) == []
    assert _options_files(checkpoint)
    for i in range(1, 4):
        with RocksStateStore.open(path) as s:
            assert _options_files(path)
            assert s.get("a", b"k") == b"v%d" % i
            s.put("a", b"k", b"v%d" % (i + 1))
            s.put("b", b"k", b"%d" % i)  # a new column family
        assert _options_files(path) == []
    with RocksStateStore.open(checkpoint, read_only=True) as s:
        assert s.get("a", b"k") == b"v1"
    assert _options_files(checkpoint)  # a read-only store is not changed
    with RocksStateStore.open(path) as s:
        assert contents(s) == {"a": [(b"k", b"v4")], "b": [(b"k", b"3")]}


def test_a_store_killed_right_after_removing_its_options_files_reopens_exactly(tmp_path: Path) -> None:
    """The removal comes after the close's flush and before RocksDB closes: a process killed between them
    leaves a store without OPTIONS files (and RocksDB's lock released by the kernel) that opens with
    everything it flushed."""
    path = tmp_path / "s"
    with RocksStateStore.open(path) as s:
        s.put("a", b"old", b"1")
    script = (
        "import os; from blobstate.state import store as m\n"
        f"s = m.RocksStateStore.open({str(path)!r})\n"
        "s.put('a', b'k', b'flushed'); s.delete('a', b'old'); s.flush()\n"
        "m._drop_options_files(s.path)\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    assert _options_files(path) == []
    with RocksStateStore.open(path) as s:
        assert contents(s) == {"a": [(b"k", b"flushed")]}
    assert _options_files(path) == []


def _logged_option(path: Path, name: str) -> str:
    """The value of option ``name`` in the header RocksDB wrote to the store's info log at its last open."""
    found = re.findall(rf"Options\.{name}: (\S+)", (path / "LOG").read_text())
    assert found, name
    return found[0]


def test_a_store_opens_its_files_with_a_thread_per_four_sst_files(tmp_path: Path) -> None:
    """RocksDB starts its file-opening threads for every column family at every open however few files
    there are; a store opens with one thread per four SST files (1 to 16), and its data reads back."""
    path = tmp_path / "s"
    with RocksStateStore.open(path) as s:
        assert _logged_option(path, "max_file_opening_threads") == "1"  # a new store
        for i in range(3):
            s.put("a", b"k%d" % i, b"v")
            s.flush()
    with RocksStateStore.open(path) as s:
        assert _logged_option(path, "max_file_opening_threads") == "1"
        assert dict(s.items("a")) == {b"k0": b"v", b"k1": b"v", b"k2": b"v"}
    with RocksStateStore.open(path, tuning=store_module.SCRATCH) as s:  # no compactions: a file per flush
        for i in range(3, 40):
            s.put("a", b"k%d" % i, b"v")
            s.flush()
    ssts = sum(1 for f in path.iterdir() if f.suffix == ".sst")
    assert ssts >= 36
    with RocksStateStore.open(path, tuning=store_module.SCRATCH) as s:  # read-only opens write no log
        assert _logged_option(path, "max_file_opening_threads") == str(min(16, ssts // 4))
        assert len(dict(s.items("a"))) == 40
    assert store_module._opening_threads(tmp_path / "missing") == 1


def test_the_rocksdb_store_is_the_key_value_store_the_processor_layer_needs(tmp_path: Path) -> None:
    from blobstate.state.interface import KeyValueStore

    store = RocksStateStore.open(tmp_path / "db")
    try:
        assert isinstance(store, KeyValueStore)
    finally:
        store.close()


def test_a_store_written_with_leveled_compaction_opens_and_compacts_with_the_current_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores (and snapshots) written before universal compaction was the default keep working."""
    from rocksdict import DBCompactionStyle

    original = store_module._cf_options

    def leveled(*args: object) -> Options:
        options = original(*args)  # type: ignore[arg-type]
        options.set_compaction_style(DBCompactionStyle.level())
        return options

    expected = {}
    monkeypatch.setattr(store_module, "_cf_options", leveled)
    with RocksStateStore.open(tmp_path / "db") as old:
        for batch in range(6):
            keys = [b"k%06d" % (i * 7 + batch) for i in range(5000)]
            values = [b"v%d" % batch] * len(keys)
            old.put_columns("state", keys, values)
            expected.update(zip(keys, values, strict=True))
            old.flush()
    monkeypatch.setattr(store_module, "_cf_options", original)
    with RocksStateStore.open(tmp_path / "db") as store:
        assert dict(store.items("state")) == expected
        store.put_columns("state", [b"k000000"], [b"new"])
        expected[b"k000000"] = b"new"
        for _ in range(5):
            store.put("state", b"other", b"x")
            store.flush()
    with RocksStateStore.open(tmp_path / "db") as store:
        assert {k: v for k, v in store.items("state") if k != b"other"} == expected


def test_a_scratch_store_holds_its_write_buffers_whatever_it_is_given_and_never_compacts(
    tmp_path: Path,
) -> None:
    """A store written once and read once (a rescale's) keeps at most two small write buffers however
    much it is given and flushes them into new files without compacting; every record reads back, and
    a query's options open it and merge its files."""
    buffer = 256 * 1024
    tuning = StoreTuning(write_buffer_bytes=buffer, auto_compactions=False, block_cache_bytes=1 << 20)
    expected = {}
    peak = 0
    with RocksStateStore.open(tmp_path / "db", tuning=tuning) as store:
        for batch in range(40):  # about 40 times the write buffers' bytes, in shuffled key order
            keys = [b"key-%08d" % ((i * 7919 + batch * 104729) % 1_000_003) for i in range(2000)]
            values = [b"v%d-" % batch + b"x" * 100] * len(keys)
            store.apply((PUT, "state", k, v) for k, v in zip(keys, values, strict=True))
            expected.update(zip(keys, values, strict=True))
            db = store._open_db()
            peak = max(peak, db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)
        files = len(store._open_db().live_files())
        assert peak <= 2 * buffer + 64 * 1024  # two buffers (and the arena's last block) at most
        assert files >= 10  # flushed into files, none merged
        assert dict(store.items("state")) == expected
    with RocksStateStore.open(tmp_path / "db") as store:  # a query's options open it
        assert dict(store.items("state")) == expected
        store.put("state", b"key-new", b"x")
        store.flush()
        store._cfs["state"].view.compact_range(None, None)  # compactions are on again
        assert len(store._open_db().live_files()) < files
        assert dict(store.items("state")) == {**expected, b"key-new": b"x"}


def test_put_columns_wins_over_earlier_writes_and_is_captured_in_order(store: RocksStateStore) -> None:
    store.put("s", b"a", b"old")  # still in the write overlay
    store.put_columns("s", [b"a", b"b"], [b"new", b"bee"])
    assert store.get("s", b"a") == b"new"
    assert store.multi_get("s", [b"b", b"a", b"zz"]) == [b"bee", b"new", None]
    assert [(r[2], r[3]) for r in store.take_changelog()] == [(b"a", b"old"), (b"a", b"new"), (b"b", b"bee")]
    with pytest.raises(TypeError, match="must be bytes"):
        store.put_columns("s", [b"c", "d"], [b"1", b"2"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 keys and 1 values"):
        store.put_columns("s", [b"c", b"d"], [b"1"])
