"""``verify`` tells the truth: what it must catch (every kind of damage to anything a retained version
reaches, locations that are not checkpoints, holes) and what it says it did not read."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lineage_harness import OP, Driver, forget_process_memory, new_memory_store, on_tmpfs, open_p

from blobstate.blobstore import BlobStore
from blobstate.layout import commit_name, delta_name, snapshot_name
from blobstate.lineage.commitlog import CommitLog
from blobstate.state.retention import referenced_by_retained
from blobstate.state.verify import verify


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    forget_process_memory()
    with on_tmpfs(tmp_path) as path:
        yield path


def build(store: BlobStore, local: Path, *, versions: int = 8, every: int = 3, retain: int = 5) -> list:
    """A one-partition checkpoint with snapshots every ``every`` versions; returns the commit results."""
    driver = Driver(store, retain=retain)
    results, committed = [], None
    for v in range(1, versions + 1):
        with open_p(store, local, committed, snapshot_every=every) as s:
            for i in range(40):
                s.store.put("a", b"key-%03d-%d" % (i, v % 3), b"value %d" % (v * i) * 20)
            result = s.commit()
        driver.cleanup(driver.commit({0: result}, v))
        results.append(result)
        committed = result.checkpoint_id
    return results


def reached_objects(store: BlobStore) -> list[str]:
    """Every object the retained versions reach, and the commits and metadata they hang from (older
    commits are only checked for presence: verify says so)."""
    log = CommitLog(store)
    latest = log.read_commit(log.latest_version())
    commits = [commit_name(v) for v in range(latest.retained_from, latest.version + 1)]
    return sorted(referenced_by_retained(store, latest)) + commits + ["metadata.json"]


DAMAGE: dict[str, Callable[[bytes, random.Random], bytes | None]] = {
    "changed byte": lambda d, rng: _flip(d, rng),
    "truncated": lambda d, rng: d[: rng.randrange(len(d))] if d else None,
    "deleted": lambda d, rng: None,
}


def _flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return b"x"
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_any_damage_to_any_reached_object_is_named(tmp_path: Path, damage: str) -> None:
    store = new_memory_store()
    build(store, tmp_path / "w")
    assert verify(store, checksums=True).problems == []
    rng = random.Random(damage)
    objects = reached_objects(store)
    kinds = {n.rsplit(".", 1)[-1] if "." in n else "blob" for n in objects}
    assert {"delta", "snapshot", "json", "blob"} <= kinds
    for name in objects:
        original = store.get(name)
        damaged = DAMAGE[damage](original, rng)
        if damaged is None:
            store.delete(name)
        else:
            store.put(name, damaged)
        forget_process_memory()
        # Plain verify catches everything but a changed byte inside a blob, which only reading finds.
        plain = damage != "changed byte" or not name.startswith("blobs/")
        report = verify(store, checksums=not plain)
        assert report.problems, f"{damage} {name}: verify said ok"
        named = {p.object for p in report.problems}
        assert (
            name in named
            or (name.startswith("commits/") and "commits/" in " ".join(named))
            or (name == "metadata.json" and "metadata.json" in named)
        ), f"{damage} {name}: problems name {named}"
        store.put(name, original)
    assert verify(store, checksums=True).problems == []


def test_plain_verify_says_what_it_did_not_read(tmp_path: Path) -> None:
    store = new_memory_store()
    build(store, tmp_path / "w", versions=5, every=2, retain=3)
    report = verify(store)
    text = "\n".join(report.summary())
    assert report.problems == [] and report.latest_version == 5 and report.retained_from == 3
    assert "without reading them (--checksums reads them)" in text and report.blobs_checked > 0
    assert "versions below 3 are not retained and were not checked" in text
    full = verify(store, checksums=True)
    assert "checked their CRC-32" in "\n".join(full.summary())


@pytest.mark.parametrize("where", ["empty location", "a sub-path (state/)", "commits gone"])
def test_a_location_that_is_not_a_checkpoint_is_a_problem(tmp_path: Path, where: str) -> None:
    store = new_memory_store()
    build(store, tmp_path / "w", versions=3)
    if where == "empty location":
        target = new_memory_store()
    elif where == "a sub-path (state/)":
        from blobstate.blobstore import open_blob_store

        target = open_blob_store(store.url + "/state")
    else:
        for name in store.list("commits/"):
            store.delete(name)
        target = store
    report = verify(target)
    assert report.problems, f"{where}: verify said ok"
    assert report.problems[0].object in ("metadata.json", "commits/")


def test_a_deleted_delta_below_a_snapshot_of_a_retained_version_is_named(tmp_path: Path) -> None:
    store = new_memory_store()
    results = build(store, tmp_path / "w", versions=8, every=3, retain=5)  # snapshots at 3 and 6
    victim = results[3]  # version 4: retained, below the snapshot of version 6
    assert victim.snapshot_name is None and results[5].snapshot_name is not None
    store.delete(victim.delta_name)
    problems = verify(store).problems
    assert [p.object for p in problems] == [victim.delta_name]
    assert problems[0].version == 4 and problems[0].uid == victim.checkpoint_id.uid


def test_a_truncated_blob_is_found_without_reading_it(tmp_path: Path) -> None:
    store = new_memory_store()
    results = build(store, tmp_path / "w", versions=6, every=3)
    index = json.loads(store.get(results[5].snapshot_name))
    blob = sorted(re.findall(r'"(blobs/[^"]+)"', json.dumps(index)))[0]
    store.put(blob, store.get(blob)[:-1])
    problems = verify(store).problems
    assert blob in {p.object for p in problems}
    assert any("where the index records" in p.message for p in problems if p.object == blob)


@pytest.mark.parametrize("alteration", ["emptied file list", "one changed digit of an SST name"])
def test_an_altered_snapshot_index_that_is_still_valid_json_is_named(tmp_path: Path, alteration: str) -> None:
    store = new_memory_store()
    results = build(store, tmp_path / "w", versions=6, every=3)
    name = results[5].snapshot_name
    data = store.get(name)
    if alteration == "emptied file list":
        raw = json.loads(data)
        raw["dirIndex"]["filesPresent"] = []
        altered = json.dumps(raw).encode()
    else:
        altered = re.sub(rb"(\d)(\.sst)", lambda m: b"%d" % ((int(m[1]) + 1) % 10) + m[2], data, count=1)
    assert altered != data
    json.loads(altered)
    store.put(name, altered)
    problems = verify(store).problems
    assert name in {p.object for p in problems}
    problem = next(p for p in problems if p.object == name)
    assert problem.version == 6 and "where the commit recorded" in problem.message
    # The version itself can still be rebuilt from the snapshot at 3 and the deltas after it; verify says so.
    assert "loading rebuilds it" in problem.message


def test_verify_names_the_snapshot_and_version_when_no_rebuild_is_possible(tmp_path: Path) -> None:
    store = new_memory_store()
    results = build(store, tmp_path / "w", versions=4, every=3, retain=1)  # only version 4 retained
    name = results[2].snapshot_name
    store.put(name, store.get(name)[:-2])
    problems = verify(store).problems
    assert [p.object for p in problems] == [name]
    assert "cannot be restored" in problems[0].message and delta_name(OP, 0, results[2].checkpoint_id)
    assert snapshot_name(OP, 0, results[2].checkpoint_id) == name
