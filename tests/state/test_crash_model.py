"""Model-based randomized test: seeded histories of writes, commits, aborted and duplicate attempts,
crashes at every step of a commit, and restarts, checked against a plain-dict model.

Each history drives one partition through a real blob store wrapped by a fault injector, with tasks on
three "executors" (local directories) and a driver that commits through the real commit log and runs the
real post-commit cleanup. A crash is injected by raising :class:`InjectedCrash` at the n-th mutating blob
store call of a batch -- the delta upload, snapshot blob and index uploads, the commit log write, TTL
removals or deletions of the cleanup -- after which the "process" is gone: open partitions are dropped,
process memory is forgotten, executor directories are kept or wiped, and the driver restarts (start-up
cleanup for the newest commit). After every batch and restart:

* every load returns exactly the model of the committed version (never an un-chosen attempt's state);
* ``verify`` finds every retained version restorable (all objects present, intact and permanent);
* at the end, after TTL expiry, exactly the objects the retained versions reference remain.

``BLOBSTATE_CRASH_SEEDS=<n>`` runs more histories.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
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

from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.state.retention import cleanup_latest, referenced_by_retained
from blobstate.state.verify import verify

SEEDS = int(os.environ.get("BLOBSTATE_CRASH_SEEDS", "200"))
FAR_FUTURE = 2**40
KEYS = [b"k%d" % i for i in range(8)]

CRASH_STEPS = {
    "delta upload": lambda op, name: op == "put" and name.endswith(".delta"),
    "snapshot blob upload": lambda op, name: op == "put" and name.startswith("blobs/"),
    "snapshot index upload": lambda op, name: op == "put_if_absent" and name.endswith(".snapshot"),
    "commit log write": lambda op, name: op == "put_if_absent" and name.startswith("commits/"),
    "cleanup: TTL removal": lambda op, name: op == "remove_ttl",
    "cleanup: deletion": lambda op, name: op == "delete",
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


class History:
    """One seeded history; the model is ``models[v]``, the committed checkpoints ``cids[v]``."""

    def __init__(self, seed: int, root: Path) -> None:
        self.rng = rng = random.Random(seed)
        self.root = root
        if seed % 10 == 9:
            self.inner = open_blob_store(str(root / "blobs"))
        else:
            self.inner = new_memory_store()
        self.store = FaultyStore(self.inner)
        self.every = rng.randint(1, 4)
        self.retain = rng.choice([1, 1, 2, 3, 4])
        self.keep_local = rng.randint(1, 3)
        self.executors = [root / f"executor-{i}" for i in range(3)]
        self.driver = Driver(self.store)
        self.models: dict[int, dict] = {0: {}}
        self.cids: dict[int, CheckpointId] = {}
        self.version = 0
        self.crashes = 0

    def open(self, executor: Path, version: int):
        return open_p(
            self.store,
            executor,
            self.cids.get(version),
            snapshot_every=self.every,
            local_checkpoints_to_keep=self.keep_local,
        )

    def crash_point(self):
        """None, or a predicate that fires at the k-th call of one step of a commit."""
        rng = self.rng
        if rng.random() < 0.4:
            return None
        step = rng.choice(list(CRASH_STEPS))
        matches, k, seen = CRASH_STEPS[step], rng.randint(1, 3), [0]

        def crash_when(op: str, name: str, n: int) -> bool:
            if matches(op, name):
                seen[0] += 1
            return seen[0] == k and matches(op, name)

        return crash_when

    def batch(self) -> None:
        rng = self.rng
        self.store.arm(self.crash_point())
        try:
            results = []
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                executor = rng.choice(self.executors)
                with self.open(executor, self.version) as state:
                    assert dump(state) == self.models[self.version], (
                        f"{state.load_rule} load of version {self.version} on {executor.name} "
                        "returned a state other than the committed one"
                    )
                    model = dict(self.models[self.version])
                    apply_model(state.store, model, random_ops(rng))
                    if rng.random() < 0.15:
                        state.abort()
                        continue
                    results.append((state.commit(), model))
            if not results:
                return
            result, model = rng.choice(results)
            commit = self.driver.commit({0: result.checkpoint_id.uid}, self.version + 1)
            self.version += 1
            self.models[self.version] = model
            self.cids[self.version] = result.checkpoint_id
            self.driver.cleanup(commit, self.retain)
        except InjectedCrash:
            self.restart()
        finally:
            self.store.arm(None)

    def restart(self) -> None:
        """The process died: forget memory, maybe lose an executor's disk, run the start-up cleanup."""
        self.crashes += 1
        forget_process_memory()
        self.store.arm(None)
        if self.rng.random() < 0.5:
            shutil.rmtree(self.rng.choice(self.executors), ignore_errors=True)
        self.driver = Driver(self.store)
        assert self.driver.log.latest_version() == self.version
        cleanup_latest(self.store, min_versions_to_retain=self.retain)
        self.check_load(self.rng.choice(self.executors), self.version)

    def check_load(self, executor: Path, version: int) -> None:
        with self.open(executor, version) as state:
            assert dump(state) == self.models[version], f"{state.load_rule} load of version {version}"

    def check_invariants(self) -> None:
        problems = verify(self.inner, min_versions_to_retain=self.retain)
        assert problems == [], [str(p) for p in problems]
        if self.version and self.rng.random() < 0.2:
            lowest = max(1, self.version - self.retain + 1)
            version = self.rng.randint(lowest, self.version)
            self.check_load(self.root / f"fresh-{self.rng.random()}", version)

    def finish(self) -> None:
        self.restart()
        self.check_invariants()
        self.inner.expire(FAR_FUTURE)
        latest, referenced = referenced_by_retained(self.inner, min_versions_to_retain=self.retain)
        assert latest == self.version
        left = set(self.inner.list("state/")) | set(self.inner.list("blobs/"))
        assert left == referenced, f"unreferenced objects left: {sorted(left - referenced)[:5]}"
        for version in range(max(1, self.version - self.retain + 1), self.version + 1):
            self.check_load(self.root / f"final-{version}", version)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_history(seed: int, scratch: Path) -> None:
    root = scratch / f"seed-{seed}"
    history = History(seed, root)
    try:
        for _ in range(history.rng.randint(3, 7)):
            if history.rng.random() < 0.15:
                history.check_load(history.rng.choice(history.executors), history.version)
            else:
                history.batch()
            history.check_invariants()
        history.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)
