"""The load rules (docs/DESIGN.md, "Load rules") on a history with competing attempts, and the errors of
loading (rule 4).

The history's attempts are named by the version they would have in a longer-running query (18..24),
played here as versions 1..7: version 3 has a snapshot (attempt "20"), version 4 has two attempts
(21_ef6618c2 and 21_f4d05ac9, the second committed), and so on. The "appendix" tests are scenarios where
an attempt that was not chosen left state on an executor's disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from lineage_harness import OP, QUERY_ID, Driver, FaultyStore, dump, new_memory_store, on_tmpfs, open_p

from blobstate.blobstore import BlobStore
from blobstate.ids import CheckpointId, InvalidIdError
from blobstate.layout import CHECKPOINT_ID_FILE, LocalPartitionLayout, commit_name, delta_name, snapshot_name
from blobstate.lineage.commitlog import CommitLog, CommitLogFormatError, content_digest
from blobstate.lineage.delta import encode_delta
from blobstate.snapshot import read_snapshot_index
from blobstate.state.errors import CorruptObjectError, LineageError, MissingObjectError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.loader import catch_up
from blobstate.state.localdirs import list_checkpoints, read_checkpoint_id
from blobstate.state.partition import CommitResult
from blobstate.state.store import RocksStateStore


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """Local directories on tmpfs when there is one: fsync and RocksDB opens are much cheaper there."""
    with on_tmpfs(tmp_path) as path:
        yield path


NEVER = 1000  # snapshot_every that never triggers a snapshot
ALWAYS = 1  # snapshot_every that always does


@dataclass
class History:
    store: object
    dirs: dict[str, Path]
    cids: dict[str, CheckpointId] = field(default_factory=dict)
    results: dict[str, CommitResult] = field(default_factory=dict)
    states: dict[str, dict] = field(default_factory=dict)
    driver: Driver | None = None

    def attempt(
        self, name: str, where: str, base: str | None, values: dict[bytes, bytes], every: int
    ) -> None:
        """Run one attempt on top of the attempt ``base`` (None: version 0) in local dir ``where``."""
        committed = None if base is None else self.cids[base]
        with open_p(self.store, self.dirs[where], committed, snapshot_every=every) as state:
            expected = dict(self.states[base]) if base else {}
            assert dump(state) == expected, f"attempt {name} loaded the wrong state"
            for k, v in values.items():
                state.store.put("a", k, v)
                expected[("a", k)] = v
            result = state.commit()
        self.cids[name] = result.checkpoint_id
        self.results[name] = result
        self.states[name] = expected

    def commit(self, name: str) -> None:
        assert self.driver is not None
        self.driver.commit({0: self.results[name]}, self.cids[name].version)


def seed_history(
    tmp_path: Path, *, snapshot_23: bool, other_23: bool = False, fail_23: bool = False
) -> History:
    """Versions 1..7 (attempts named "18".."24") with competing attempts; returns them by name."""
    inner = new_memory_store()
    store = FaultyStore(inner)
    h = History(store, {x: tmp_path / x for x in ("X", "Y", "Z")})
    h.driver = Driver(store)
    h.attempt("18", "Y", None, {b"k18": b"18"}, NEVER)
    h.commit("18")
    h.attempt("19", "Y", "18", {b"k19": b"19"}, NEVER)
    h.commit("19")
    h.attempt("20", "Y", "19", {b"k20": b"20"}, ALWAYS)  # 20_d8e2ca47.zip
    h.commit("20")
    h.attempt("21_ef66", "X", "20", {b"k21": b"ef66", b"only-ef66": b"x"}, NEVER)
    h.attempt("21_f4d0", "Y", "20", {b"k21": b"f4d0"}, NEVER)
    h.commit("21_f4d0")
    h.attempt("22", "Y", "21_f4d0", {b"k22": b"22"}, NEVER)
    h.commit("22")
    if fail_23:
        store.fail_when = lambda op, name: op == "put_if_absent" and name.endswith(".snapshot")
    h.attempt("23_689a", "Y", "22", {b"k23": b"689a"}, ALWAYS if snapshot_23 else NEVER)
    store.fail_when = None
    if other_23:
        h.attempt("23_8205", "Z", "22", {b"k23": b"8205", b"only-8205": b"x"}, ALWAYS)
    h.commit("23_689a")
    h.attempt("24", "Y", "23_689a", {b"k24": b"24"}, NEVER)
    h.commit("24")
    store.calls.clear()
    return h


def uid_touched(store: FaultyStore, cid: CheckpointId) -> bool:
    return any(cid.uid in name for name in store.names_touched())


def test_example_1_the_checkpoint_has_a_snapshot(tmp_path: Path) -> None:
    h = seed_history(tmp_path, snapshot_23=True, other_23=True)
    target = h.cids["23_689a"]
    with open_p(h.store, tmp_path / "fresh", target) as state:
        assert dump(state) == h.states["23_689a"]
        report = state.load_report
        assert (report.rule, report.base_kind, report.base, report.deltas_replayed) == (
            "remote",
            "snapshot",
            target.name,
            0,
        )
    assert not uid_touched(h.store, h.cids["21_ef66"]) and not uid_touched(h.store, h.cids["23_8205"])


def test_example_2_only_a_delta_and_another_attempts_snapshot_is_ignored(tmp_path: Path) -> None:
    h = seed_history(tmp_path, snapshot_23=False, other_23=True)
    assert h.store.inner.exists(snapshot_name(OP, 0, h.cids["23_8205"]))
    target = h.cids["23_689a"]
    with open_p(h.store, tmp_path / "fresh", target) as state:
        assert dump(state) == h.states["23_689a"]
        assert (b"only-8205" not in {k for _, k in dump(state)}) and ("a", b"only-ef66") not in dump(state)
        report = state.load_report
        assert report.base == h.cids["20"].name and report.base_kind == "snapshot"
        assert report.deltas_replayed == 3  # 21_f4d05ac9, 22, 23_689aa6bd
    touched = h.store.names_touched()
    assert not uid_touched(h.store, h.cids["23_8205"]), "files of another uid of version 23 were opened"
    assert not uid_touched(h.store, h.cids["21_ef66"])
    assert delta_name(OP, 0, h.cids["21_f4d0"]) in touched


def test_example_3_the_presumed_snapshot_is_missing(tmp_path: Path) -> None:
    h = seed_history(tmp_path, snapshot_23=True, fail_23=True)
    assert not h.store.inner.exists(snapshot_name(OP, 0, h.cids["23_689a"]))
    target = h.cids["24"]
    with open_p(h.store, tmp_path / "fresh", target) as state:
        assert dump(state) == h.states["24"]
        report = state.load_report
        assert report.missing_snapshots == [h.cids["23_689a"].name]
        assert report.base == h.cids["20"].name
        assert report.deltas_replayed == 4  # 21_f4d05ac9, 22, 23_689aa6bd, 24
    # 24's own lineage reaches only 23, the presumed snapshot; 23's delta carried the rest
    lineage_24 = h.store.inner.get(delta_name(OP, 0, target))
    from blobstate.lineage.delta import read_delta_lineage

    assert read_delta_lineage(lineage_24, name="24") == [h.cids["23_689a"].uid]


def test_a_local_checkpoint_on_the_lineage_is_preferred_to_a_remote_snapshot(tmp_path: Path) -> None:
    # 23's snapshot was due and its upload failed: local dir Y holds the checkpoints of 20 and 23 (taken
    # where a snapshot is due), the blob store a snapshot of 20 only; load 24 after Y's working is gone
    h = seed_history(tmp_path, snapshot_23=True, fail_23=True)
    import shutil

    lay = LocalPartitionLayout(h.dirs["Y"], QUERY_ID, OP, 0)
    assert [c.version for c in list_checkpoints(lay.checkpoints)] == [3, 6]
    shutil.rmtree(lay.working)
    with open_p(h.store, h.dirs["Y"], h.cids["24"]) as state:
        assert dump(state) == h.states["24"]
        report = state.load_report
        assert (report.rule, report.base_kind, report.base) == ("remote", "local", h.cids["23_689a"].name)
        assert report.deltas_replayed == 1
    assert not any(op == "get" and name.endswith(".snapshot") for op, name in h.store.calls)


def test_a_dirty_working_store_is_rebuilt_from_the_newest_local_checkpoint_on_the_lineage(
    tmp_path: Path,
) -> None:
    h = seed_history(tmp_path, snapshot_23=False)
    lay = LocalPartitionLayout(h.dirs["Y"], QUERY_ID, OP, 0)
    # Y took a local checkpoint at 20 only, where a snapshot was due; its working store is clean at 24.
    # Once its clean marker is gone it must replay 21_f4d0 to 24 on top of checkpoint 20, not of itself.
    assert list_checkpoints(lay.checkpoints) == [h.cids["20"]]
    (lay.working / CHECKPOINT_ID_FILE).unlink()
    with open_p(h.store, h.dirs["Y"], h.cids["24"]) as state:
        assert dump(state) == h.states["24"]
        assert (state.load_report.base_kind, state.load_report.base) == ("local", h.cids["20"].name)
        assert state.load_report.deltas_replayed == 4
    assert not any(op == "get" and name.endswith(".snapshot") for op, name in h.store.calls)


def test_appendix_collect_list_the_unchosen_attempts_local_state_never_leaks(tmp_path: Path) -> None:
    store = new_memory_store()
    driver = Driver(store)
    # Batch 1: task 1 puts 6 -> foo on executor X, task 2 puts 8 -> foo on executor Y; task 1 is committed.
    with open_p(store, tmp_path / "X", None, snapshot_every=ALWAYS) as t1:
        t1.store.put("a", b"6", b"foo")
        r1 = t1.commit()
    with open_p(store, tmp_path / "Y", None) as t2:
        t2.store.put("a", b"8", b"foo")
        t2.commit()
    driver.commit({0: r1}, 1)
    # Batch 2 runs on Y, whose working store is clean at the un-chosen attempt: it must rebuild.
    with open_p(store, tmp_path / "Y", driver.committed()) as task:
        assert task.load_rule != "working"
        assert dump(task) == {("a", b"6"): b"foo"}
        task.store.put("a", b"6", task.store.get("a", b"6") + b",bar")
        r2 = task.commit()
    driver.commit({0: r2}, 2)
    # Query restart: replaying the committed lineage gives (6 -> foo,bar); foo is not lost, 8 never appears.
    with open_p(store, tmp_path / "restart", driver.committed()) as state:
        assert dump(state) == {("a", b"6"): b"foo,bar"}


def test_appendix_sample_three_a_task_must_not_continue_from_its_own_unchosen_state(tmp_path: Path) -> None:
    store = new_memory_store()
    driver = Driver(store)

    def members(state) -> set[bytes]:
        return {k for (_, k) in dump(state)}

    with open_p(store, tmp_path / "X", None) as s:
        for m in (b"A", b"B", b"C"):
            s.store.put("a", m, b"")
        base = s.commit()
    driver.commit({0: base}, 1)
    # Batch n: D arrives. Task 1 (executor X) drops A, task 2 (executor Y) drops B; task 2 wins.
    with open_p(store, tmp_path / "X", driver.committed()) as t1:
        t1.store.delete("a", b"A")
        t1.store.put("a", b"D", b"")
        t1.commit()
    with open_p(store, tmp_path / "Y", driver.committed()) as t2:
        t2.store.delete("a", b"B")
        t2.store.put("a", b"D", b"")
        chosen = t2.commit()
    driver.commit({0: chosen}, 2)
    # Batch n+1 runs on X again: its working store is clean at task 1's (un-chosen) checkpoint.
    with open_p(store, tmp_path / "X", driver.committed()) as t:
        assert members(t) == {b"A", b"C", b"D"}, "task continued from the un-chosen attempt's local state"
        t.store.put("a", b"E", b"")
        t.store.delete("a", b"A")  # keep exactly three
        nxt = t.commit()
    driver.commit({0: nxt}, 3)
    with open_p(store, tmp_path / "restart", driver.committed()) as s:
        assert members(s) == {b"C", b"D", b"E"}


@pytest.mark.parametrize("snapshot_every", [ALWAYS, NEVER])
def test_two_attempts_on_one_executor_load_the_chosen_one(tmp_path: Path, snapshot_every: int) -> None:
    """With a snapshot due, the chosen attempt's local checkpoint is the copy to load (no I/O); without,
    there is no local checkpoint and the chosen attempt's delta is replayed."""
    inner = new_memory_store()
    driver = Driver(inner)
    with open_p(inner, tmp_path, None, snapshot_every=snapshot_every) as s:
        s.store.put("a", b"k", b"first")
        first = s.commit()
    with open_p(inner, tmp_path, None, snapshot_every=snapshot_every) as s:
        s.store.put("a", b"k", b"second")
        second = s.commit()  # the working store is now clean at the second attempt
    driver.commit({0: first}, 1)
    store = FaultyStore(inner)
    with open_p(store, tmp_path, driver.committed()) as s:
        assert dump(s) == {("a", b"k"): b"first"}
        if snapshot_every == ALWAYS:
            assert s.load_rule == "local-checkpoint"
        else:
            report = s.load_report
            assert (report.rule, report.base_kind, report.deltas_replayed) == ("remote", "empty", 1)
    if snapshot_every == ALWAYS:
        assert store.calls == []
    assert not uid_touched(store, second.checkpoint_id)


