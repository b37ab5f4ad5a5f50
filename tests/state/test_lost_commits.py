"""A checkpoint whose newest commit was lost is read-only for every writer until an operator decides
(:mod:`blobstate.state.lost`, docs/DESIGN.md "Lost commits"): rescale, gc and gc --full refuse it and
change nothing, so the commit can be put back; accepting the loss lets them continue; readers say it
first; a running query's commit is never taken for a lost one; and ``verify`` calls the newest commit's
cleanup not run yet information. Checkpoints are real ones built without Spark (the rescale tests'
``run_batches``) and rescaled in process."""

from __future__ import annotations

import ast
import inspect
import json
import shutil
import sys
import textwrap
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
from lineage_harness import OP, Driver, FaultyStore, forget_process_memory, new_memory_store, open_p

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rescale"))
import rescale_checkpoints
from rescale_checkpoints import batches, run_batches

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.layout import commit_name
from blobstate.lineage.commitlog import CommitLog, IncompleteCommitLogError
from blobstate.reader.checkpoint import open_version, restored_partition
from blobstate.reader.partition import inspect_partition, restore_partition
from blobstate.rescale import rescale_checkpoint
from blobstate.state.lost import (
    AcceptanceFormatError,
    AcceptLossError,
    LostCommitError,
    LostCommitWarning,
    accept_loss,
    check_not_lost,
    parse_acceptance,
    read_acceptances,
    scan_for_loss,
    scan_for_writing,
)
from blobstate.state.retention import cleanup_latest, gc_checkpoint
from blobstate.state.verify import verify

