"""Background snapshot uploads: named late, only once complete; restorable, retained,
verified; a failed or killed upload is reported and never referenced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lineage_harness import (
    OP,
    Driver,
    FaultyStore,
    GatedStore,
    dump,
    forget_process_memory,
    on_tmpfs,
    open_p,
)

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import snapshot_name
from blobstate.lineage.refs import ObjectRef
from blobstate.state.retention import gc_checkpoint, referenced_by_retained
from blobstate.state.uploads import wait_for_uploads
from blobstate.state.verify import verify

FAR_FUTURE = 2**40


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """Local directories on tmpfs when there is one."""
    forget_process_memory()
    with on_tmpfs(tmp_path) as path:
        yield path


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A real local-directory store or a bucket on the moto S3 server."""
    if request.param == "local":
        return str(tmp_path / "bucket")
    return request.getfixturevalue("s3_url")


class Query:
    """One partition driven version by version with background snapshots, and a plain-dict model."""

    def __init__(self, store: BlobStore, local: Path, *, every: int, retain: int = 1000) -> None:
        self.store, self.local, self.every = store, local, every
        self.driver = Driver(store, retain=retain)
        self.models: dict[int, dict] = {0: {}}
        self.cids: dict[int, CheckpointId] = {}
        self.commits: dict[int, Any] = {}
        self.version = 0

    def step(self, *, cleanup: bool = True, mode: str = "background") -> Any:
        v = self.version + 1
        values = {b"k%d" % (v % 7): b"v%d" % v, b"n%d" % v: b"x" * 200}
        committed = self.cids.get(self.version)
        with open_p(self.store, self.local, committed, snapshot_every=self.every, snapshot_upload=mode) as s:
            for k, value in values.items():
                s.store.put("a", k, value)
            result = s.commit()
        self.version = v
        self.cids[v] = result.checkpoint_id
        self.models[v] = {**self.models[v - 1], **{("a", k): value for k, value in values.items()}}
        commit = self.driver.commit({0: result}, v)
        self.commits[v] = commit
        if cleanup:
            self.driver.cleanup(commit)
        return result

    def restore(self, version: int, where: Path) -> tuple[dict, Any]:
        with open_p(self.store, where, self.cids[version]) as s:
            assert s.load_rule == "remote"
            return dump(s), s.load_report


def late_names(q: Query) -> dict[int, str]:
    """Commit version -> the checkpoint whose snapshot it names late."""
    out = {}
    for v, commit in q.commits.items():
        late = commit.objects_of(OP, 0).late_snapshot
        if late is not None:
            out[v] = late.checkpoint_name
    return out


def test_a_background_snapshot_is_named_only_once_complete(store_url: str, tmp_path: Path) -> None:
    inner = open_blob_store(store_url)
    store = GatedStore(inner)
    q = Query(store, tmp_path / "w", every=2)
    q.step()
    store.gate.clear()
    r2 = q.step()  # due: its upload starts and blocks
    assert r2.objects.snapshot is None and r2.snapshot_upload["started"] == q.cids[2].name
    assert store.blocked.wait(30)
    r3 = q.step()  # the upload of version 2 is in flight: nothing names it
    assert r3.objects.late_snapshot is None
    assert r3.snapshot_upload["in_flight"] == [q.cids[2].name]
    assert not inner.exists(snapshot_name(OP, 0, q.cids[2]))
    store.gate.set()
    assert wait_for_uploads(60)
    r4 = q.step()
    late = r4.objects.late_snapshot
    assert late is not None and late.checkpoint_name == q.cids[2].name
    data = inner.get(snapshot_name(OP, 0, q.cids[2]))
    assert late.index == ObjectRef.of(data)
    assert r4.snapshot_upload["started"] == q.cids[4].name  # version 4 is due too, on the next thread
    assert wait_for_uploads(60)
    r5 = q.step()
    assert r5.objects.late_snapshot.checkpoint_name == q.cids[4].name
    # A load of version 3 (committed before the name) walks past it; versions from 4 on use it.
    assert q.restore(3, tmp_path / "r3")[1].base_kind == "empty"
    state, report = q.restore(4, tmp_path / "r4")
    assert state == q.models[4] and report.base == q.cids[2].name and report.base_kind == "snapshot"
    state, report = q.restore(5, tmp_path / "r5")
    assert state == q.models[5] and report.base == q.cids[4].name
    assert verify(inner).problems == []