# ---------------------------------------------------------------------------------------------- rule 4
def three_versions(tmp_path: Path, every: int = NEVER) -> tuple[FaultyStore, list]:
    store = FaultyStore(new_memory_store())
    driver = Driver(store)
    committed, results = None, []
    for i in range(3):
        with open_p(store, tmp_path / "writer", committed, snapshot_every=every) as s:
            s.store.put("a", b"k%d" % i, b"v%d" % i)
            results.append(s.commit())
        driver.commit({0: results[-1]}, i + 1)
        committed = results[-1].checkpoint_id
    return store, results


def assert_dirty(local: Path) -> None:
    working = LocalPartitionLayout(local, QUERY_ID, OP, 0).working
    assert read_checkpoint_id(working) is None


def test_a_missing_delta_is_an_error_naming_object_version_and_uid(tmp_path: Path) -> None:
    store, results = three_versions(tmp_path)
    middle = results[1]
    data = store.inner.get(middle.delta_name)
    store.inner.delete(middle.delta_name)
    with pytest.raises(MissingObjectError) as info:
        open_p(store, tmp_path / "fresh", results[2].checkpoint_id)
    message = str(info.value)
    assert middle.delta_name in message and "version 2" in message and middle.checkpoint_id.uid in message
    assert info.value.checkpoint_id == middle.checkpoint_id
    assert_dirty(tmp_path / "fresh")
    # never reset to empty: asking again fails again; once the object is back, it loads
    with pytest.raises(MissingObjectError):
        open_p(store, tmp_path / "fresh", results[2].checkpoint_id)
    store.inner.put(middle.delta_name, data)
    with open_p(store, tmp_path / "fresh", results[2].checkpoint_id) as s:
        assert len(dump(s)) == 3


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: d[: len(d) // 2], "bytes where the commit recorded"),
        (lambda d: d[:-3] + bytes([d[-3] ^ 0xFF]) + d[-2:], "SHA-256 .* where the commit recorded"),
        (lambda d: d[:8] + (99).to_bytes(2, "little") + d[10:], "SHA-256 .* where the commit recorded"),
        (lambda d: b"not a delta at all", "bytes where the commit recorded"),
    ],
    ids=["truncated", "bit-flip", "format-version", "garbage"],
)
def test_a_corrupt_delta_is_an_error_and_nothing_is_half_applied(tmp_path: Path, damage, expected) -> None:
    store, results = three_versions(tmp_path)
    last = results[2]
    store.inner.put(last.delta_name, damage(store.inner.get(last.delta_name)))
    with pytest.raises(CorruptObjectError, match=expected) as info:
        open_p(store, tmp_path / "fresh", last.checkpoint_id)
    assert info.value.name == last.delta_name and info.value.checkpoint_id == last.checkpoint_id
    assert_dirty(tmp_path / "fresh")


