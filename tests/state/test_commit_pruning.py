"""The bounded commit log: commits below a durable commit's horizon are pruned after its cleanup, a
pruned prefix is not a hole, and a gap from the horizon up still is, for verify, gc and start-up."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from lineage_harness import (
    Driver,
    FaultyStore,
    InjectedCrash,
    dump,
    forget_process_memory,
    new_memory_store,
    on_tmpfs,
    open_p,
)
from test_retention import Query

from blobstate.cli.lineage_cmds import VersionNotCommittedError, collect_versions
from blobstate.layout import commit_name
from blobstate.lineage.commitlog import (
    Commit,
    CommitLog,
    CommitLogFormatError,
    IncompleteCommitLogError,
    content_digest,
)
from blobstate.report.metrics import load_batch_metrics
from blobstate.state.retention import GcRefusedError, cleanup_latest, declared_horizon, gc_checkpoint
from blobstate.state.verify import verify

FAR_FUTURE = 2**40


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    forget_process_memory()
    with on_tmpfs(tmp_path) as path:
        yield path


def commits(store) -> list[int]:
    return CommitLog(store).versions()


@pytest.mark.parametrize(("every", "retain"), [(2, 3), (1, 1), (5, 2), (3, 10)])
def test_the_commit_log_is_bounded_and_every_retained_version_restores(
    tmp_path: Path, every: int, retain: int
) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path / "a", every=every, retain=retain)
    q.run(60)
    newest = q.driver.log.read_commit(60)
    kept = commits(store)
    # A commit's horizon is the oldest base its retained versions load from, so the log holds at most
    # the retained versions and the snapshot interval below them (plus the commit the cleanup of the
    # newest one will prune).
    assert len(kept) <= retain + every + 1, kept
    assert kept == list(range(kept[0], 61)) and kept[0] <= newest.horizon
    assert verify(store).problems == []
    for version in range(newest.retained_from, 61):
        assert q.restore(version, tmp_path / f"fresh-{version}") == q.models[version]
    gc_checkpoint(store, full=True, now=FAR_FUTURE)
    assert commits(store) == list(range(newest.horizon, 61))
    assert verify(store).problems == []


def test_a_crash_while_pruning_leaves_commits_the_next_cleanup_prunes(tmp_path: Path) -> None:
    store = FaultyStore(new_memory_store())
    q = Query(store, tmp_path / "a", every=1, retain=2)
    q.driver = Driver(store, retain=2)
    q.run(6)
    before = commits(store)
    result, _ = q.attempt({b"k": b"v"})
    commit = q.driver.commit({0: result}, 7)
    q.version, q.cids[7] = 7, result.checkpoint_id
    q.models[7] = {**q.models[6], ("a", b"k"): b"v"}
    store.arm(lambda op, name, n: op == "delete" and name.startswith("commits/"))
    with pytest.raises(InjectedCrash):
        q.driver.cleanup(commit)
    store.arm(None)
    forget_process_memory()
    assert commits(store) == [*before, 7]  # nothing pruned: the crash hit the first (oldest) deletion
    assert verify(store).problems == []
    stats = cleanup_latest(store)
    assert stats is not None and stats.commits_pruned == [v for v in before if v < commit.horizon]
    assert commits(store) == list(range(commit.horizon, 8))
    with open_p(store, tmp_path / "fresh", q.cids[7]) as state:
        assert dump(state) == q.models[7]


def test_gc_dry_run_lists_the_commits_it_would_prune_and_gc_prunes_exactly_those(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from blobstate.blobstore import open_blob_store
    from blobstate.cli.main import app

    url = str(tmp_path / "checkpoint")
    store = open_blob_store(url)
    q = Query(store, tmp_path / "work", every=1, retain=2)
    q.run(6)
    _, commit = q.step({b"k": b"v"}, cleanup=False)  # the driver stopped before the commit's cleanup
    before = commits(store)
    doomed = [v for v in before if v < commit.horizon]
    assert doomed
    forget_process_memory()
    assert gc_checkpoint(store, dry_run=True).commits_pruned == doomed
    forget_process_memory()
    dry = CliRunner().invoke(app, ["gc", url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"prune {len(doomed)} commit" in dry.output and commit_name(doomed[0]) in dry.output, dry.output
    assert commits(store) == before
    forget_process_memory()
    assert gc_checkpoint(store).commits_pruned == doomed
    assert commits(store) == list(range(commit.horizon, commit.version + 1))


def test_pruning_deletes_oldest_first_so_a_walk_from_the_horizon_finds_what_is_left() -> None:
    store = new_memory_store()
    log = CommitLog(store)
    for v in range(1, 8):
        store.put(commit_name(v), b"{}")
    deleted: list[str] = []
    original = store.delete_if_exists

    def delete(name: str) -> bool:
        deleted.append(name)
        if len(deleted) == 3:
            raise InjectedCrash(name)
        return original(name)

    store.delete_if_exists = delete  # type: ignore[method-assign]
    with pytest.raises(InjectedCrash):
        log.prune(6)
    assert deleted == [commit_name(1), commit_name(2), commit_name(3)]
    assert log.versions() == [3, 4, 5, 6, 7]
    store.delete_if_exists = original  # type: ignore[method-assign]
    assert log.prune(6) == [3, 4, 5]
    assert log.versions() == [6, 7]


def _plant(store, version: int) -> None:
    store.delete(commit_name(version))
    forget_process_memory()


def test_a_pruned_prefix_is_not_a_hole_but_a_gap_in_the_retained_window_is(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path / "a", every=2, retain=3)
    q.run(20)
    newest = q.driver.log.read_commit(20)
    assert newest.horizon > 1 and commits(store)[0] >= newest.horizon - 1
    assert verify(store).problems == []
    assert CommitLog(store).complete_versions() == list(range(newest.horizon, 21))
    assert cleanup_latest(store) is not None
    gc_checkpoint(store, full=True, now=FAR_FUTURE)
    summary, rows = load_batch_metrics(store, state_sizes=False)
    assert summary.missing == [] and [r.version for r in rows] == list(range(newest.horizon, 21))
    with pytest.raises(VersionNotCommittedError, match=f"was pruned: .* below {newest.horizon}"):
        collect_versions(store, version=1)
    assert [r.version for r in collect_versions(store, limit=5)] == [20, 19, 18, 17, 16]

    hole = newest.horizon + 1
    _plant(store, hole)
    problems = [str(p) for p in verify(store).problems]
    assert problems and all(commit_name(hole) in p for p in problems), problems
    assert "hole" in problems[0] and f"{newest.horizon}..20" in problems[0]
    with pytest.raises(GcRefusedError, match=re.escape(commit_name(hole))):
        gc_checkpoint(store, full=True, now=FAR_FUTURE)
    with pytest.raises(IncompleteCommitLogError, match=re.escape(commit_name(hole))):
        cleanup_latest(store)
    summary, _ = load_batch_metrics(store, state_sizes=False)
    assert summary.missing == [hole]


def test_a_checkpoint_without_horizons_keeps_every_commit_and_calls_any_gap_a_hole(tmp_path: Path) -> None:
    """Commits of format 2 have no horizon: their log was never pruned, so a gap anywhere is a hole."""
    store = new_memory_store()
    q = Query(store, tmp_path / "a", every=2, retain=2)
    for _ in range(6):
        q.run(1)
        q.driver.needed_from = 0  # the driver never learns a horizon: every commit declares 1
    assert commits(store) == [1, 2, 3, 4, 5, 6]
    _plant(store, 1)
    assert [p.object for p in verify(store).problems] == [commit_name(1)]
    with pytest.raises(IncompleteCommitLogError, match=re.escape(commit_name(1))):
        cleanup_latest(store)


def test_the_horizon_never_goes_down_nor_above_retained_from() -> None:
    class Previous:
        horizon = 7

    assert declared_horizon(None, 0, 5) == 1
    assert declared_horizon(None, 4, 5) == 4
    assert declared_horizon(None, 9, 5) == 5
    assert declared_horizon(Previous(), 3, 9) == 7
    assert declared_horizon(Previous(), 8, 9) == 8


def test_a_commit_names_a_bad_horizon(tmp_path: Path) -> None:
    store = new_memory_store()
    q = Query(store, tmp_path / "a", every=2, retain=3)
    q.run(4)
    log = CommitLog(store)
    with pytest.raises(ValueError, match=re.escape("horizon 4 must be in 1..2")):
        Commit(
            version=5, checkpoints={}, writer="w", objects={}, retained_from=2, horizon=4
        )  # fmt: skip
    obj = json.loads(store.get(commit_name(4)))
    cases = ((obj["retained_from"] + 1, "is above the commit's retained_from"), (None, "missing"))
    for bad, problem in cases:
        changed = {k: v for k, v in obj.items() if k != "horizon"}
        if bad is not None:
            changed["horizon"] = bad
        changed["sha256"] = content_digest(changed)
        store.delete(commit_name(4))
        store.put(commit_name(4), json.dumps(changed).encode())
        with pytest.raises(CommitLogFormatError, match=re.escape(problem)):
            log.read_commit(4)