def test_restores_from_late_named_snapshots_equal_the_reference(store_url: str, tmp_path: Path) -> None:
    inner = open_blob_store(store_url)
    store = GatedStore(inner)
    q = Query(store, tmp_path / "w", every=3, retain=4)
    for v in range(1, 25):
        # Every other upload stays in flight across two more commits, so names come one or three late.
        if v % 6 == 3:
            store.gate.clear()
        if v % 6 == 5:
            store.gate.set()
            assert wait_for_uploads(60)
        q.step()
        if v % 6 != 3 and v % 6 != 4:
            assert wait_for_uploads(60)
        assert verify(inner).problems == [], v
    store.gate.set()
    assert wait_for_uploads(60)
    assert len(late_names(q)) >= 6
    for version in range(q.version - 3, q.version + 1):
        state, _ = q.restore(version, tmp_path / f"r{version}")
        assert state == q.models[version], version
    # What the retained versions reference is all that must stay: expiring everything pending keeps them.
    gc_checkpoint(inner, full=True, now=FAR_FUTURE)
    assert verify(inner).problems == []
    for version in range(q.version - 3, q.version + 1):
        assert q.restore(version, tmp_path / f"again{version}")[0] == q.models[version]


def test_versions_committed_before_a_late_name_stay_restorable(tmp_path: Path) -> None:
    """Retention keeps the older base for retained versions that cannot see a snapshot named later."""
    inner = open_blob_store(str(tmp_path / "bucket"))
    store = GatedStore(inner)
    q = Query(store, tmp_path / "w", every=3, retain=3)
    for _ in range(2):
        q.step()
    store.gate.clear()
    q.step()  # 3 is due: its upload blocks
    q.step()  # 4: no snapshot yet (3 is in flight)
    q.step()  # 5
    store.gate.set()
    assert wait_for_uploads(60)
    q.step()  # 6 names the snapshot of 3; retained 4..6, of which 4 and 5 load through version 0
    assert late_names(q) == {6: q.cids[3].name}
    gc_checkpoint(inner, full=True, now=FAR_FUTURE)
    for version in (4, 5, 6):
        assert q.restore(version, tmp_path / f"r{version}")[0] == q.models[version]
    assert verify(inner).problems == []


def test_a_failed_background_upload_is_reported_in_the_next_commit_and_never_named(tmp_path: Path) -> None:
    inner = open_blob_store(str(tmp_path / "bucket"))
    store = FaultyStore(inner)
    q = Query(store, tmp_path / "w", every=2)
    q.step()
    failing = [True]  # background uploads run on a view of the store (own I/O pool): share the switch
    store.fail_when = lambda op, name: failing[0] and op == "put" and name.startswith("blobs/")
    q.step()
    assert wait_for_uploads(60)
    failing[0] = False
    r3 = q.step()
    assert r3.objects.late_snapshot is None
    [failure] = r3.snapshot_upload["failed"]
    assert failure.startswith(q.cids[2].name) and "injected failure" in failure
    assert q.step().snapshot_upload["started"] == q.cids[4].name  # the next snapshot is simply taken later
    assert wait_for_uploads(60)
    assert q.step().objects.late_snapshot.checkpoint_name == q.cids[4].name
    assert q.restore(5, tmp_path / "r")[0] == q.models[5]
    assert verify(inner).problems == []


KILLED_WORKER = """
import json, sys, time
sys.path.insert(0, {tests!r})
from lineage_harness import open_p
from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from slow_store import SlowStore

store = SlowStore(open_blob_store({url!r}))
committed = CheckpointId.parse({committed!r})
with open_p(store, {local!r}, committed, snapshot_every=2, snapshot_upload="background") as s:
    s.store.put("a", b"killed", b"but committed")
    result = s.commit()
print(json.dumps({{"uid": result.checkpoint_id.uid, "objects": result.objects.to_json()}}), flush=True)
time.sleep(600)  # the upload runs on; the test kills this process mid-upload
"""

SLOW_STORE = """
import time
from lineage_harness import FaultyStore

class SlowStore(FaultyStore):
    def _put_bytes(self, name, data, ttl):
        if name.startswith("blobs/"):
            time.sleep(0.5)
        super()._put_bytes(name, data, ttl)

    def _put_file(self, name, path, ttl):
        if name.startswith("blobs/"):
            time.sleep(0.5)
        super()._put_file(name, path, ttl)
"""