def forge_commit(store: BlobStore, version: int, **objects: bytes) -> None:
    """What an attacker who can rewrite the commit log too would do: make commit ``version`` vouch for
    other bytes (``delta=`` and/or ``snapshot=``)."""
    raw = json.loads(store.get(commit_name(version)))
    for kind, data in objects.items():
        raw["objects"][OP]["0"][kind] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    raw["sha256"] = content_digest(raw)
    store.put(commit_name(version), json.dumps(raw).encode())


def test_a_lineage_gap_is_an_error(tmp_path: Path) -> None:
    store, results = three_versions(tmp_path)
    gap = encode_delta([], [])  # version 3 claims to follow version 0
    store.inner.put(results[2].delta_name, gap)
    forge_commit(store.inner, 3, delta=gap)
    with pytest.raises(LineageError, match="gap"):
        open_p(store, tmp_path / "fresh", results[2].checkpoint_id)
    too_long = encode_delta([], ["ef" * 16, "01" * 16])  # version 2 naming two older versions
    store.inner.put(results[1].delta_name, too_long)
    forge_commit(store.inner, 2, delta=too_long)
    with pytest.raises(LineageError, match="below version 1"):
        open_p(store, tmp_path / "fresh", results[1].checkpoint_id)


def test_a_lineage_naming_an_uncommitted_attempt_is_an_error(tmp_path: Path) -> None:
    store, results = three_versions(tmp_path)
    other = encode_delta([], ["ab" * 16])  # version 3 claims to follow another attempt at version 2
    store.inner.put(results[2].delta_name, other)
    forge_commit(store.inner, 3, delta=other)
    with pytest.raises(LineageError, match=f"names uid {'ab' * 16} for version 2") as info:
        open_p(store, tmp_path / "fresh", results[2].checkpoint_id)
    assert results[1].checkpoint_id.uid in str(info.value) and results[2].delta_name in str(info.value)


