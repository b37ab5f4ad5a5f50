"""Model-based randomized test: seeded histories of writes, commits, aborted and duplicate attempts,
a second driver racing for the same version, ``gc``, ``gc --full`` and ``verify`` runs, crashes at every
step of a commit and of gc, and restarts, checked against a plain-dict model.

Each history drives one partition through a real blob store wrapped by a fault injector, with tasks on
three "executors" (local directories) and a driver that commits through the real commit log and runs the
real post-commit cleanup. A crash is injected by raising :class:`InjectedCrash` at the n-th mutating blob
store call of a step -- the delta upload, snapshot blob and index uploads, the commit log write, TTL
removals or deletions of the cleanup or of gc -- after which the "process" is gone: open partitions are
dropped, process memory is forgotten, executor directories are kept or wiped, and the driver restarts
(with or without its start-up cleanup: an operator may run ``gc`` on the checkpoint of a query that is
not running). ``gc`` runs with TTLs long expired, so it would destroy anything committed it wrongly
expires. After every step:

* every load returns exactly the model of the committed version (never an un-chosen attempt's state);
* ``verify`` finds every retained version restorable (all objects present, intact and, unless a
  post-commit cleanup is still owed, permanent), and every retained version restores exactly (from
  an empty local directory, so from the blob store);
* at the end, after TTL expiry, exactly the objects the retained versions reference remain, and
  exactly the commits from the newest commit's horizon up (pruning, with its own crash points, left
  nothing a later run could not finish);
* a commit then deleted from the retained window is a hole that ``verify``, ``gc`` and start-up name.

A second set of histories (``test_random_history_with_lost_commits``, a quarter as many) adds one
more event: at a random point after a commit and its post-commit cleanup, the newest commit object
``commits/<v>.json`` is deleted (lost), as a lifecycle rule or a mistaken ``rm`` would. Every writer
(an in-process rescale, ``gc`` plain, ``--full`` and ``--dry-run``, a query's start) then refuses with
``LostCommitError`` and changes nothing, ``verify`` reports the loss, and the operator either puts the
commit back byte for byte (everything is as before) or accepts the loss at the newest readable version
(the model drops the lost version and every version below the readable one, which the lost commit's
cleanup was free to delete; the next commit takes the lost one's number). Acceptance is refused exactly
when it must be: only when the readable version was outside the lost commit's retained window (and its
cleanup deleted part of it), after which the commit is put back. These events draw from their own
random generator, so a history runs exactly as its twin without them until its first loss.

The same histories also run on the real S3 backend (the moto server) and the real Azure backend
(azurite), each behind a proxy that cuts answers at random bytes (status line, headers or body) besides
the injected crashes; every cut is retried within the store's attempts.

``BLOBSTATE_CRASH_SEEDS=<n>`` runs more histories on memory and local stores (the long run: 2000; with
lost commits ``n // 4``);
``BLOBSTATE_SERVER_CRASH_SEEDS=<n>`` on each server (default 10 on S3, 4 on the slower azurite), cutting
each answer with probability ``BLOBSTATE_CUT_CHANCE`` (default 0.05);
``BLOBSTATE_SERVER_CRASH_SEED_START=<s>`` makes those seeds ``s`` to ``s + n - 1`` (default 0), so a long
run can be split into shards over distinct seeds.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lineage_harness import (
    CFS,
    Driver,
    FaultyStore,
    InjectedCrash,
    apply_model,
    dump,
    forget_process_memory,
    new_memory_store,
    on_tmpfs,
    open_p,
)

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import commit_name
from blobstate.lineage.commitlog import CommitConflictError, CommitLog, IncompleteCommitLogError
from blobstate.rescale import rescale_checkpoint
from blobstate.state.lost import AcceptLossError, LostCommitError, accept_loss, scan_for_writing
from blobstate.state.retention import (
    GcRefusedError,
    cleanup_latest,
    gc_checkpoint,
    referenced_by_retained,
)
from blobstate.state.verify import verify
from faultproxy import FaultProxy

SEEDS = int(os.environ.get("BLOBSTATE_CRASH_SEEDS", "200"))
LOST_SEEDS = SEEDS // 4
"""Histories with lost commits: a quarter as many (50 by default, 500 in the long run), each costing
about what a history without them costs."""
SERVER_DEFAULTS = {"s3": 10, "azure": 4}  # azurite answers about half as fast as moto
SERVER_SEEDS = {
    kind: int(os.environ.get("BLOBSTATE_SERVER_CRASH_SEEDS", default))
    for kind, default in SERVER_DEFAULTS.items()
}
SERVER_SEED_START = int(os.environ.get("BLOBSTATE_SERVER_CRASH_SEED_START", "0"))
CUT_CHANCE = float(os.environ.get("BLOBSTATE_CUT_CHANCE", "0.05"))
FAR_FUTURE = 2**40
LOSS_CHANCE = 0.25
"""Of a history with lost commits: the chance, after each step that leaves no cleanup owed, that the
newest commit is lost."""
KEYS = [b"k%d" % i for i in range(8)]

CRASH_STEPS = {
    "delta upload": lambda op, name: op == "put" and name.endswith(".delta"),
    "snapshot blob upload": lambda op, name: op == "put" and name.startswith("blobs/"),
    "snapshot index upload": lambda op, name: op == "put_if_absent" and name.endswith(".snapshot"),
    "commit log write": lambda op, name: op == "put_if_absent" and name.startswith("commits/"),
    "cleanup: TTL removal": lambda op, name: op == "remove_ttl",
    "cleanup: deletion": lambda op, name: op == "delete",
    "pruning: commit deletion": lambda op, name: op == "delete" and name.startswith("commits/"),
}
"""Where a commit can be cut off, as predicates on blob store calls; a crash fires at the k-th match."""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with on_tmpfs(tmp_path_factory.mktemp("crash")) as path:
        yield path


def random_ops(rng: random.Random) -> list[tuple]:
    ops: list[tuple] = []
    for _ in range(rng.randint(0, 6)):
        cf = rng.choice(CFS)
        roll = rng.random()
        if roll < 0.7:
            ops.append(("put", cf, rng.choice(KEYS), rng.randbytes(rng.randint(0, 40))))
        elif roll < 0.95:
            ops.append(("delete", cf, rng.choice(KEYS)))
        else:
            ops.append(("clear", cf))
    return ops


def query_start(store: BlobStore) -> int:
    """What ``transform_with_state`` does with the checkpoint before its first batch (without Spark):
    one listing of ``commits/``, the check for lost commits on it, the start-up cleanup; returns the
    cleanup's ``needed_from``."""
    scan, _ = scan_for_writing(store, action="start a query on")
    stats = cleanup_latest(store, scan)
    return stats.needed_from if stats is not None else 0