FAR_FUTURE = 4_000_000_000.0
"""Past every pending TTL."""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 versions with 2 partitions, then an in-process rescale to 3 partitions: version 5."""
    root = tmp_path_factory.mktemp("lost")
    url = root / "ckpt"
    run_batches(str(url), batches(4, seed=2), root / "local", 2)
    rescale_checkpoint(None, str(url), 3)
    return url


@pytest.fixture
def rescaled(template: Path, tmp_path: Path) -> str:
    """A fresh copy of the template (a local store is a directory, its TTLs files beside the objects)."""
    forget_process_memory()
    shutil.copytree(template, tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


def lose(url: str, version: int) -> bytes:
    """Delete ``commits/<version>.json``, as a lifecycle rule or a mistaken ``rm`` would; its bytes."""
    with open_blob_store(url) as store:
        data = store.get(commit_name(version))
        store.delete(commit_name(version))
    forget_process_memory()
    return data


def put_back(url: str, version: int, data: bytes) -> None:
    with open_blob_store(url) as store:
        assert store.put_if_absent(commit_name(version), data)
    forget_process_memory()


def everything(url: str) -> dict[str, bytes]:
    with open_blob_store(url) as store:
        return {name: store.get(name) for name in store.list("")}


def records(url: str, version: int) -> Counter[tuple[str, bytes, bytes]]:
    """Every record of every partition at ``version`` (``$meta`` aside), as a multiset."""
    out: Counter[tuple[str, bytes, bytes]] = Counter()
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        for p in range(len(checkpoint.commit.checkpoints["0"])):
            with restored_partition(store, checkpoint, "0", p) as rocks:
                for cf in rocks.column_families():
                    if cf != "$meta":
                        out.update((cf, bytes(k), bytes(v)) for k, v in rocks.items(cf))
    return out


def lost_problems(url: str) -> list[str]:
    with open_blob_store(url) as store:
        return [str(p) for p in verify(store).problems if "newer commits were lost" in p.message]


# ---------------------------------------------------------------------------------------------- writers
def test_rescale_refuses_a_checkpoint_whose_newest_commit_was_lost(rescaled: str) -> None:
    """Before, the rescale of version 4 committed itself as version 5, the lost commit's number, and
    verify then said ok: the lost commit could never be put back."""
    lost = lose(rescaled, 5)
    assert lost_problems(rescaled), "verify reports the lost commit"
    before = everything(rescaled)
    for partitions in (3, 4):
        with pytest.raises(LostCommitError) as caught:
            rescale_checkpoint(None, rescaled, partitions)
        message = str(caught.value)
        assert "\n" not in message
        assert f"refusing to rescale {Path(rescaled)}" in message
        assert "the newest readable version is 4" in message and "version 5" in message
        assert "state/0/" in message and "_" in message  # names the evidence
        assert "put commits/5.json back from a backup" in message
        assert f"blobstate accept-loss {Path(rescaled)} --version 4" in message
        assert caught.value.newest == 4 and caught.value.lost == [5]
    assert everything(rescaled) == before, "a refused rescale writes nothing"
    put_back(rescaled, 5, lost)
    with open_blob_store(rescaled) as store:
        assert verify(store, checksums=True).problems == []


@pytest.mark.parametrize("how", ["gc", "gc --full", "gc --full --dry-run"])
def test_gc_refuses_and_the_lost_rescale_stays_restorable(rescaled: str, how: str) -> None:
    """Before, gc --full swept the lost rescale's snapshot blobs (permanent and referenced by no
    remaining commit): putting the commit back then left an unrestorable snapshot."""
    expected = records(rescaled, 5)
    assert expected == records(rescaled, 4)  # a rescale moves records, it changes none
    lost = lose(rescaled, 5)
    before = everything(rescaled)
    with open_blob_store(rescaled) as store, pytest.raises(LostCommitError, match="refusing to run gc on"):
        gc_checkpoint(store, full="--full" in how, dry_run="--dry-run" in how, now=FAR_FUTURE)
    assert everything(rescaled) == before
    put_back(rescaled, 5, lost)
    with open_blob_store(rescaled) as store:
        assert verify(store, checksums=True).problems == []
        gc_checkpoint(store, full=True, now=FAR_FUTURE)
        assert verify(store, checksums=True).problems == []
    assert records(rescaled, 5) == expected


def test_a_checkpoint_without_any_commit_left_is_refused_too(rescaled: str) -> None:
    with open_blob_store(rescaled) as store:
        for name in store.list("commits/"):
            store.delete(name)
        forget_process_memory()
        (problem,) = verify(store).problems
        assert problem.object == "commits/" and "was commits/ lost?" in problem.message
        with pytest.raises(LostCommitError, match="the newest readable version is 0"):
            gc_checkpoint(store, full=True)
        with pytest.raises(LostCommitError):
            check_not_lost(store, action="start a query on")


def test_accepting_the_loss_lets_writers_continue_and_a_later_loss_is_refused_again(rescaled: str) -> None:
    lose(rescaled, 5)
    with open_blob_store(rescaled) as store:
        with pytest.raises(AcceptLossError, match=r"the newest readable version of .* is 4, not 5"):
            accept_loss(store, 5)
        assert read_acceptances(store) == []
        acceptance, after = accept_loss(store, 4, reason="no backup of commits/5.json")
        assert after.lost == () and after.accepted_versions == [5]
        assert acceptance.version == 4 and sorted(acceptance.lost) == [5] and len(acceptance.lost[5]) == 3
        assert read_acceptances(store) == [acceptance]
        assert parse_acceptance(store.get(acceptance.name), acceptance.name) == acceptance
        with pytest.raises(AcceptLossError, match=r"nothing to accept.*accepted already"):
            accept_loss(store, 4)
        report = verify(store)
        assert report.problems == [] and any("was accepted" in n for n in report.notes)
        gc_checkpoint(store, full=True, now=FAR_FUTURE)
    # Writers continue from version 4: the rescale commits version 5 anew (the lost one's number).
    done = rescale_checkpoint(None, rescaled, 3)
    assert (done.previous_version, done.version) == (4, 5)
    assert records(rescaled, 5) == records(rescaled, 4)
    with open_blob_store(rescaled) as store:
        assert verify(store, checksums=True).problems == []
        assert check_not_lost(store, action="rescale").accepted == ()  # below the newest commit now
    # The new version 5 is lost in turn: its attempts are not the accepted ones.
    lose(rescaled, 5)
    with pytest.raises(LostCommitError, match="version 5"):
        rescale_checkpoint(None, rescaled, 2)
    assert lost_problems(rescaled)


def test_a_changed_acceptance_record_is_refused(rescaled: str) -> None:
    lose(rescaled, 5)
    with open_blob_store(rescaled) as store:
        acceptance, _ = accept_loss(store, 4)
        data = store.get(acceptance.name)
        store.put(acceptance.name, data.replace(b'"version": 4', b'"version": 3'))
        with pytest.raises(AcceptanceFormatError, match=acceptance.name):
            check_not_lost(store, action="rescale")


# ---------------------------------------------------------------------------------------------- readers
def test_readers_say_first_that_the_newest_commit_was_lost(
    rescaled: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, inspect, read_state and report presented version 4 as the newest without a word."""
    lose(rescaled, 5)
    info = inspect_partition(rescaled, 0)
    assert info["version"] == 4 and len(info["warnings"]) == 1
    assert (
        "the newest commits of" in info["warnings"][0]
        and "version 4 is the newest readable" in info["warnings"][0]
    )
    restored = restore_partition(rescaled, tmp_path / "restored", 0, version=3)
    assert restored["version"] == 3 and restored["warnings"] == info["warnings"]
    from blobstate import read_state

    spark = mock.MagicMock()
    with pytest.warns(LostCommitWarning, match="version 4 is the newest readable version"):
        read_state(spark, rescaled, state_var="totals")
    from blobstate.cli.main import main

    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit) as exited:
        main(["report", rescaled, "--out", str(tmp_path / "report"), "--json", "--no-state-sizes"])
    assert exited.value.code in (None, 0)
    report = json.loads(capsys.readouterr().out)
    assert len(report["warnings"]) == 1 and "version 4 is the newest readable" in report["warnings"][0]
    with open_blob_store(rescaled) as store:
        accept_loss(store, 4)
    assert inspect_partition(rescaled, 0)["warnings"] == []