def test_a_corrupt_snapshot_blob_is_loaded_around_from_older_deltas_or_named(tmp_path: Path) -> None:
    store, results = three_versions(tmp_path, every=3)
    snap = results[2]
    assert snap.snapshot_name
    index = read_snapshot_index(store.inner, snap.snapshot_name)
    blob = sorted(index.present_blob_ids())[0]
    data = store.inner.get(blob)
    store.inner.put(blob, data[:-1] + bytes([data[-1] ^ 1]))
    # Deltas 1..3 still exist: the version is rebuilt from them, and the load says so.
    with open_p(store, tmp_path / "fresh", snap.checkpoint_id) as s:
        assert dump(s) == {("a", b"k%d" % i): b"v%d" % i for i in range(3)}
        assert s.load_report.base_kind == "empty" and s.load_report.deltas_replayed == 3
        assert len(s.load_report.snapshot_repairs) == 1 and blob in s.load_report.snapshot_repairs[0]
    # Without them the snapshot is the only way: an error naming the blob, version and uid.
    store.inner.delete(results[0].delta_name)
    with pytest.raises(CorruptObjectError, match="corrupt") as info:
        open_p(store, tmp_path / "other", snap.checkpoint_id)
    assert info.value.name == blob and info.value.checkpoint_id == snap.checkpoint_id
    store.inner.delete(blob)
    with pytest.raises(MissingObjectError) as missing:
        open_p(store, tmp_path / "other", snap.checkpoint_id)
    assert blob in str(missing.value) and snap.checkpoint_id.uid in str(missing.value)
    assert_dirty(tmp_path / "other")


