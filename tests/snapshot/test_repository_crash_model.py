"""Model-based randomized test of backup repositories: seeded histories of backups, a second backup
racing for the same version, ``gc`` and ``gc --full`` with every pending TTL long expired, and crashes at
every step of a backup (the guard's creation, blob and index uploads, the head write, TTL removals,
deletions, the pruning of old heads) and of gc. Restores, verifies and gc runs also have backups (which
prune heads) commit in the middle of them, between any two of their reads.

After every step the newest committed snapshot must verify and restore to exactly the directory that
was backed up (the model), the guard must exist, the head log must hold at most the two heads it retains
(plus, after a crash, heads a pruning left below the horizon), and ``gc --full`` at the end leaves only
what the newest snapshot references and the two retained heads.
The same histories also run on the real S3 backend (the moto server) and the real Azure backend
(azurite), each behind a proxy that cuts answers at random bytes (status line, headers or body) besides
the injected crashes.

``BLOBSTATE_CRASH_SEEDS=<n>`` runs more histories on memory and local stores;
``BLOBSTATE_SERVER_CRASH_SEEDS=<n>`` on each server (default 10 on S3, 4 on the slower azurite), cutting
each answer with probability ``BLOBSTATE_CUT_CHANCE`` (default 0.05);
``BLOBSTATE_SERVER_CRASH_SEED_START=<s>`` makes those seeds ``s`` to ``s + n - 1`` (default 0), so a long
run can be split into shards over distinct seeds.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from snapshot_helpers import HookedStore

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.snapshot.heads import HeadLog
from blobstate.snapshot.repository import (
    BLOB_PREFIX,
    FORMER_BLOB_PREFIX,
    GUARD_INDEX,
    BackupConflictError,
    RepositoryError,
    backup_to_repository,
    gc_repository,
    read_snapshot,
    restore_repository,
    root_indexes,
    verify_repository,
)
from faultproxy import FaultProxy

SEEDS = int(os.environ.get("BLOBSTATE_CRASH_SEEDS", "100"))
SERVER_DEFAULTS = {"s3": 10, "azure": 4}  # azurite answers about half as fast as moto
SERVER_SEEDS = {
    kind: int(os.environ.get("BLOBSTATE_SERVER_CRASH_SEEDS", default))
    for kind, default in SERVER_DEFAULTS.items()
}
SERVER_SEED_START = int(os.environ.get("BLOBSTATE_SERVER_CRASH_SEED_START", "0"))
CUT_CHANCE = float(os.environ.get("BLOBSTATE_CUT_CHANCE", "0.05"))
FAR_FUTURE = 2**40

CRASH_STEPS: dict[str, Callable[[str, str], bool]] = {
    "guard write": lambda op, name: op == "put_if_absent" and name == GUARD_INDEX,
    "blob upload": lambda op, name: op == "put" and name.startswith(BLOB_PREFIX),
    "index upload": lambda op, name: (
        op in ("put", "put_if_absent") and name.endswith(".snapshot") and name != GUARD_INDEX
    ),
    "head write": lambda op, name: op == "put_if_absent" and name.startswith("heads/"),
    "TTL removal": lambda op, name: op == "remove_ttl",
    "deletion": lambda op, name: op == "delete",
    "head pruning": lambda op, name: op == "delete" and name.startswith("heads/"),
}
INTERLEAVE_AT: dict[str, Callable[[str, str], bool]] = {
    "head listing": lambda op, name: op == "list" and name == "heads/",
    "head read": lambda op, name: op == "get" and name.startswith("heads/"),
    "index read": lambda op, name: op == "get" and name.endswith(".snapshot"),
    "blob listing": lambda op, name: op == "list" and name == BLOB_PREFIX,
    "blob read": lambda op, name: op == "get" and name.startswith(BLOB_PREFIX),
}


class Crash(BaseException):
    """A simulated process crash (a BaseException: no ``except Exception`` swallows it)."""


class Counters:
    """What the histories on one kind of store did, so a run can show its faults fired."""

    def __init__(self) -> None:
        self.histories = self.crashes = self.races_lost = self.gc_runs = self.restores_checked = 0
        self.answers = self.cuts = self.cuts_in_headers = self.retries = 0
        self.seconds = 0.0
        self.crash_steps: dict[str, int] = {}
        """Crashes by the step they cut (``CRASH_STEPS``'s names)."""
        self.heads_pruned = 0
        self.interleaved: dict[str, int] = {}
        """Restores, verifies and gc runs that backups committed in the middle of, by what they ran into."""
        self.restores_raced = 0
        """Interleaved restores that failed naming the race (a newer backup's cleanup deleted a blob)."""
        self.races_lost_to_pruned = 0
        """Lost races whose head re-created a version committed and pruned meanwhile."""


COUNTS = {"memory/local": Counters(), "s3": Counters(), "azure": Counters()}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("repository-crash")


def read_dir(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class History:
    def __init__(
        self, seed: int, root: Path, inner: BlobStore | None = None, kind: str = "memory/local"
    ) -> None:
        self.rng = random.Random(seed)
        self.root = root
        self.counts = COUNTS[kind]
        if inner is None:
            inner = (
                open_blob_store(str(root / "repo"))
                if seed % 4 == 0
                else open_blob_store(f"memory://crash-{seed}")
            )
        self.inner: BlobStore = inner
        self.armed: Callable[[str, str], bool] | None = None
        self.armed_step = ""
        self.on_head: Callable[[], None] | None = None
        self.meanwhile: tuple[Callable[[str, str], bool], Callable[[], None]] | None = None
        self.pruned_clean = True  # no crash since the last backup or gc that pruned
        self.store = HookedStore(self.inner, self.hook)
        self.source = root / "source"
        self.source.mkdir(parents=True)
        self.model: dict[str, bytes] | None = None  # the newest committed snapshot's content
        self.cleanup_owed = False  # a crash may have cut off a committed backup's cleanup
        self.counts.histories += 1

    def hook(self, op: str, name: str) -> None:
        if self.on_head is not None and op == "put_if_absent" and name.startswith("heads/"):
            race, self.on_head = self.on_head, None
            race()
        if self.meanwhile is not None and self.meanwhile[0](op, name):
            (_, act), self.meanwhile = self.meanwhile, None
            act()
        if self.armed is not None and self.armed(op, name):
            self.armed = None
            steps = self.counts.crash_steps
            steps[self.armed_step] = steps.get(self.armed_step, 0) + 1
            raise Crash(f"crash at {op} {name}")

    def arm(self, chance: float) -> None:
        if self.rng.random() >= chance:
            self.armed = None
            return
        self.armed_step = self.rng.choice(list(CRASH_STEPS))
        matches, k, seen = CRASH_STEPS[self.armed_step], self.rng.randint(1, 3), [0]

        def crash_when(op: str, name: str) -> bool:
            if matches(op, name):
                seen[0] += 1
                return seen[0] == k
            return False

        self.armed = crash_when

    def change_source(self, directory: Path) -> None:
        rng = self.rng
        for _ in range(rng.randint(1, 4)):
            path = directory / f"file-{rng.randrange(6)}"
            if path.exists() and rng.random() < 0.25:
                path.unlink()
            else:
                path.write_bytes(rng.randbytes(rng.randint(0, 3000)))

    def backup(self) -> None:
        self.change_source(self.source)
        wanted = read_dir(self.source)
        if self.rng.random() < 0.2:
            # Backups of another directory commit the same version first; after three, that version's
            # head is pruned again before this backup's head lands (it re-creates it: still a lost race).
            rival = self.root / f"rival-{self.rng.random()}"
            shutil.copytree(self.source, rival)
            rivals = self.rng.randint(1, 3)

            def race() -> None:
                for _ in range(rivals):
                    self.change_source(rival)
                    done = backup_to_repository(self.inner, rival)
                    self.counts.heads_pruned += len(done.heads_pruned)
                    self.model = read_dir(rival)
                self.cleanup_owed = False
                self.pruned_clean = True

            self.on_head = race
            with pytest.raises(BackupConflictError):
                backup_to_repository(self.store, self.source)
            self.counts.races_lost += 1
            self.counts.races_lost_to_pruned += rivals == 3
            return
        self.arm(0.5)
        try:
            done = backup_to_repository(self.store, self.source)
            self.model = wanted
            self.cleanup_owed = False
            self.pruned_clean = True
            self.counts.heads_pruned += len(done.heads_pruned)
        except Crash:
            self.counts.crashes += 1
            self.cleanup_owed = True
            self.pruned_clean = False
            # The head may or may not have been written before the crash: what is committed decides.
            if self.armed is None and self.committed_content() == wanted:
                self.model = wanted
        finally:
            self.armed = None

    def committed_content(self) -> dict[str, bytes] | None:
        try:
            read_snapshot(self.inner)
        except Exception:
            return None
        target = self.root / f"probe-{self.rng.random()}"
        restore_repository(self.inner, target)
        return read_dir(target)

    def gc(self) -> None:
        self.counts.gc_runs += 1
        if self.rng.random() < 0.3:
            self.backups_meanwhile("gc")
        self.arm(0.3)
        try:
            stats = gc_repository(self.store, full=self.rng.random() < 0.5, now=FAR_FUTURE)
            self.cleanup_owed = False
            self.pruned_clean = True
            self.counts.heads_pruned += len(stats.heads_pruned)
        except Crash:
            self.counts.crashes += 1
            self.cleanup_owed = True
            self.pruned_clean = False
        finally:
            self.armed = None
            self.meanwhile = None

    def backups_meanwhile(self, what: str) -> None:
        """Have 1-3 backups commit (and prune heads) when the next operation reaches a random read."""
        at = self.rng.choice(list(INTERLEAVE_AT))
        count = self.rng.randint(1, 3)

        def act() -> None:
            key = f"{what} at {at}"
            self.counts.interleaved[key] = self.counts.interleaved.get(key, 0) + 1
            for _ in range(count):
                self.change_source(self.source)
                done = backup_to_repository(self.inner, self.source)
                self.counts.heads_pruned += len(done.heads_pruned)
                self.model = read_dir(self.source)
                self.cleanup_owed = False
                self.pruned_clean = True

        self.meanwhile = (INTERLEAVE_AT[at], act)

    def read_while_backups_commit(self) -> None:
        """A restore or a verify that backups commit in the middle of: it reads the snapshot it started
        from or a newer one, or names the race; it never reports a hole or damage."""
        before = self.model
        kind = "restore" if self.rng.random() < 0.5 else "verify"
        self.backups_meanwhile(kind)
        try:
            if kind == "restore":
                target = self.root / f"raced-{self.rng.random()}"
                try:
                    restore_repository(self.store, target)
                except RepositoryError as error:
                    assert "run the restore again" in str(error), str(error)
                    self.counts.restores_raced += 1
                else:
                    assert read_dir(target) in (before, self.model), "a raced restore mixed snapshots"
            else:
                result = verify_repository(self.store, checksums=self.rng.random() < 0.5)
                problems = [
                    p for p in result.problems if not (self.cleanup_owed and "still pending" in p.message)
                ]
                assert problems == [], [str(p) for p in problems]
        finally:
            self.meanwhile = None

    def check(self) -> None:
        if self.model is None:
            return
        # A backup creates the guard before its head, and nothing deletes it.
        assert self.inner.exists(GUARD_INDEX), "a committed repository without its guard"
        scan = HeadLog(self.inner).scan()
        assert len(scan.retained) <= 2, f"{len(scan.retained)} heads retained"
        if self.pruned_clean:
            assert scan.prunable == [], f"heads below the horizon left: {scan.prunable}"
        result = verify_repository(self.inner, checksums=True)
        problems = [p for p in result.problems if not (self.cleanup_owed and "still pending" in p.message)]
        assert problems == [], [str(p) for p in problems]
        target = self.root / f"restored-{self.rng.random()}"
        restore_repository(self.inner, target)
        self.counts.restores_checked += 1
        assert read_dir(target) == self.model, "the newest committed snapshot does not restore exactly"


def run_history(history: History) -> None:
    """Random backups and gc runs, each followed by the check, then a full gc and the final check."""
    for _ in range(history.rng.randint(4, 10)):
        step = history.rng.random()
        if step < 0.25:
            history.gc()
        elif step < 0.4 and history.model is not None:
            history.read_while_backups_commit()
        else:
            history.backup()
        history.check()
    gc_repository(history.inner, full=True, now=FAR_FUTURE)
    history.cleanup_owed = False
    history.pruned_clean = True
    history.check()
    if history.model is not None:
        newest = read_snapshot(history.inner)
        left = {*history.inner.list(BLOB_PREFIX), *history.inner.list(FORMER_BLOB_PREFIX)}
        left |= set(root_indexes(history.inner))
        assert left == {newest.name, *newest.index.present_blob_ids()}, "gc --full left garbage"
        retained = [v for v in (newest.version - 1, newest.version) if v >= 1]
        assert HeadLog(history.inner).listed() == retained, "gc left heads below the horizon"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_repository_history(seed: int, scratch: Path) -> None:
    root = scratch / f"seed-{seed}"
    started = time.monotonic()
    try:
        run_history(History(seed, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        COUNTS["memory/local"].seconds += time.monotonic() - started


@pytest.mark.parametrize(
    ("cutting_server", "seed"),
    [
        (kind, seed)
        for kind, count in SERVER_SEEDS.items()
        for seed in range(SERVER_SEED_START, SERVER_SEED_START + count)
    ],
    indirect=["cutting_server"],
)
def test_random_repository_history_on_a_server_cutting_answers(
    seed: int, scratch: Path, cutting_server: tuple[str, Callable[[str], str], FaultProxy]
) -> None:
    from server_stores import cutting_answers, emulate_lifecycle

    kind, url, proxy = cutting_server
    root = scratch / f"{kind}-seed-{seed}"
    inner = emulate_lifecycle(open_blob_store(url(f"repository-{seed}")))
    with cutting_answers(proxy, COUNTS[kind], inner, seed, CUT_CHANCE, root):
        run_history(History(seed, root, inner, kind))


def test_the_repository_histories_exercised_every_fault() -> None:
    """Runs after the histories (same module): their crashes and races really fired."""
    counts = COUNTS["memory/local"]
    if not SEEDS or counts.histories < SEEDS:
        pytest.skip("run together with test_random_repository_history")
    print(f"repository crash model on memory/local: {vars(counts)}")
    assert counts.crashes > SEEDS // 10 and counts.races_lost > 0 and counts.gc_runs > 0
    assert counts.restores_checked > SEEDS
    if SEEDS >= 50:  # a few histories may draw none of these
        assert counts.crash_steps.get("head pruning", 0) > 0 and counts.heads_pruned > SEEDS
        assert counts.races_lost_to_pruned > 0
        assert {key.split(" at ")[0] for key in counts.interleaved} == {"restore", "verify", "gc"}


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_the_server_repository_histories_exercised_every_fault(kind: str) -> None:
    """Runs after the server histories (same module): crashes and cut answers really happened."""
    counts, seeds = COUNTS[kind], SERVER_SEEDS[kind]
    if not seeds or counts.histories < seeds:
        pytest.skip("run together with test_random_repository_history_on_a_server_cutting_answers")
    print(f"repository crash model on {kind}: {vars(counts)}")
    assert counts.crashes > 0 and counts.gc_runs > 0 and counts.restores_checked > seeds
    assert counts.cuts > seeds and counts.cuts_in_headers > 0, "the proxy cut too few answers"