def test_readers_say_the_commit_log_has_holes(rescaled: str) -> None:
    lose(rescaled, 4)
    with open_blob_store(rescaled) as store:
        (warning,) = scan_for_loss(store).warnings()
    assert "has holes: commits/4.json missing" in warning


# ------------------------------------------------------------------------------------ a running query
class CommitWhileListing(FaultyStore):
    """Runs one more batch (commit and cleanup, as a running query does) the first time ``state/`` is
    listed: the check lists ``commits/`` before and sees that batch's permanent objects after."""

    def __init__(self, inner: BlobStore, url: str, local: Path) -> None:
        super().__init__(inner)
        self.url, self.local, self.landed = url, local, False

    def _list(self, prefix: str) -> list[str]:
        if prefix == "state/" and not self.landed:
            self.landed = True
            run_batches(self.url, batches(6, seed=2)[5:], self.local, 3)
        return super()._list(prefix)


def test_a_commit_landing_while_the_check_lists_is_no_loss(rescaled: str, tmp_path: Path) -> None:
    for check in ("check", "verify", "gc"):
        store = CommitWhileListing(open_blob_store(rescaled), rescaled, tmp_path / f"local-{check}")
        newest = CommitLog(store).latest_version()
        if check == "check":
            found = check_not_lost(store, action="start a query on")
            assert found.newest == newest + 1 and found.lost == ()
        elif check == "verify":
            assert [str(p) for p in verify(store).problems if "lost" in p.message] == []
        else:
            gc_checkpoint(store, full=True)
        assert store.landed and CommitLog(store).latest_version() == newest + 1


def test_the_query_start_checks_right_after_its_listing_of_commits() -> None:
    """transform_with_state starts from scan_for_writing (its listing of commits/, checked for a loss, in
    the start-up's open_checkpoint) before anything else reads or writes the checkpoint (a rescale at
    start, the start-up cleanup); Spark is needed to run it."""
    from blobstate.engine import query, startup

    def statements(function: object) -> list[str]:
        body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]  # type: ignore[arg-type]
        assert isinstance(body, ast.FunctionDef)
        kinds = (ast.Assign, ast.Expr, ast.ImportFrom, ast.If)
        return [ast.unparse(node) for node in body.body if isinstance(node, kinds)]

    calls = statements(startup.open_checkpoint)
    scan = calls.index("scan, _ = scan_for_writing(store, action='start a query on')")
    assert any(c.startswith("num_partitions, rescaled = _layout_at_start(") for c in calls[scan + 1 :])
    # transform_with_state opens the checkpoint before the start-up cleanup and anything after it
    steps = statements(query.transform_with_state)
    opened = next(i for i, c in enumerate(steps) if c.startswith("opened = open_checkpoint("))
    assert any(c.startswith("started_cleanup = cleanup_latest(") for c in steps[opened + 1 :])
    assert not any("cleanup_latest(" in c or "_layout_at_start(" in c for c in steps[:opened])


# ---------------------------------------------------------------------------------------------- verify
def _batches_without_cleanup(url: str, local: Path, data: list[list[tuple[str, int]]], n: int) -> None:
    """Run ``data`` (``n`` partitions), committing each batch without its post-commit cleanup, as a query
    whose cleanup runs in the background shows between a commit and its cleanup."""
    with mock.patch.object(rescale_checkpoints, "after_commit", lambda *a, **k: None):
        run_batches(url, data, local, n)