def test_an_oversized_snapshot_index_or_delta_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """An object far larger than the size its commit records (damaged, or written by something else) is
    read no further than one byte past that size: a loader never holds a foreign object of any size."""
    store, results = three_versions(tmp_path, every=3)
    snap = results[2]
    assert snap.snapshot_name
    recorded = len(store.inner.get(snap.snapshot_name))
    store.inner.put(snap.snapshot_name, os.urandom(4 << 20))
    store.inner.delete(results[0].delta_name)  # no older base to rebuild from
    with pytest.raises(CorruptObjectError, match=f"more than {recorded} bytes where the commit recorded"):
        open_p(store, tmp_path / "fresh", snap.checkpoint_id)
    assert store.bytes_read[snap.snapshot_name] == recorded + 1

    store, results = three_versions(tmp_path / "deltas")
    last = results[2]
    recorded = len(store.inner.get(last.delta_name))
    store.inner.put(last.delta_name, os.urandom(4 << 20))
    with pytest.raises(CorruptObjectError, match=f"more than {recorded} bytes where the commit recorded"):
        open_p(store, tmp_path / "deltas" / "fresh", last.checkpoint_id)
    assert store.bytes_read[last.delta_name] == recorded + 1
    assert_dirty(tmp_path / "deltas" / "fresh")


