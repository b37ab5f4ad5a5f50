"""Post-commit cleanup, retention, ``gc --full``, ``verify`` and the ``lineage``/``verify`` commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from lineage_harness import (
    OP,
    Driver,
    FaultyStore,
    InjectedCrash,
    dump,
    forget_process_memory,
    new_memory_store,
    on_tmpfs,
    open_p,
)
from typer.testing import CliRunner

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import delta_name, snapshot_name
from blobstate.snapshot import read_snapshot_index
from blobstate.state.chain import LINEAGE_CACHE
from blobstate.state.errors import LineageError
from blobstate.state.lost import LostCommitError
from blobstate.state.partition import SNAPSHOT_INDEX_CACHE
from blobstate.state.retention import (
    GcRefusedError,
    after_commit,
    cleanup_latest,
    gc_checkpoint,
    referenced_by_retained,
)
from blobstate.state.verify import verify

FAR_FUTURE = 2**40


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """Local directories on tmpfs when there is one: fsync and RocksDB opens are much cheaper there."""
    forget_process_memory()
    with on_tmpfs(tmp_path) as path:
        yield path


class Query:
    """A one-partition query driven version by version, with a plain-dict model of every version."""

    def __init__(self, store: BlobStore, local: Path, *, every: int, retain: int) -> None:
        self.store, self.local, self.every, self.retain = store, local, every, retain
        self.driver = Driver(store, retain=retain)
        self.models: dict[int, dict] = {0: {}}
        self.cids: dict[int, CheckpointId] = {}
        self.version = 0

    def attempt(self, values: dict[bytes, bytes], *, where: Path | None = None):
        committed = self.cids.get(self.version)
        with open_p(self.store, where or self.local, committed, snapshot_every=self.every) as s:
            for k, v in values.items():
                s.store.put("a", k, v)
            model = dict(self.models[self.version])
            model.update({("a", k): v for k, v in values.items()})
            return s.commit(), model

    def step(self, values: dict[bytes, bytes], *, cleanup: bool = True):
        result, model = self.attempt(values)
        self.version += 1
        self.cids[self.version] = result.checkpoint_id
        self.models[self.version] = model
        commit = self.driver.commit({0: result}, self.version)
        if cleanup:
            self.driver.cleanup(commit)
        return result, commit

    def run(self, n: int) -> None:
        for _ in range(n):
            v = self.version + 1
            self.step({b"k%d" % (v % 5): b"v%d" % v, b"n%d" % v: b"x" * 30})

    def restore(self, version: int, where: Path) -> dict:
        with open_p(self.store, where, self.cids[version]) as s:
            assert s.load_rule == "remote"
            return dump(s)


def remaining(store: BlobStore) -> set[str]:
    return set(store.list("state/")) | set(store.list("blobs/"))


def test_after_commit_makes_what_the_version_references_permanent(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path / "a", every=2, retain=3)
    other, _ = q.attempt({b"loser": b"1"}, where=tmp_path / "b")  # an attempt that is never committed
    result, _ = q.step({b"k": b"v"})
    assert not store.has_ttl(result.delta_name)
    assert store.has_ttl(other.delta_name), "an un-chosen attempt's delta must stay pending"
    q.run(1)  # version 2 has a snapshot
    snap = snapshot_name(OP, 0, q.cids[2])
    index = read_snapshot_index(store, snap)
    for name in {snap, *index.present_blob_ids(), delta_name(OP, 0, q.cids[2])}:
        assert not store.has_ttl(name), name
    assert verify(store).problems == []


@pytest.mark.parametrize(("every", "retain"), [(3, 4), (1, 1), (5, 2), (2, 7)])
def test_retention_keeps_exactly_the_retained_versions_restorable(
    tmp_path: Path, every: int, retain: int
) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path / "writer", every=every, retain=retain)
    for _ in range(12):
        q.run(1)
        assert verify(store).problems == []
    for version in range(q.version - retain + 1, q.version + 1):
        assert q.restore(version, tmp_path / f"r{version}") == q.models[version]
    # what remains is what the retained versions reference, and nothing else once TTLs have expired
    store.expire(FAR_FUTURE)
    referenced = referenced_by_retained(store, q.driver.log.read_commit(12))
    assert remaining(store) == referenced
    oldest_needed = min(
        CheckpointId.parse(n.rsplit("/", 1)[1].split(".")[0]).version
        for n in referenced
        if n.startswith("state/")
    )
    assert oldest_needed >= q.version - retain + 1 - every


def test_a_query_that_runs_for_years_caches_its_retained_versions_not_every_batch(tmp_path: Path) -> None:
    """The cleanup after each commit caches the lineage of every retained delta and every snapshot index
    it checked, and drops the entries of what it deletes: the process holds about the retained versions'
    entries however many batches ran, never one per batch."""
    store = new_memory_store()
    every, retain = 3, 4
    q = Query(store, tmp_path, every=every, retain=retain)
    sizes = []
    for _ in range(4):
        q.run(5 * every)
        sizes.append((len(LINEAGE_CACHE), len(SNAPSHOT_INDEX_CACHE)))
    assert sizes == [sizes[0]] * 4, sizes
    lineages, indexes = sizes[0]
    assert 0 < lineages <= retain + every  # the retained versions' deltas, back to their bases
    assert 0 < indexes <= retain // every + 2


def test_a_worker_keeps_one_snapshot_index_per_partition_however_many_snapshots_it_took(
    tmp_path: Path,
) -> None:
    """A task keeps the index of the snapshot it uploaded (the next snapshot's base) and forgets the
    base it replaced: a long-running worker holds one index per partition, not up to the cache's 256."""
    store = new_memory_store()
    q = Query(store, tmp_path, every=2, retain=1000)
    for _ in range(30):
        q.step({b"k": b"v%d" % q.version}, cleanup=False)
    assert len(SNAPSHOT_INDEX_CACHE) == 1
    # The partition moves between two worker processes: every other snapshot is taken by the other one,
    # whose cache this process does not see.
    for round_ in range(30):
        if round_ % 4 >= 2:
            ours = dict(SNAPSHOT_INDEX_CACHE._items)
            SNAPSHOT_INDEX_CACHE._items.clear()
            q.step({b"k": b"v%d" % q.version}, cleanup=False)
            SNAPSHOT_INDEX_CACHE._items.clear()
            SNAPSHOT_INDEX_CACHE._items.update(ours)
        else:
            q.step({b"k": b"v%d" % q.version}, cleanup=False)
    assert len(SNAPSHOT_INDEX_CACHE) == 1


def test_steady_state_cleanup_never_lists_the_bucket(tmp_path: Path) -> None:
    inner = new_memory_store()
    q = Query(inner, tmp_path, every=2, retain=2)
    q.run(4)
    store = FaultyStore(inner)
    store.fail_when = lambda op, name: op == "list"
    q.store, q.driver.store = store, store
    q.driver.log.store = store
    for _ in range(6):
        _, commit = q.step({b"k": b"v%d" % q.version}, cleanup=False)
        q.driver.cleanup(commit)
    assert not [c for c in store.calls if c[0] == "list"]
    assert [c for c in store.calls if c[0] == "delete"], "cleanup deleted nothing"


def test_cleanup_is_idempotent(tmp_path: Path) -> None:
    inner = new_memory_store()
    q = Query(inner, tmp_path, every=2, retain=2)
    q.run(6)
    before = remaining(inner)
    store = FaultyStore(inner)
    commit = q.driver.log.read_commit(q.version)
    for forget in (False, True):
        if forget:
            forget_process_memory()
        stats = after_commit(store, commit)
        assert stats.deleted == []
    assert remaining(inner) == before
    assert verify(inner).problems == []


@pytest.mark.parametrize("crash_after", [1, 2, 3, 5, 8])
def test_a_cleanup_cut_off_part_way_is_finished_by_the_next_one(tmp_path: Path, crash_after: int) -> None:
    inner = new_memory_store()
    q = Query(inner, tmp_path, every=3, retain=2)
    q.run(3)
    reference = new_memory_store()
    r = Query(reference, tmp_path / "ref", every=3, retain=2)
    r.run(3)
    # version 4..8 committed without cleanup, then a cleanup that crashes after a few deletions
    for _ in range(5):
        q.step({b"k": b"v%d" % (q.version + 1)}, cleanup=False)
    store = FaultyStore(inner)
    store.arm(lambda op, name, n: op == "delete" and n >= crash_after)
    commit = q.driver.log.read_commit(q.version)
    with pytest.raises(InjectedCrash):
        after_commit(store, commit)
    forget_process_memory()  # a restart
    assert cleanup_latest(inner) is not None
    assert verify(inner).problems == []
    inner.expire(FAR_FUTURE)
    referenced = referenced_by_retained(inner, q.driver.log.read_commit(q.version))
    assert remaining(inner) == referenced
    for version in (q.version - 1, q.version):
        assert q.restore(version, tmp_path / f"r{version}") == q.models[version]


def test_gc_full_deletes_only_unreferenced_objects_that_are_not_pending(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path, every=2, retain=2)
    q.run(5)
    referenced_before = referenced_by_retained(store, q.driver.log.read_commit(q.version))
    leaked = ["blobs/0/0/" + "ab" * 16, delta_name(OP, 0, CheckpointId(1, "cd" * 16))]
    for name in leaked:
        store.put(name, b"leak")  # permanent and referenced by nothing
    pending = "blobs/0/0/" + "ef" * 16
    store.put(pending, b"in flight", ttl=3600)
    future = delta_name(OP, 0, CheckpointId(99, "12" * 16))
    store.put(future, b"an attempt of a version not committed yet", ttl=3600)
    stats = gc_checkpoint(store, full=True)
    assert sorted(stats.deleted) == sorted(leaked)
    assert store.exists(pending) and store.exists(future)
    assert referenced_before <= remaining(store)
    stats = gc_checkpoint(store, full=True, now=FAR_FUTURE)
    assert pending in stats.expired and not store.exists(pending)
    assert future in stats.expired
    # A permanent object of a version above the newest commit means commits were lost: verify says so,
    # and gc refuses to touch the checkpoint (docs/DESIGN.md "Lost commits").
    lost = delta_name(OP, 0, CheckpointId(99, "34" * 16))
    store.put(lost, b"committed by a commit that is gone")
    assert [p.object for p in verify(store).problems] == ["commits/99.json"]
    with pytest.raises(LostCommitError, match=r"refusing to run gc on .*version 99"):
        gc_checkpoint(store, full=True)
    store.delete(lost)
    assert verify(store).problems == []


def test_gc_full_keeps_every_retained_version(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path, every=2, retain=4)
    q.run(6)
    before = remaining(store)
    assert gc_checkpoint(store, full=True).deleted == []
    assert remaining(store) == before
    for version in range(3, 7):
        assert q.restore(version, tmp_path / f"r{version}") == q.models[version]


def test_verify_names_what_is_wrong(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path, every=3, retain=3)
    q.run(4)
    assert verify(store).problems == [] and verify(store, checksums=True).problems == []
    index = read_snapshot_index(store, snapshot_name(OP, 0, q.cids[3]))
    blob = sorted(index.present_blob_ids())[0]
    data = store.get(blob)
    store.put(blob, data[:-1] + bytes([data[-1] ^ 1]))
    assert verify(store).problems == [], "plain verify does not read blobs (and says so)"
    problems = verify(store, checksums=True).problems
    assert [p.object for p in problems] == [blob] and "CRC-32" in problems[0].message
    assert problems[0].version == 3 and problems[0].uid == q.cids[3].uid
    store.delete(blob)
    problems = verify(store).problems
    assert blob in {p.object for p in problems} and all(p.version == 3 for p in problems)
    store.put(blob, data)
    last = delta_name(OP, 0, q.cids[4])
    good = store.get(last)
    store.put(last, good[:-5], ttl=None)
    problems = verify(store).problems
    assert [p.object for p in problems] == [last] and "bytes where the commit recorded" in problems[0].message
    # The newest commit's own objects still pending: its post-commit cleanup has not run yet, which is
    # information; an older retained version's object still pending is a problem (a cleanup failed).
    store.put(last, good, ttl=60)
    report = verify(store)
    assert report.problems == [] and report.cleanup_pending == [last]
    assert [n for n in report.notes if n.startswith("cleanup pending: 1 objects commits/4.json references")]
    store.put(last, good)
    older = delta_name(OP, 0, q.cids[2])
    store.put(older, store.get(older), ttl=60)
    problems = verify(store).problems
    assert [p.object for p in problems] == [older] and "still pending" in problems[0].message


def test_verify_reports_a_lineage_that_disagrees_with_the_commit_log(tmp_path: Path) -> None:
    store = new_memory_store()
    driver = Driver(store)
    with open_p(store, tmp_path / "a", None) as s:
        s.store.put("a", b"k", b"chosen")
        chosen = s.commit()
    with open_p(store, tmp_path / "b", None) as s:
        s.store.put("a", b"k", b"other")
        other = s.commit()
    driver.cleanup(driver.commit({0: chosen}, 1, retain=5))
    with open_p(store, tmp_path / "b", other.checkpoint_id) as s:  # built on the un-chosen attempt
        bad = s.commit()
    commit = driver.commit({0: bad}, 2, retain=5)
    with pytest.raises(LineageError, match="committed uid " + chosen.checkpoint_id.uid):
        driver.cleanup(commit)  # cleanup refuses a chain through an attempt that was not committed
    problems = verify(store).problems
    assert [p.object for p in problems] == [bad.delta_name]
    assert "committed uid " + chosen.checkpoint_id.uid in problems[0].message


def cli() -> typer.Typer:
    from blobstate.cli import lineage_cmds

    app = typer.Typer()
    lineage_cmds.register(app)
    return app


def test_lineage_and_verify_commands(tmp_path: Path) -> None:
    url = str(tmp_path / "checkpoint")
    store = open_blob_store(url)
    q = Query(store, tmp_path / "local", every=2, retain=3)
    q.run(5)
    runner = CliRunner()
    result = runner.invoke(cli(), ["lineage", url, "--partition", "0", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["latest"] == 5
    rows = data["partitions"][0]["versions"]
    assert [r["version"] for r in rows[:3]] == [5, 4, 3]
    assert [r["uid"] for r in rows[:3]] == [q.cids[v].uid for v in (5, 4, 3)]
    assert rows[1]["snapshot"] is True and rows[0]["snapshot"] is False
    assert rows[1]["snapshot_bytes"] > 0 and rows[0]["delta_bytes"] > 0
    assert rows[0]["restore_from"] == q.cids[4].name + ".snapshot" and rows[0]["deltas_to_replay"] == 1
    text = runner.invoke(cli(), ["lineage", url, "--partition", "0"])
    assert text.exit_code == 0 and q.cids[5].name in text.output

    ok = runner.invoke(cli(), ["verify", url])
    assert ok.exit_code == 0, ok.output
    broken = delta_name(OP, 0, q.cids[5])
    store.delete(broken)
    bad = runner.invoke(cli(), ["verify", url])
    assert bad.exit_code == 1
    assert broken in bad.output


def test_lineage_command_on_an_empty_checkpoint(tmp_path: Path) -> None:
    url = str(tmp_path / "empty")
    Driver(open_blob_store(url))
    result = CliRunner().invoke(cli(), ["lineage", url])
    assert result.exit_code == 0 and "no committed versions" in result.output


# ---------------------------------------------------------------------------------------------- gc
def test_gc_after_a_crash_between_commit_and_cleanup_never_expires_committed_objects(tmp_path: Path) -> None:
    """Finding 4: commits/<v> written, post-commit cleanup never ran, TTLs long past: gc (plain or
    --full) must finish the committed versions' cleanup before it expires anything."""
    for full in (False, True):
        store = new_memory_store()
        q = Query(store, tmp_path / f"w{full}", every=2, retain=2)
        q.run(3)
        q.step({b"k": b"uncleaned"}, cleanup=False)  # the driver died before its cleanup
        q.step({b"k": b"uncleaned too"}, cleanup=False)
        forget_process_memory()
        stats = gc_checkpoint(store, full=full, now=FAR_FUTURE)
        assert stats.ttl_removed > 0
        assert verify(store).problems == []
        for version in (q.version - 1, q.version):
            assert q.restore(version, tmp_path / f"r{full}{version}") == q.models[version]


def test_gc_refuses_a_commit_log_with_a_hole_and_verify_reports_it(tmp_path: Path) -> None:
    """Finding 5: a missing commits/<v>.json between existing ones."""
    store = new_memory_store()
    q = Query(store, tmp_path, every=3, retain=10)
    q.run(6)
    store.delete("commits/3.json")
    before = remaining(store)
    for full in (False, True):
        with pytest.raises(GcRefusedError, match=r"holes.*commits/3\.json"):
            gc_checkpoint(store, full=full, now=FAR_FUTURE)
    assert remaining(store) == before, "gc deleted something from a checkpoint it cannot read completely"
    problems = verify(store).problems
    assert [p.object for p in problems] == ["commits/3.json"] and "hole" in problems[0].message


def test_gc_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    store = new_memory_store()
    store.put("blobs/precious", b"not blobstate's to delete")
    with pytest.raises(GcRefusedError, match="not a query checkpoint"):
        gc_checkpoint(store, full=True, now=FAR_FUTURE)
    assert store.exists("blobs/precious")


def test_gc_full_completes_when_commits_and_their_cleanups_land_while_it_marks(tmp_path: Path) -> None:
    """Finding 6: the query keeps committing (retain 1: each cleanup deletes the previous version's
    objects) while gc --full reads the versions it marks; gc must re-mark, never crash or delete
    what the newest commit references."""
    inner = new_memory_store()
    q = Query(inner, tmp_path, every=1, retain=1)
    q.run(3)
    store = FaultyStore(inner)
    landed: list[str] = []

    def commit_meanwhile(op: str, name: str) -> bool:
        # A commit (and its cleanup) lands at gc's first read of a version's object, at its sweep's
        # listing (of blobs/, after state/: the listing of state/ before the first read is the check
        # for lost commits, blobstate.state.lost), and at its first pending check of a listed object.
        reads_state = op == "get" and name.endswith((".delta", ".snapshot"))
        if (reads_state or (op, name) == ("list", "blobs/") or op == "has_ttl") and op not in landed:
            landed.append(op)
            q.step({b"k": b"meanwhile %d" % len(landed)})
            forget_process_memory()  # no cache hides what the landed cleanup deleted
        return False

    leaked = "blobs/0/0/" + "ab" * 16
    inner.put(leaked, b"permanent and referenced by nothing")
    forget_process_memory()
    store.fail_when = commit_meanwhile
    stats = gc_checkpoint(store, full=True, now=FAR_FUTURE)
    store.fail_when = None
    assert landed == ["get", "list", "has_ttl"] and stats.mark_attempts > 1
    assert stats.deleted == [leaked]
    assert verify(inner).problems == []
    assert q.restore(q.version, tmp_path / "latest") == q.models[q.version]


def _real_store(kind: str, tmp_path: Path) -> BlobStore:
    return new_memory_store() if kind == "memory" else open_blob_store(str(tmp_path / "checkpoint"))


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_gc_completes_when_a_commit_deletes_a_blob_it_is_making_permanent(tmp_path: Path, kind: str) -> None:
    """A commit and its cleanup land while gc finishes the previous commit's cleanup: the newer cleanup
    deletes snapshot blobs gc was about to make permanent. gc marks again from the newer commit."""
    inner = _real_store(kind, tmp_path)
    q = Query(inner, tmp_path / "work", every=1, retain=1)
    q.run(3)
    store = FaultyStore(inner)
    store.io_threads = 1  # one request at a time: the commit lands before gc reaches the other blobs
    landed: list[str] = []

    def commit_meanwhile(op: str, name: str) -> bool:
        if op == "remove_ttl" and name.startswith("blobs/") and not landed:
            landed.append(name)
            q.step({b"k%d" % i: b"meanwhile" for i in range(5)})  # every key changes: new blobs
            forget_process_memory()
        return False

    forget_process_memory()
    store.fail_when = commit_meanwhile
    stats = gc_checkpoint(store, full=True, now=FAR_FUTURE)
    store.fail_when = None
    assert landed and stats.latest_version == q.version == 4
    assert not all(inner.exists(name) for op, name in store.calls if op == "remove_ttl"), (
        "the landed cleanup deleted nothing gc was reading: the test did not interleave"
    )
    assert verify(inner).problems == []
    assert q.restore(q.version, tmp_path / "latest") == q.models[q.version]


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_gc_refuses_naming_a_retained_blob_that_is_really_missing(tmp_path: Path, kind: str) -> None:
    store = _real_store(kind, tmp_path)
    q = Query(store, tmp_path / "work", every=1, retain=1)
    q.run(3)
    index = read_snapshot_index(store, snapshot_name(OP, 0, q.cids[q.version]))
    lost = sorted(index.present_blob_ids())[0]
    store.delete(lost)
    forget_process_memory()
    before = remaining(store)
    for full in (False, True):
        with pytest.raises(GcRefusedError, match=lost):
            gc_checkpoint(store, full=full, now=FAR_FUTURE)
    assert remaining(store) == before


def _pending_states(store: BlobStore) -> dict[str, bool]:
    return {name: store.has_ttl(name) for name in remaining(store)}


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_gc_dry_run_previews_every_step_and_changes_nothing(tmp_path: Path, kind: str) -> None:
    """The newest commit's cleanup never ran (its objects are pending, older versions not yet deleted),
    an attempt was never committed, and a blob is leaked: the dry run reports what gc then does."""
    store = _real_store(kind, tmp_path)
    q = Query(store, tmp_path / "work", every=2, retain=2)
    q.run(4)
    q.step({b"k": b"uncleaned"}, cleanup=False)  # the driver died before its cleanup
    q.attempt({b"k": b"never committed"}, where=tmp_path / "attempt")
    leaked = "blobs/0/0/" + "cd" * 16
    store.put(leaked, b"permanent and referenced by nothing")
    forget_process_memory()
    before = _pending_states(store)
    dry = gc_checkpoint(store, full=True, now=FAR_FUTURE, dry_run=True)
    assert _pending_states(store) == before, "the dry run changed the store"
    forget_process_memory()
    real = gc_checkpoint(store, full=True, now=FAR_FUTURE)
    assert dry.dry_run and not real.dry_run
    assert dry.ttl_pending and dry.ttl_pending <= dry.ttl_removed
    assert dry.cleanup_deleted and dry.expired and leaked in dry.deleted
    preview = (dry.ttl_removed, dry.cleanup_deleted, dry.expired, dry.deleted)
    assert preview == (real.ttl_removed, real.cleanup_deleted, real.expired, real.deleted)


def test_gc_dry_run_command_says_it_is_a_dry_run_and_what_gc_would_clear(tmp_path: Path) -> None:
    from blobstate.cli.main import app

    url = str(tmp_path / "checkpoint")
    q = Query(open_blob_store(url), tmp_path / "work", every=2, retain=2)
    q.run(4)
    q.step({b"k": b"uncleaned"}, cleanup=False)
    forget_process_memory()
    dry = CliRunner().invoke(app, ["gc", url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    forget_process_memory()
    real = CliRunner().invoke(app, ["gc", url])
    assert real.exit_code == 0, real.output
    assert dry.output.startswith("dry run, nothing changed: ")
    cleared = real.output.split("cleared any TTL on ")[1].split()[0]
    assert int(cleared) > 0 and f"would clear any TTL on {cleared} referenced objects" in dry.output


def test_cleanup_reads_each_commit_once_however_many_partitions(tmp_path: Path) -> None:
    inner = new_memory_store()
    partitions = 4
    driver = Driver(inner, num_partitions=partitions, retain=3)
    committed: dict[int, CheckpointId | None] = dict.fromkeys(range(partitions))
    for version in range(1, 7):
        results = {}
        for p in range(partitions):
            with open_p(inner, tmp_path / f"p{p}", committed[p], partition=p, snapshot_every=4) as s:
                s.store.put("a", b"k", b"v%d" % version)
                results[p] = s.commit()
            committed[p] = results[p].checkpoint_id
        commit = driver.commit(results, version)
    forget_process_memory()
    store = FaultyStore(inner)
    after_commit(store, commit)
    reads = [name for op, name in store.calls if op == "get" and name.startswith("commits/")]
    assert reads and len(reads) == len(set(reads)), sorted(reads)