def test_a_worker_killed_mid_upload_leaves_no_reference_and_gc_keeps_the_committed(tmp_path: Path) -> None:
    url = str(tmp_path / "bucket")
    inner = open_blob_store(url)
    q = Query(inner, tmp_path / "w", every=2, retain=4)
    q.step()
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "slow_store.py").write_text(SLOW_STORE)
    script = KILLED_WORKER.format(
        tests=str(Path(__file__).parent), url=url, committed=q.cids[1].name, local=str(q.local)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(helpers), *sys.path])}
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = worker.stdout.readline()
        assert line, "the worker died before committing"
        out = json.loads(line)
        deadline = time.monotonic() + 30
        while not inner.list("blobs/") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inner.list("blobs/"), "the upload never started"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    # The driver commits the killed worker's version 2: its snapshot was still uploading.
    from blobstate.lineage.refs import PartitionObjects
    from blobstate.state.partition import CommitResult

    cid2 = CheckpointId(2, out["uid"])
    objects = PartitionObjects.from_json(out["objects"])
    assert objects.snapshot is None and objects.late_snapshot is None
    fake = CommitResult(cid2, "", None, objects, (), 0, 0, 0.0)
    q.cids[2], q.version = cid2, 2
    q.models[2] = {**q.models[1], ("a", b"killed"): b"but committed"}
    q.commits[2] = q.driver.commit({0: fake}, 2)
    q.driver.cleanup(q.commits[2])
    assert not inner.exists(snapshot_name(OP, 0, cid2)), "the upload was killed before its index"
    r3 = q.step()
    assert r3.objects.late_snapshot is None
    assert any("died mid-upload" in f for f in r3.snapshot_upload["failed"]), r3.snapshot_upload
    for _ in range(4):
        q.step()
    assert wait_for_uploads(60)
    q.step()
    assert cid2.name not in late_names(q).values()
    gc_checkpoint(inner, full=True, now=FAR_FUTURE)  # the partial upload's pending objects go
    referenced = referenced_by_retained(inner, q.driver.log.read_commit(q.version))
    assert referenced <= set(inner.list("state/")) | set(inner.list("blobs/"))
    assert verify(inner).problems == []
    for version in range(q.version - 3, q.version + 1):
        assert q.restore(version, tmp_path / f"r{version}")[0] == q.models[version]


def test_verify_checks_late_named_snapshots(tmp_path: Path) -> None:
    inner = open_blob_store(str(tmp_path / "bucket"))
    q = Query(inner, tmp_path / "w", every=2, retain=3)
    for _ in range(2):
        q.step()
    assert wait_for_uploads(60)
    q.step()
    assert late_names(q) == {3: q.cids[2].name}
    name = snapshot_name(OP, 0, q.cids[2])
    data = inner.get(name)
    inner.delete(name)
    inner.put(name, data[:-1] + b" ")
    problems = verify(inner).problems
    assert [p.object for p in problems] == [name]
    assert "SHA-256" in problems[0].message and problems[0].version == 2


def test_a_reader_of_a_version_restores_its_snapshot_once_a_later_commit_named_it(tmp_path: Path) -> None:
    """The snapshot of version 3, uploaded in the background, is committed once the commit of 4 names
    it: a reader of version 3 (read_state, inspect, restore) then restores it instead of replaying three
    deltas from empty. Before that commit is durable the same complete upload is never used."""
    from blobstate.reader.checkpoint import open_version, restore_into

    inner = open_blob_store(str(tmp_path / "bucket"))
    q = Query(inner, tmp_path / "w", every=3, retain=3)

    def read(version: int, name: str) -> tuple[dict, Any]:
        loaded = restore_into(
            inner, open_version(inner, version), OP, 0, tmp_path / name, tmp_path / f"l{name}"
        )
        try:
            return dump(loaded.store), loaded.report
        finally:
            loaded.store.close()

    for _ in range(3):
        q.step()
    assert wait_for_uploads(60)
    assert inner.exists(snapshot_name(OP, 0, q.cids[3]))  # complete, but no commit names it yet
    state, report = read(3, "before")
    assert state == q.models[3]
    assert (report.base_kind, report.deltas_replayed) == ("empty", 3)

    q.step()
    assert late_names(q) == {4: q.cids[3].name}
    gc_checkpoint(inner, full=True, now=FAR_FUTURE)  # retention keeps what the reader restores
    state, report = read(3, "after")
    assert state == q.models[3]
    assert (report.base_kind, report.base) == ("snapshot", q.cids[3].name)
    assert report.deltas_replayed == report.delta_bytes == 0
    assert report.bytes_downloaded == sum(blob.size for _, blob in report.snapshot_index.iter_present_files())
    # version 2 has no snapshot of its own or below it: still its deltas from empty
    state, report = read(2, "v2")
    assert state == q.models[2] and (report.base_kind, report.deltas_replayed) == ("empty", 2)
    # a restart whose newest commit is 4 restores the snapshot of 3 and one delta
    state, report = q.restore(4, tmp_path / "restart")
    assert state == q.models[4]
    assert (report.base, report.deltas_replayed) == (q.cids[3].name, 1)
    assert verify(inner).problems == []