STATE_OBJECT = re.compile(r"state/[^/]+/[0-9]+/([0-9]+)_([0-9a-f]+)\.(?:delta|snapshot)")


def stored(store: BlobStore) -> dict[str, tuple[bytes, bool]]:
    """Every object of ``store``: its bytes and whether it is pending."""
    return {name: (store.get(name), store.has_ttl(name)) for name in store.list("")}


class Counters:
    """What the histories on one kind of store did, so a run can show its faults fired."""

    def __init__(self) -> None:
        self.histories = 0
        self.crashes = 0
        self.races_lost = 0
        self.gc_runs = 0
        self.gc_full_runs = 0
        self.verify_runs = 0
        self.restores_checked = 0
        self.owed_cleanups_left_to_gc = 0
        self.crashes_while_pruning = 0
        self.commits_pruned = 0
        self.holes_planted = 0
        self.commits_lost = 0
        self.refusals = 0
        self.lost_commits_put_back = 0
        self.losses_accepted = 0
        self.lost_numbers_committed_again = 0
        self.acceptances_refused = 0
        self.answers = 0
        self.cuts = 0
        self.cuts_in_headers = 0
        self.retries = 0
        self.seconds = 0.0


COUNTS = {
    "memory/local": Counters(),
    "memory/local, losing commits": Counters(),
    "s3": Counters(),
    "azure": Counters(),
}