@pytest.mark.parametrize("damage", ["emptied", "other-sst-name", "other-checkpoint", "not-json"])
def test_an_altered_snapshot_index_is_detected_even_when_it_is_valid_json(
    tmp_path: Path, damage: str
) -> None:
    store, results = three_versions(tmp_path, every=3)
    snap = results[2]
    assert snap.snapshot_name
    original = store.inner.get(snap.snapshot_name)
    raw = json.loads(original)
    if damage == "emptied":
        raw["dirIndex"]["filesPresent"] = []
        altered = json.dumps(raw).encode()
    elif damage == "other-sst-name":
        altered = re.sub(
            rb"(\d)(\d*\.sst)", lambda m: b"%d" % ((int(m[1]) + 1) % 10) + m[2], original, count=1
        )
    elif damage == "other-checkpoint":
        raw["checkpointId"] = CheckpointId(3, "ab" * 16).name
        altered = json.dumps(raw).encode()
        forge_commit(store.inner, 3, snapshot=altered)
    else:
        altered = b"{not json"
        forge_commit(store.inner, 3, snapshot=altered)
    assert altered != original
    store.inner.put(snap.snapshot_name, altered)
    store.inner.delete(results[0].delta_name)  # no older base to rebuild from
    with pytest.raises(CorruptObjectError) as info:
        open_p(store, tmp_path / "fresh", snap.checkpoint_id)
    assert info.value.name == snap.snapshot_name and info.value.checkpoint_id == snap.checkpoint_id
    assert_dirty(tmp_path / "fresh")