def test_verify_calls_the_newest_commits_cleanup_not_run_yet_information(tmp_path: Path) -> None:
    """Before, verify of a running query sometimes reported "committed but still pending: it will
    expire" and exited 1, between a commit and its post-commit cleanup."""
    url = str(tmp_path / "ckpt")
    data = batches(6, seed=4)
    run_batches(url, data[:4], tmp_path / "local", 2)
    _batches_without_cleanup(url, tmp_path / "local", data[4:5], 2)
    with open_blob_store(url) as store:
        report = verify(store)
        assert report.problems == [], [str(p) for p in report.problems]
        assert report.cleanup_pending and report.cleanup_commits == [5]
        (note,) = report.notes
        assert note.startswith("cleanup pending: ") and "objects commits/5.json references" in note
        assert "has not run yet" in note
    pending_after_5 = set(report.cleanup_pending)
    # One more commit without its cleanup: what commit 5 brought (its deltas, the snapshots of version 4
    # it names late, their blobs) should have been made permanent by then (the next batch waits for the
    # cleanup): a problem; what commit 6 brought is information.
    _batches_without_cleanup(url, tmp_path / "local", data[5:6], 2)
    with open_blob_store(url) as store:
        report = verify(store)
        assert {p.object for p in report.problems} == pending_after_5
        assert all("still pending" in p.message for p in report.problems)
        assert report.cleanup_pending and report.cleanup_commits == [6]
        gc_checkpoint(store)
        report = verify(store)
        assert report.problems == [] and report.notes == []