class History:
    """One seeded history; the model is ``models[v]``, the committed checkpoints ``cids[v]``."""

    def __init__(
        self,
        seed: int,
        root: Path,
        inner: BlobStore | None = None,
        kind: str = "memory/local",
        *,
        lose_commits: bool = False,
    ) -> None:
        self.rng = rng = random.Random(seed)
        # Lost commits draw from their own generator: until its first loss, the history is its twin's.
        self.loss_rng = random.Random(f"lost-{seed}") if lose_commits else None
        self.accepted: set[tuple[int, str]] = set()
        """The attempts (version, uid) whose loss was accepted: their objects may stay above the newest."""
        self.floor = 1
        """The oldest version that can be retained: an accepted loss moves it up to the readable version."""
        self.root = root
        self.counts = COUNTS[kind]
        if inner is not None:
            self.inner = inner
        elif seed % 10 == 9:
            self.inner = open_blob_store(str(root / "blobs"))
        else:
            self.inner = new_memory_store()
        self.store = FaultyStore(self.inner)
        self.every = rng.randint(1, 4)
        self.retain = rng.choice([1, 1, 2, 3, 4])
        self.keep_local = rng.randint(1, 3)
        self.executors = [root / f"executor-{i}" for i in range(3)]
        self.driver = Driver(self.store, retain=self.retain)
        self.models: dict[int, dict] = {0: {}}
        self.cids: dict[int, CheckpointId] = {}
        self.version = 0
        self.cleanup_owed = False
        self.counts.histories += 1

    def open(self, executor: Path, version: int):
        return open_p(
            self.store,
            executor,
            self.cids.get(version),
            snapshot_every=self.every,
            local_checkpoints_to_keep=self.keep_local,
        )

    def crash_point(self, chance: float = 0.6):
        """None, or a predicate that fires at the k-th call of one step of a commit or gc."""
        rng = self.rng
        if rng.random() >= chance:
            return None
        step = rng.choice(list(CRASH_STEPS))
        matches, k, seen = CRASH_STEPS[step], rng.randint(1, 3), [0]

        def crash_when(op: str, name: str, n: int) -> bool:
            if matches(op, name):
                seen[0] += 1
            fire = seen[0] == k and matches(op, name)
            if fire and op == "delete" and name.startswith("commits/"):
                self.counts.crashes_while_pruning += 1
            return fire

        return crash_when

    def attempt(self, executor: Path, rng: random.Random | None = None) -> tuple | None:
        rng = rng or self.rng
        with self.open(executor, self.version) as state:
            assert dump(state) == self.models[self.version], (
                f"{state.load_rule} load of version {self.version} on {executor.name} "
                "returned a state other than the committed one"
            )
            model = dict(self.models[self.version])
            apply_model(state.store, model, random_ops(rng))
            if rng.random() < 0.15:
                state.abort()
                return None
            return state.commit(), model

    def batch(self) -> None:
        rng = self.rng
        self.store.arm(self.crash_point())
        try:
            results = []
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                outcome = self.attempt(rng.choice(self.executors))
                if outcome is not None:
                    results.append(outcome)
            if not results:
                return
            result, model = rng.choice(results)
            rival = self.attempt(self.root / "rival-executor") if rng.random() < 0.15 else None
            self.cleanup_owed = True
            if rival is not None:
                # Another driver (a zombie of an earlier run) commits its own attempt first: it wins.
                commit = Driver(self.store, writer="rival-driver", retain=self.retain).commit(
                    {0: rival[0]}, self.version + 1
                )
                self.committed(*rival)
                self.counts.races_lost += 1
                with pytest.raises(CommitConflictError):
                    self.driver.commit({0: result}, self.version)
            else:
                commit = self.driver.commit({0: result}, self.version + 1)
                self.committed(result, model)
            self.counts.commits_pruned += len(self.driver.cleanup(commit).commits_pruned)
            self.cleanup_owed = False
        except InjectedCrash:
            self.restart()
        finally:
            self.store.arm(None)

    def committed(self, result, model: dict) -> None:
        self.version += 1
        self.models[self.version] = model
        self.cids[self.version] = result.checkpoint_id

    def gc(self, full: bool) -> None:
        """``blobstate gc`` (``--full``) with every pending TTL long expired; it may crash too."""
        self.store.arm(self.crash_point(0.3))
        try:
            if full:
                self.counts.gc_full_runs += 1
            else:
                self.counts.gc_runs += 1
            if self.cleanup_owed:
                self.counts.owed_cleanups_left_to_gc += 1
            gc_checkpoint(self.store, full=full, now=FAR_FUTURE)
            self.cleanup_owed = False
        except InjectedCrash:
            self.restart()
        finally:
            self.store.arm(None)

    def restart(self) -> None:
        """The process died: forget memory, maybe lose an executor's disk, maybe run start-up cleanup."""
        self.counts.crashes += 1
        forget_process_memory()
        self.store.arm(None)
        if self.rng.random() < 0.5:
            shutil.rmtree(self.rng.choice(self.executors), ignore_errors=True)
        self.driver = Driver(self.store, retain=self.retain)
        # An injected crash fires before the call it interrupts: a crash at the commit log write
        # leaves the previous version as the newest.
        assert self.driver.log.latest_version() == self.version
        if self.rng.random() < 0.5:
            stats = cleanup_latest(self.store)
            if stats is not None:
                self.driver.needed_from = stats.needed_from
            self.cleanup_owed = False
        self.check_load(self.rng.choice(self.executors), self.version)

    def check_load(self, executor: Path, version: int) -> None:
        with self.open(executor, version) as state:
            assert dump(state) == self.models[version], f"{state.load_rule} load of version {version}"

    def check_invariants(self, *, restore_all: bool) -> None:
        self.counts.verify_runs += 1
        report = verify(self.inner)
        problems = [p for p in report.problems if not (self.cleanup_owed and "still pending" in p.message)]
        assert problems == [], [str(p) for p in problems]
        if self.version:
            lowest = report.retained_from
            assert lowest == max(1, self.floor, self.version - self.retain + 1)
            versions = (
                range(lowest, self.version + 1) if restore_all else [self.rng.randint(lowest, self.version)]
            )
            for version in versions:
                self.counts.restores_checked += 1
                self.check_load(self.root / f"fresh-{self.rng.random()}", version)

    def finish(self) -> None:
        gc_checkpoint(self.store, full=True, now=FAR_FUTURE)
        self.cleanup_owed = False
        self.check_invariants(restore_all=True)
        if not self.version:
            return
        newest = self.driver.log.latest_commit()  # as an accepted loss left it
        assert newest is not None and newest.version == self.version
        referenced = referenced_by_retained(self.inner, newest)
        left = set(self.inner.list("state/")) | set(self.inner.list("blobs/"))
        # gc --full sweeps an accepted lost attempt's objects once the newest commit has passed its version.
        left -= {name for name in left if self.accepted_above_newest(name)}
        assert left == referenced, f"unreferenced objects left: {sorted(left - referenced)[:5]}"
        # gc pruned every commit below the horizon, and the log is bounded by it.
        assert self.driver.log.versions() == list(range(newest.horizon, self.version + 1))
        assert newest.horizon <= newest.retained_from
        self.plant_hole(newest)

    def accepted_above_newest(self, name: str) -> bool:
        match = STATE_OBJECT.fullmatch(name)
        return bool(match) and int(match[1]) > self.version and (int(match[1]), match[2]) in self.accepted

    def maybe_lose_newest_commit(self) -> None:
        """With lost commits: after a commit and its post-commit cleanup, maybe lose the newest commit."""
        rng = self.loss_rng
        if rng is None or self.cleanup_owed or not self.version or rng.random() >= LOSS_CHANCE:
            return
        self.lose_newest_commit(rng)

    def lose_newest_commit(self, rng: random.Random) -> None:
        """``commits/<v>.json`` is deleted, as a lifecycle rule or a mistaken ``rm`` would, while no query
        runs: every writer refuses and changes nothing, verify reports it, then the operator decides."""
        lost = self.version
        name = commit_name(lost)
        saved = self.inner.get(name)
        lost_commit = CommitLog(self.inner).latest_commit()  # as an earlier accepted loss left it
        assert lost_commit is not None and lost_commit.version == lost
        self.inner.delete(name)
        forget_process_memory()
        self.counts.commits_lost += 1
        # The log holds every commit from the lost one's horizon (below it) up: the one before is readable.
        readable = lost - 1
        log = CommitLog(self.inner)
        assert log.latest_version() == readable
        previous = log.read_commit(readable) if readable else None
        # The lost commit's cleanup pruned the commits below its horizon; the readable commit's window may
        # start lower: those read as holes, but every writer names the loss first.
        shadowed = list(range(previous.horizon, lost_commit.horizon)) if previous else []
        assert [v for v in shadowed if self.inner.exists(commit_name(v))] == []
        before = stored(self.inner)
        writers: dict[str, Callable[[], object]] = {
            "rescale": lambda: rescale_checkpoint(None, self.inner.url, rng.randint(1, 4)),
            "gc": lambda: gc_checkpoint(self.store, now=FAR_FUTURE),
            "gc --full": lambda: gc_checkpoint(self.store, full=True, now=FAR_FUTURE),
            "gc --dry-run": lambda: gc_checkpoint(
                self.store, full=rng.random() < 0.5, now=FAR_FUTURE, dry_run=True
            ),
            "a query's start": lambda: query_start(self.store),
        }
        for what, write in writers.items():
            try:
                write()
            except LostCommitError as refused:
                assert (refused.newest, refused.lost) == (readable, [lost]), f"{what}: {refused}"
            else:
                pytest.fail(f"the {what} went ahead on a checkpoint whose newest commit {name} was lost")
            self.counts.refusals += 1
            assert stored(self.inner) == before, f"the refused {what} changed the checkpoint"
        forget_process_memory()
        problems = verify(self.inner).problems
        if readable:
            reported = [p for p in problems if p.object == name and "newer commits were lost" in p.message]
        else:
            reported = [p for p in problems if p.object == "commits/" and "was commits/ lost?" in p.message]
        assert reported, f"verify did not report the loss of {name}: {[str(p) for p in problems]}"
        holes = sorted(p.version for p in problems if "a hole in the commit log" in p.message)
        assert holes == shadowed, [str(p) for p in problems]
        assert len(problems) == len(reported) + len(holes), [str(p) for p in problems]
        self.driver = Driver(self.store, retain=self.retain)  # whatever runs next is a new process
        if rng.random() < 0.5 or not self.accept_loss_at(readable, lost_commit, rng):
            # Put back from a backup, byte for byte: everything is as before.
            self.counts.lost_commits_put_back += 1
            assert self.inner.put_if_absent(name, saved)
            forget_process_memory()
            self.driver.needed_from = query_start(self.store)
        self.cleanup_owed = False
        report = verify(self.inner)
        assert report.problems == [], [str(p) for p in report.problems]
        self.check_load(self.root / f"fresh-{rng.random()}", self.version)

    def accept_loss_at(self, readable: int, lost_commit, rng: random.Random) -> bool:
        """``blobstate accept-loss --version <readable>``, a query's start, and its first batch, which
        commits the lost version's number; the model continues from the readable version alone. False:
        the acceptance was refused, rightly, and the operator must put the commit back instead."""
        lost = lost_commit.version
        before = stored(self.inner)
        try:
            acceptance, after = accept_loss(self.store, readable, reason="no backup")
        except AcceptLossError as error:
            # Only a readable version outside the lost commit's retained window can have lost objects to
            # its cleanup; then nothing is written.
            assert readable < lost_commit.retained_from, str(error)
            assert f"from version {readable}: it is not restorable" in str(error), str(error)
            assert stored(self.inner) == before
            self.counts.acceptances_refused += 1
            return False
        assert after.lost == () and list(acceptance.lost) == [lost]
        assert self.cids[lost].uid in acceptance.lost[lost], "the committed attempt is the evidence"
        forget_process_memory()
        self.driver.needed_from = query_start(self.store)  # start-up cleanup finds all it retains
        self.counts.losses_accepted += 1
        self.accepted |= {(v, uid) for v, uids in acceptance.lost.items() for uid in uids}
        del self.models[lost], self.cids[lost]
        self.version = readable
        self.floor = readable  # an accepted loss of an accepted version's commit moves it down again
        # Writers continue from the readable version: the next commit takes the lost one's number.
        results = [self.attempt(rng.choice(self.executors), rng) for _ in range(rng.randint(1, 2))]
        result, model = rng.choice([r for r in results if r is not None] or [(None, None)])
        if result is not None:
            commit = self.driver.commit({0: result}, readable + 1)
            assert commit.version == lost and commit.retained_from >= self.floor
            self.committed(result, model)
            self.driver.cleanup(commit)
            self.counts.lost_numbers_committed_again += 1
        return True

    def plant_hole(self, newest) -> None:
        """A commit deleted from the retained window is a hole for verify, gc and start-up, named."""
        if newest.horizon >= self.version:
            return
        self.counts.holes_planted += 1
        hole = self.rng.randint(newest.horizon, self.version - 1)
        self.inner.delete(commit_name(hole))
        forget_process_memory()
        assert any(p.object == commit_name(hole) and "hole" in p.message for p in verify(self.inner).problems)
        with pytest.raises(GcRefusedError, match=re.escape(commit_name(hole))):
            gc_checkpoint(self.inner, full=True, now=FAR_FUTURE)
        with pytest.raises(IncompleteCommitLogError, match=re.escape(commit_name(hole))):
            cleanup_latest(self.inner)