def test_ids_that_try_to_escape_the_checkpoint_root_are_rejected(tmp_path: Path) -> None:
    for bad in ("../../etc", "ABCDEF12", "x" * 8, "", "12345678/../.."):
        with pytest.raises(InvalidIdError):
            CheckpointId(3, bad)
    for bad in ("3_../../etc", "../3_abcdef12", "3_abcdef12/..", "-1_abcdef12", "03_abcdef12"):
        with pytest.raises(InvalidIdError):
            CheckpointId.parse(bad)
    with pytest.raises(InvalidIdError):
        LocalPartitionLayout(tmp_path, "../../x", OP, 0)
    with pytest.raises(InvalidIdError):
        LocalPartitionLayout(tmp_path, QUERY_ID, "../0", 0)
    with pytest.raises(TypeError):
        open_p(new_memory_store(), tmp_path, "3_abcdef12")  # type: ignore[arg-type]


def test_bad_ids_in_the_commit_log_are_clear_errors(tmp_path: Path) -> None:
    import json

    store = new_memory_store()
    driver = Driver(store)
    with open_p(store, tmp_path, None) as s:
        s.store.put("a", b"k", b"v")
        result = s.commit()
    driver.commit({0: result}, 1)
    raw = json.loads(store.get(commit_name(1)))
    raw["version"] = 2
    raw["batch_id"] = 1
    raw["checkpoints"][OP]["0"] = "../../../etc/passwd"
    store.put(commit_name(2), json.dumps(raw).encode())
    with pytest.raises(CommitLogFormatError, match=r"commits/2\.json.*checkpoints"):
        CommitLog(store).read_commit(2)


def test_a_tampered_clean_marker_is_treated_as_dirty(tmp_path: Path) -> None:
    inner = new_memory_store()
    with open_p(inner, tmp_path, None, snapshot_every=ALWAYS) as s:
        s.store.put("a", b"k", b"v")
        result = s.commit()
    working = LocalPartitionLayout(tmp_path, QUERY_ID, OP, 0).working
    (working / CHECKPOINT_ID_FILE).write_text("1_../../../../etc")
    assert read_checkpoint_id(working) is None
    (LocalPartitionLayout(tmp_path, QUERY_ID, OP, 0).checkpoints / "not-a-checkpoint").mkdir()
    with open_p(inner, tmp_path, result.checkpoint_id) as s:
        assert s.load_rule == "local-checkpoint"
        assert dump(s) == {("a", b"k"): b"v"}


def test_catch_up_brings_a_standby_directory_to_a_version_reusing_what_it_holds(tmp_path: Path) -> None:
    """The same catch-up as the working store, on the partition's standby directory: a first catch-up
    restores from the blob store; a later one reuses the replica and fetches only the newer deltas."""
    from blobstate.state.history import CommitCache, PartitionHistory
    from blobstate.state.loader import RULE_REMOTE, catch_up
    from blobstate.state.local_copy import open_rocks as _open_rocks

    store, results = three_versions(tmp_path)
    layout = LocalPartitionLayout(tmp_path / "replica-host", QUERY_ID, OP, 0)
    history = PartitionHistory(CommitCache(CommitLog(store)), OP, 0)
    first = catch_up(store, layout, layout.standby, results[1].checkpoint_id, _open_rocks, history)
    try:
        assert first.report.rule == RULE_REMOTE
        assert dump(first.store) == {("a", b"k0"): b"v0", ("a", b"k1"): b"v1"}
    finally:
        first.store.close()
    assert not layout.working.exists(), "catching up the replica touched the working store"
    # A replica marks itself at the version it reached (as a commit marks the working store).
    (layout.standby / CHECKPOINT_ID_FILE).write_text(results[1].checkpoint_id.name)

    store.calls.clear()
    second = catch_up(store, layout, layout.standby, results[2].checkpoint_id, _open_rocks, history)
    try:
        assert dump(second.store) == {("a", b"k0"): b"v0", ("a", b"k1"): b"v1", ("a", b"k2"): b"v2"}
        assert second.report.base == results[1].checkpoint_id.name
    finally:
        second.store.close()
    fetched = [name for op, name in store.calls if op == "get" and name.endswith(".delta")]
    assert fetched == [delta_name(OP, 0, results[2].checkpoint_id)]