def test_verify_right_after_a_rescale_commit_is_ok_with_a_note(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    run_batches(url, batches(4, seed=2), tmp_path / "local", 2)

    class Died(Exception):
        pass

    def die_after_commit(step: str) -> None:
        if step == "committed":
            raise Died(step)

    with pytest.raises(Died):
        rescale_checkpoint(None, url, 3, fault=die_after_commit)
    with open_blob_store(url) as store:
        report = verify(store)
        assert report.problems == [] and report.cleanup_pending and report.cleanup_commits == [4, 5]
    assert rescale_checkpoint(None, url, 3).already
    with open_blob_store(url) as store:
        report = verify(store)
        assert report.problems == [] and report.notes == []


# ------------------------------------------------- a lost commit's cleanup: pruned commits, deleted versions
def _snapshot_every_batch(versions: int, local: Path, retain: int = 2) -> BlobStore:
    """``versions`` commits of one partition with a snapshot each and ``min_versions_to_retain``
    ``retain``, each cleaned up: the steady state of a checkpoint, where each commit's cleanup deletes the
    version that left its retained window and prunes the commits below its horizon. Partition 0's value
    of ``k`` at version ``v`` is ``b"<v>"``."""
    store = new_memory_store()
    driver = Driver(store, retain=retain)
    committed = None
    for version in range(1, versions + 1):
        with open_p(store, local, committed, snapshot_every=1) as state:
            state.store.put("a", b"k", b"%d" % version)
            result = state.commit()
        driver.cleanup(driver.commit({0: result}, version))
        committed = result.checkpoint_id
    forget_process_memory()
    return store


def _load(store: BlobStore, local: Path) -> bytes | None:
    """Partition 0's value of ``k`` at the newest commit, loaded from the blob store alone."""
    shutil.rmtree(local, ignore_errors=True)
    forget_process_memory()
    committed = CommitLog(store).latest_commit()
    assert committed is not None
    with open_p(store, local, committed.checkpoint_id(OP, 0)) as state:
        return state.store.get("a", b"k")


def test_a_lost_commit_whose_cleanup_pruned_commits_is_refused_as_lost_and_can_be_accepted(
    tmp_path: Path,
) -> None:
    store = _snapshot_every_batch(6, tmp_path / "local")
    log = CommitLog(store)
    assert (log.read_commit(5).horizon, log.read_commit(6).horizon) == (3, 4)
    assert not store.exists(commit_name(3)), "commit 6's cleanup pruned commits/3.json"
    store.delete(commit_name(6))
    forget_process_memory()
    # Every writer names the lost commit and the way out, not the hole its cleanup left below it.
    with pytest.raises(LostCommitError, match=r"commits/6\.json.*accept-loss"):
        scan_for_writing(store, action="start a query on")
    with pytest.raises(LostCommitError, match=r"commits/6\.json"):
        gc_checkpoint(store, full=True, now=FAR_FUTURE)
    acceptance, after = accept_loss(store, 5)
    assert (acceptance.version, acceptance.horizon, after.lost) == (5, 4, ())
    forget_process_memory()
    scan, _ = scan_for_writing(store, action="start a query on")
    assert (scan.latest, scan.newest.retained_from, scan.newest.horizon, scan.holes) == (5, 5, 4, [])
    cleanup_latest(store, scan)
    assert verify(store).problems == []
    assert _load(store, tmp_path / "fresh") == b"5"
    # The query continues: the next commit takes the lost one's number and retains from version 5 on.
    driver = Driver(store, retain=2)
    with open_p(store, tmp_path / "fresh", scan.newest.checkpoint_id(OP, 0), snapshot_every=1) as state:
        state.store.put("a", b"k", b"again")
        result = state.commit()
    driver.cleanup(commit := driver.commit({0: result}, 6))
    assert (commit.retained_from, commit.horizon) == (5, 4)
    gc_checkpoint(store, full=True, now=FAR_FUTURE)
    assert verify(store).problems == [] and _load(store, tmp_path / "fresh2") == b"again"


def test_after_accepting_a_loss_the_query_starts(tmp_path: Path) -> None:
    """The lost commit 3's cleanup deleted version 1, which commit 2 still retains: after the acceptance
    version 2 alone is retained, and start-up, gc and verify agree."""
    store = _snapshot_every_batch(3, tmp_path / "local")
    assert CommitLog(store).read_commit(3).retained_from == 2
    assert CommitLog(store).read_commit(2).retained_from == 1
    store.delete(commit_name(3))
    forget_process_memory()
    accept_loss(store, 2)
    forget_process_memory()
    scan, _ = scan_for_writing(store, action="start a query on")
    assert scan.newest.retained_from == 2
    cleanup_latest(store, scan)
    gc_checkpoint(store, now=FAR_FUTURE)
    report = verify(store)
    assert report.problems == [] and report.retained_from == 2
    assert _load(store, tmp_path / "fresh") == b"2"


def test_accepting_a_loss_refuses_when_the_readable_version_was_deleted_too(tmp_path: Path) -> None:
    """With ``min_versions_to_retain`` 1 and a snapshot in the lost commit, its cleanup deleted all of
    version 2: the loss cannot be accepted at 2 (only putting commits/3.json back helps), and nothing is
    written."""
    store = _snapshot_every_batch(3, tmp_path / "local", retain=1)
    saved = store.get(commit_name(3))
    store.delete(commit_name(3))
    forget_process_memory()
    before = sorted(store.list(""))
    with pytest.raises(AcceptLossError, match=r"version 2: it is not restorable.*commits/3\.json back"):
        accept_loss(store, 2)
    assert sorted(store.list("")) == before and read_acceptances(store) == []
    assert store.put_if_absent(commit_name(3), saved)
    forget_process_memory()
    assert verify(store).problems == [] and _load(store, tmp_path / "fresh") == b"3"


def test_accepting_a_loss_refuses_a_hole_that_no_pruning_made(tmp_path: Path) -> None:
    """A commit missing above a present one (not a pruned prefix) is damage: restore it."""
    store = new_memory_store()
    driver = Driver(store, retain=10)
    committed = None
    for version in range(1, 6):
        with open_p(store, tmp_path / "local", committed) as state:
            state.store.put("a", b"k", b"%d" % version)
            result = state.commit()
        driver.cleanup(driver.commit({0: result}, version))
        committed = result.checkpoint_id
    store.delete(commit_name(5))
    store.delete(commit_name(3))
    forget_process_memory()
    with pytest.raises(IncompleteCommitLogError, match=r"commits/3\.json"):
        accept_loss(store, 4)
    assert read_acceptances(store) == []


def test_an_acceptance_changes_only_the_commit_it_continued_from(tmp_path: Path) -> None:
    """Commit 4 is lost and accepted at 3, then commit 3 too (accepted at 2): the first acceptance, of the
    lost commit 3, must not shrink the window of the new commit 3 that took its number."""
    store = _snapshot_every_batch(4, tmp_path / "local", retain=3)
    for lost in (4, 3):
        store.delete(commit_name(lost))
        forget_process_memory()
        accept_loss(store, lost - 1)
    forget_process_memory()
    scan, _ = scan_for_writing(store, action="start a query on")
    assert (scan.latest, scan.newest.retained_from) == (2, 2)
    cleanup_latest(store, scan)
    driver = Driver(store, retain=3)
    with open_p(store, tmp_path / "fresh", scan.newest.checkpoint_id(OP, 0), snapshot_every=1) as state:
        state.store.put("a", b"k", b"again")
        result = state.commit()
    driver.cleanup(driver.commit({0: result}, 3))
    forget_process_memory()
    newest = CommitLog(store).scan().newest
    assert (newest.version, newest.retained_from) == (3, 2), "the acceptance of the lost commit 3 applied"
    assert verify(store).problems == [] and _load(store, tmp_path / "fresh2") == b"again"