def run_history(history: History) -> None:
    """Random steps, each followed by the invariants' check, then a full gc and the final check."""
    for _ in range(history.rng.randint(3, 8)):
        roll = history.rng.random()
        if roll < 0.1:
            history.check_load(history.rng.choice(history.executors), history.version)
        elif roll < 0.2:
            history.gc(full=False)
        elif roll < 0.3:
            history.gc(full=True)
        else:
            history.batch()
        history.check_invariants(restore_all=True)
        history.maybe_lose_newest_commit()
    history.finish()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_history(seed: int, scratch: Path) -> None:
    root = scratch / f"seed-{seed}"
    started = time.monotonic()
    try:
        run_history(History(seed, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        COUNTS["memory/local"].seconds += time.monotonic() - started


@pytest.mark.parametrize("seed", range(LOST_SEEDS))
def test_random_history_with_lost_commits(seed: int, scratch: Path) -> None:
    root = scratch / f"lost-seed-{seed}"
    started = time.monotonic()
    try:
        run_history(History(seed, root, kind="memory/local, losing commits", lose_commits=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        COUNTS["memory/local, losing commits"].seconds += time.monotonic() - started


@pytest.mark.parametrize(
    ("cutting_server", "seed"),
    [
        (kind, seed)
        for kind, count in SERVER_SEEDS.items()
        for seed in range(SERVER_SEED_START, SERVER_SEED_START + count)
    ],
    indirect=["cutting_server"],
)
def test_random_history_on_a_server_cutting_answers(
    seed: int, scratch: Path, cutting_server: tuple[str, Callable[[str], str], FaultProxy]
) -> None:
    from server_stores import cutting_answers, emulate_lifecycle

    kind, url, proxy = cutting_server
    root = scratch / f"{kind}-seed-{seed}"
    inner = emulate_lifecycle(open_blob_store(url(f"history-{seed}")))
    with cutting_answers(proxy, COUNTS[kind], inner, seed, CUT_CHANCE, root):
        run_history(History(seed, root, inner, kind))


def _report(kind: str) -> Counters:
    counts = COUNTS[kind]
    print(f"crash model on {kind}: {vars(counts)}")
    return counts


def test_the_histories_exercised_every_fault() -> None:
    """Runs after the histories (same module): their faults and races really fired."""
    counts = COUNTS["memory/local"]
    if not SEEDS or counts.histories < SEEDS:
        pytest.skip("run together with test_random_history")
    _report("memory/local")
    assert counts.crashes > SEEDS // 10
    assert counts.races_lost > 0 and counts.gc_runs > 0 and counts.gc_full_runs > 0
    assert counts.owed_cleanups_left_to_gc > 0
    assert counts.restores_checked > SEEDS
    assert counts.commits_pruned > SEEDS // 10 and counts.crashes_while_pruning > 0
    assert counts.holes_planted > SEEDS // 10


def test_the_histories_with_lost_commits_lost_and_recovered_them() -> None:
    """Runs after the histories with lost commits (same module): commits were lost, every writer refused,
    and both ways out were taken."""
    counts = COUNTS["memory/local, losing commits"]
    if not LOST_SEEDS or counts.histories < LOST_SEEDS:
        pytest.skip("run together with test_random_history_with_lost_commits")
    _report("memory/local, losing commits")
    assert counts.commits_lost > 0, "no history lost a commit"
    assert counts.refusals == 5 * counts.commits_lost
    if LOST_SEEDS >= 20:
        assert counts.commits_lost > LOST_SEEDS // 2
        assert counts.lost_commits_put_back > 0 and counts.losses_accepted > 0
        assert counts.lost_numbers_committed_again > 0
    if LOST_SEEDS >= 200:
        assert counts.acceptances_refused > 0, "no acceptance met a readable version the loss destroyed"


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_the_server_histories_exercised_every_fault(kind: str) -> None:
    """Runs after the server histories (same module): crashes and cut answers really happened."""
    counts, seeds = COUNTS[kind], SERVER_SEEDS[kind]
    if not seeds or counts.histories < seeds:
        pytest.skip("run together with test_random_history_on_a_server_cutting_answers")
    _report(kind)
    assert counts.crashes > 0 and counts.gc_runs > 0
    assert counts.restores_checked > seeds
    assert counts.cuts > seeds and counts.cuts_in_headers > 0, "the proxy cut too few answers"