def test_a_chain_of_deltas_is_decoded_one_delta_at_a_time_as_it_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore holds one decoded delta at a time, so its memory does not grow with the chain (a chain of
    big deltas once held every one decoded); every delta is still downloaded and checked against its
    commit before the first is applied."""
    import blobstate.state.loader as loader
    from blobstate.state.history import CommitCache, PartitionHistory
    from blobstate.state.local_copy import open_rocks as _open_rocks

    store, results = three_versions(tmp_path)
    decoded: list[str] = []
    applied: list[tuple[int, int]] = []  # (decoded so far, deltas fetched so far) at each apply
    real_decode = loader.open_delta

    def counting_decode(data: bytes, *, name: str) -> object:
        decoded.append(name)
        return real_decode(data, name=name)

    class Spy:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def apply(self, records: object) -> None:
            fetched = [n for op, n in store.calls if op == "get" and n.endswith(".delta")]
            applied.append((len(decoded), len(fetched)))
            self.inner.apply(records)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    monkeypatch.setattr(loader, "open_delta", counting_decode)
    layout = LocalPartitionLayout(tmp_path / "reader", QUERY_ID, OP, 0)
    history = PartitionHistory(CommitCache(CommitLog(store)), OP, 0)
    store.calls.clear()
    loaded = loader.catch_up(
        store, layout, layout.working, results[2].checkpoint_id, lambda p: Spy(_open_rocks(p)), history
    )
    try:
        assert loaded.report.deltas_replayed == 3
        assert dump(loaded.store.inner) == {("a", b"k0"): b"v0", ("a", b"k1"): b"v1", ("a", b"k2"): b"v2"}
    finally:
        loaded.store.close()
    assert applied == [(1, 3), (2, 3), (3, 3)]
    assert decoded == [r.delta_name for r in results]


def test_a_big_delta_is_applied_a_slice_of_records_at_a_time_in_write_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore makes a delta's records into Python objects a slice at a time (a delta of a million
    records once became a million tuples at once), in write order: a key put, deleted and put again
    across slices ends with its last value, and a clear in the middle removes only what came before."""
    import blobstate.lineage.delta as delta_module
    from blobstate.state.local_copy import open_rocks

    store = new_memory_store()
    driver = Driver(store)
    with open_p(store, tmp_path / "writer", None) as s:
        for i in range(7):
            s.store.put("a", b"k%d" % i, b"first")
        s.store.put("b", b"gone", b"x")
        s.store.delete("a", b"k1")
        s.store.clear("b")
        s.store.put("a", b"k1", b"again")
        s.store.put("b", b"kept", b"y")
        s.store.put("a", b"k2", b"last")
        expected = dump(s)
        first = s.commit()
    driver.commit({0: first}, 1)
    assert expected == {
        **{("a", b"k%d" % i): b"first" for i in range(7)},
        ("a", b"k1"): b"again",
        ("a", b"k2"): b"last",
        ("b", b"kept"): b"y",
    }
    sizes: list[int] = []

    class Spy:
        def __init__(self, inner: RocksStateStore) -> None:
            self.inner = inner

        def apply(self, records: list[object]) -> None:
            sizes.append(len(records))
            self.inner.apply(records)  # type: ignore[arg-type]

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    monkeypatch.setattr(delta_module, "APPLY_SLICE_RECORDS", 3)
    layout = LocalPartitionLayout(tmp_path / "reader", QUERY_ID, OP, 0)
    history = PartitionHistory(CommitCache(CommitLog(store)), OP, 0)
    loaded = catch_up(
        store, layout, layout.working, first.checkpoint_id, lambda p: Spy(open_rocks(p)), history
    )
    try:
        assert sizes == [3, 3, 3, 3, 1]  # 13 records, 3 at a time
        assert loaded.report.records_replayed == 13
        assert dump(loaded.store.inner) == expected
    finally:
        loaded.store.close()
