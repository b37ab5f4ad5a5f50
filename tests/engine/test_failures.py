"""Failure semantics of a blobstate query (docs/DESIGN.md, "One micro-batch"; "Placement and standby").

Each test breaks one thing a real deployment loses, then checks the promise users rely on: nothing of
an unfinished batch is committed, a restart retries it from the last commit, outputs and state stay
exactly those of a plain-Python reference, and an attempt that lost is never part of the lineage.

- the user's sink fails: the query stops with the sink's error and a restart retries the batch;
- the driver is killed (SIGKILL) while a batch is in flight, and restarted (subprocess job);
- an executor is killed between batches in ``local-cluster[2,1,1024]`` (subprocess job);
- another driver commits the version first, and a second query is started on the same checkpoint;
- a task fails after it committed its partition, and its retry's uid is the one committed.

The processor, its reference and the standalone job are in ``failure_jobs.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from failure_jobs import (
    INPUT_SCHEMA,
    FailAfterCommitProcessor,
    Recorder,
    make_batches,
    overwrite_by_batch_sink,
    read_output_dir,
    reference_outputs,
    start_query,
    write_inputs,
)

import blobstate
from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import commit_name, delta_name, snapshot_name, state_prefix
from blobstate.lineage.commitlog import Commit, CommitLog
from blobstate.lineage.delta import read_delta_lineage
from blobstate.snapshot import read_snapshot_index, referenced_objects

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
JOB = HERE / "failure_jobs.py"
PARTITIONS = 2


@contextmanager
def session_conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """Set one session conf value for the block, then restore what was there."""
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def deltas_of_version(store: Any, version: int) -> list[str]:
    """Deltas of ``version`` (any partition, any uid) present in the store."""
    return [
        name
        for p in range(PARTITIONS)
        for name in store.list(state_prefix("0", p))
        if name.rsplit("/", 1)[1].startswith(f"{version}_") and name.endswith(".delta")
    ]


def partition_metrics(commit: Commit) -> dict[int, dict[str, Any]]:
    """The per-partition metrics of a commit, by partition number."""
    return {int(p): m for p, m in (commit.metrics or {})["partitions"].items()}


# ---------------------------------------------------------------------------------------------- sink
def test_sink_failure_stops_the_query_and_a_restart_retries_the_batch(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    tables = make_batches(4)
    write_inputs(tables, tmp_path / "in")
    sink = Recorder(fail_on={2: ConnectionError("sink database unreachable while writing batch 2")})
    query = start_query(spark, tmp_path, sink)
    with pytest.raises(
        StreamingQueryException, match="sink database unreachable while writing batch 2"
    ) as raised:
        query.processAllAvailable()
    query.stop()
    first = str(raised.value).splitlines()[0]  # the sink's own exception first, not Spark's wrapper
    assert first.startswith("batch 2: the sink raised ConnectionError: sink database unreachable"), first
    assert not query.isActive

    store = open_blob_store(str(tmp_path / "ckpt"))
    log = CommitLog(store)
    # Batches 0 and 1 are versions 1 and 2; batch 2 (version 3) reached the sink and was not committed.
    assert log.versions() == [1, 2]
    assert not store.exists(commit_name(3))
    in_flight = deltas_of_version(store, 3)
    assert len(in_flight) == PARTITIONS, in_flight  # the tasks finished and uploaded their deltas ...
    assert all(store.has_ttl(n) for n in in_flight)  # ... which stay pending, never made permanent

    retry = Recorder()
    query = start_query(spark, tmp_path, retry)
    query.processAllAvailable()
    query.stop()
    assert [r.batch_id for r in blobstate.batch_reports(query)] == [2, 3]
    assert {**sink.rows, **retry.rows} == reference_outputs(tables)
    assert retry.calls == Counter({2: 1, 3: 1})

    commit = log.read_commit(3)
    assert not {delta_name("0", p, CheckpointId(3, u)) for p, u in commit.checkpoints["0"].items()} & set(
        in_flight
    )
    # The working stores were left clean at the uncommitted version 3: the retry starts from the
    # committed version 2 (the local checkpoint), never from them.
    assert {m["load_rule"] for m in partition_metrics(commit).values()} == {"local-checkpoint"}


# ---------------------------------------------------------------------------------------------- driver
def _job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *(p for p in sys.path if p)])
    return env


def _job(tmp_path: Path, *extra: str, master: str = "local[2]", local_dir: str | None = None) -> list[str]:
    return [
        sys.executable,
        str(JOB),
        "--master",
        master,
        "--input",
        str(tmp_path / "in"),
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--output",
        str(tmp_path / "out"),
        "--local-dir",
        local_dir or str(tmp_path / "local"),
        "--partitions",
        str(PARTITIONS),
        *extra,
    ]


def _wait_until_gone(pgid: int, timeout: float = 60.0) -> None:
    """Wait until no process of group ``pgid`` is left (Spark's Python daemon has its own group)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"processes of group {pgid} still alive {timeout}s after SIGKILL"
        time.sleep(0.1)


def _run_job(command: list[str], cwd: Path) -> list[dict[str, Any]]:
    """Run a job to its end; its JSON lines (also kept in ``job.out``), stderr in ``job.log``."""
    out, log = cwd / "job.out", cwd / "job.log"
    with out.open("w") as stdout, log.open("ab") as stderr:
        proc = subprocess.run(command, env=_job_env(), cwd=cwd, stdout=stdout, stderr=stderr, timeout=900)
    assert proc.returncode == 0, log.read_text(errors="replace")[-5000:]
    return _json_lines(out)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inline_output_bytes", "snapshot_every"),
    [(None, 2), (0, 2), (None, 3)],
    ids=["local-outputs", "persisted-outputs", "no-local-checkpoint"],
)
def test_driver_killed_mid_batch_restarts_with_exact_state(
    spark: Any, tmp_path: Path, inline_output_bytes: int | None, snapshot_every: int
) -> None:
    """A job process is SIGKILLed (driver, JVM and local executor) while batch 2 is in its sink; the
    restart hands the sink the same outputs. Both ways outputs reach the sink: small ones with the
    tasks' metadata (the default), and persisted on the executors (``inline_output_bytes=0``). With a
    snapshot every 3 versions, version 2 (the committed one the restart starts from) was not due, so
    its commit took no local checkpoint: the restart replays the committed deltas."""
    tables = make_batches(4)
    write_inputs(tables, tmp_path / "in")
    log = tmp_path / "job.log"
    inline = [] if inline_output_bytes is None else ["--inline-output-bytes", str(inline_output_bytes)]
    inline += ["--snapshot-every", str(snapshot_every)]
    options: dict[str, Any] = {"snapshot_every": snapshot_every}
    if inline_output_bytes is not None:
        options["inline_output_bytes"] = inline_output_bytes
    with log.open("ab") as errors:
        proc = subprocess.Popen(
            _job(tmp_path, "--hang-on-batch", "2", *inline),
            env=_job_env(),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,  # the driver's Python, its JVM and the local executor in one group
        )
        assert proc.stdout is not None
        try:
            lines = []
            for line in proc.stdout:
                if line.startswith("{"):
                    lines.append(json.loads(line))
                    if lines[-1].get("sink_hangs") == 2:
                        break
            else:
                pytest.fail(f"the job ended before batch 2 reached the sink: {log.read_text()[-3000:]}")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _wait_until_gone(proc.pid)
    assert [r["batch_id"] for r in lines if "batch_id" in r] == [0, 1]
    inlined = PARTITIONS if inline_output_bytes is None else 0
    assert {r["inlined_partitions"] for r in lines if "batch_id" in r} == {inlined}

    store = open_blob_store(str(tmp_path / "ckpt"))
    commits = CommitLog(store)
    assert commits.versions() == [1, 2]  # batch 2 was in the sink when the driver died
    orphans = deltas_of_version(store, 3)
    assert len(orphans) == PARTITIONS and all(store.has_ttl(n) for n in orphans)

    # The new driver: this test's Spark session, on the same checkpoint, local disk and output.
    query = start_query(spark, tmp_path, overwrite_by_batch_sink(tmp_path / "out"), **options)
    query.processAllAvailable()
    query.stop()
    reports = blobstate.batch_reports(query)
    assert [(r.batch_id, r.skipped) for r in reports] == [(2, False), (3, False)]
    assert [r.inlined_partitions for r in reports] == [inlined, inlined]
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)
    assert commits.versions() == [1, 2, 3, 4]
    batch2 = commits.read_commit(3)
    assert set(deltas_of_version(store, 3)) - set(orphans) == {
        delta_name("0", p, CheckpointId(3, u)) for p, u in batch2.checkpoints["0"].items()
    }
    local = tmp_path / "local"
    if snapshot_every == 2:
        assert {m["load_rule"] for m in partition_metrics(batch2).values()} == {"local-checkpoint"}
    else:
        # the commit of version 2 skipped the local checkpoint; the attempts at version 3 had a snapshot due
        taken = {p.name.split("_")[0] for p in local.rglob("checkpoints/*_*")}
        assert taken == {"3"}, taken
        assert {m["load_rule"] for m in partition_metrics(batch2).values()} == {"remote"}


# ---------------------------------------------------------------------------------------------- executor
@pytest.mark.slow
def test_executor_killed_between_batches_does_not_stop_the_query(tmp_path: Path) -> None:
    """local-cluster: the executor of partition 0 is SIGKILLed after batch 1; its partitions move.

    A relative ``local_dir`` resolves in each executor's own work directory, so the two executors have
    separate local disks, as on two machines: a moved partition must restore from the blob store.
    """
    import pyspark

    tables = make_batches(4)
    write_inputs(tables, tmp_path / "in")
    command = _job(
        tmp_path,
        "--kill-executor-after-batch",
        "1",
        master="local-cluster[2,1,1024]",
        local_dir="blobstate-local",
    )
    try:
        lines = _run_job(command, tmp_path)
    finally:
        # Executors' work directories (their logs and, here, their local state) are under pyspark's home.
        for app in [r["started"] for r in _json_lines(tmp_path / "job.out") if "started" in r]:
            shutil.rmtree(Path(pyspark.__file__).parent / "work" / app, ignore_errors=True)
    reports = {r["batch_id"]: r for r in lines if "batch_id" in r}
    assert sorted(reports) == [0, 1, 2, 3] and not any(r["skipped"] for r in reports.values())
    killed = reports[1]["killed"]["executor_id"]
    moved = sorted(int(p) for p, e in reports[1]["executors"].items() if e == killed)
    assert moved
    assert all(reports[2]["executors"][str(p)] != killed for p in moved)

    store = open_blob_store(str(tmp_path / "ckpt"))
    metrics = partition_metrics(CommitLog(store).read_commit(3))  # batch 2, the first after the kill
    for p in range(PARTITIONS):
        if p in moved:
            assert metrics[p]["load_rule"] == "remote" and metrics[p]["restore_bytes"] > 0, metrics
        else:
            assert metrics[p]["load_rule"] == "working" and metrics[p]["restore_bytes"] == 0, metrics
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)


def test_executor_killed_between_the_stage_and_the_sink_reruns_the_stage_never_mixes_attempts(
    tmp_path: Path,
) -> None:
    """local-cluster: in batch 2's sink, before it reads a row, the executor that holds partition 0's
    persisted outputs is SIGKILLed. Reading recomputes the partition as another attempt, which the sink's
    view refuses; the driver runs the stage again and the sink gets exactly the committed attempts'
    outputs (checked against the plain-Python reference)."""
    import pyspark

    tables = make_batches(4)
    write_inputs(tables, tmp_path / "in")
    command = _job(
        tmp_path,
        "--kill-executor-in-sink",
        "2",
        "--inline-output-bytes",
        "0",  # outputs persisted on the executors (small ones would reach the driver with the metadata)
        master="local-cluster[2,1,1024]",
        local_dir="local",
    )
    try:
        lines = _run_job(command, tmp_path)
    finally:
        for app in [r["started"] for r in _json_lines(tmp_path / "job.out") if "started" in r]:
            shutil.rmtree(Path(pyspark.__file__).parent / "work" / app, ignore_errors=True)
    assert any("killed_in_sink" in r for r in lines), "the fault was not injected"
    reports = {r["batch_id"]: r for r in lines if "batch_id" in r}
    assert sorted(reports) == [0, 1, 2, 3]
    assert reports[2]["stage_attempts"] >= 2 and reports[1]["stage_attempts"] == 1
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)


# ---------------------------------------------------------------------------------------------- ownership
def test_a_commit_by_another_driver_stops_the_query(spark: Any, tmp_path: Path) -> None:
    """Another driver writes ``commits/2`` while this one runs batch 1: this one must stop, not overwrite."""
    from pyspark.errors import StreamingQueryException

    write_inputs(make_batches(3), tmp_path / "in")
    store = open_blob_store(str(tmp_path / "ckpt"))

    class Intruder(Recorder):
        def __call__(self, frame: Any, batch_id: int) -> None:
            super().__call__(frame, batch_id)
            if batch_id == 1:  # after this batch's tasks committed, before this driver commits
                log = CommitLog(store)
                previous = log.read_commit(1)
                log.write_commit(
                    Commit(
                        version=2,
                        checkpoints=previous.checkpoints,
                        objects=previous.objects,
                        retained_from=previous.retained_from,
                        writer="other-driver",
                    )
                )

    query = start_query(spark, tmp_path, Intruder())
    with pytest.raises(StreamingQueryException) as raised:
        query.processAllAvailable()
    query.stop()
    message = str(raised.value)
    # the cause on the first line, as for a processor's failure, not Spark's foreachBatch wrapper
    assert isinstance(raised.value, blobstate.BlobstateQueryError)
    first = message.splitlines()[0]
    assert first.startswith("CommitConflictError: ") and "another driver owns the query" in first, first
    assert "'other-driver'" in message
    log = CommitLog(store)
    assert log.versions() == [1, 2] and log.read_commit(2).writer == "other-driver"  # not overwritten
    assert log.read_commit(1).writer != "other-driver"


def test_second_query_on_the_same_checkpoint_in_one_session(spark: Any, tmp_path: Path) -> None:
    """A second start on a checkpoint whose query is running fails clearly and leaves the first alone;
    once the first is stopped, a new start takes over and state stays exact."""
    from blobstate.engine.query import QueryAlreadyRunningError

    tables = make_batches(4)
    write_inputs(tables[:2], tmp_path / "in")
    first_sink = Recorder()
    first = start_query(spark, tmp_path, first_sink)
    try:
        first.processAllAvailable()
        with pytest.raises(QueryAlreadyRunningError, match="already running on"):
            start_query(spark, tmp_path, Recorder())
        assert first.isActive
    finally:
        first.stop()
    second_sink = Recorder()
    second = start_query(spark, tmp_path, second_sink)
    try:
        write_inputs(tables[2:], tmp_path / "in", first=2)
        second.processAllAvailable()
    finally:
        second.stop()
    assert [r.batch_id for r in blobstate.batch_reports(second)] == [2, 3]
    assert {**first_sink.rows, **second_sink.rows} == reference_outputs(tables)


# ---------------------------------------------------------------------------------------------- attempts
def test_task_failing_after_its_partition_commit_is_retried_and_its_objects_never_referenced(
    spark: Any, tmp_path: Path
) -> None:
    """Batch 1 is due a snapshot; the first attempt of the task with key ``boom`` uploads its delta,
    snapshot and blobs, then fails. Its retry commits another uid, and no later version builds on the
    loser: every delta's lineage and every snapshot (version 4's is incremental on version 2's) are
    checked against the commit log.
    """
    import pyarrow as pa

    tables = make_batches(4)
    tables[1] = pa.concat_tables([tables[1], pa.table({"k": ["boom"], "v": [7]}, schema=INPUT_SCHEMA)])
    write_inputs(tables, tmp_path / "in")
    record = tmp_path / "failed-attempt.json"
    sink = Recorder()
    # Inline snapshots: the lost attempt's own commit uploads one (background uploads finish later).
    query = start_query(
        spark,
        tmp_path,
        sink,
        processor=FailAfterCommitProcessor("boom", str(record)),
        snapshot_upload="inline",
    )
    query.processAllAvailable()
    query.stop()
    assert sink.rows == reference_outputs(tables)
    assert sink.calls == Counter(dict.fromkeys(range(4), 1))

    failed = json.loads(record.read_text())
    loser = CheckpointId.parse(failed["checkpoint"])
    loser_objects = set(failed["objects"])
    assert loser.version == 2
    partition = int(failed["objects"][0].split("/")[2])
    assert snapshot_name("0", partition, loser) in loser_objects  # the lost attempt had snapshotted

    store = open_blob_store(str(tmp_path / "ckpt"))
    log = CommitLog(store)
    versions = log.versions()
    assert versions == [1, 2, 3, 4]
    uids = {v: log.read_commit(v).checkpoints["0"][partition] for v in versions}
    assert uids[2] != loser.uid
    for name in loser_objects:  # still there for inspection, pending: it expires, it is never permanent
        assert store.exists(name) and store.has_ttl(name), name
    snapshots = [v for v in versions if store.exists(snapshot_name("0", partition, CheckpointId(v, uids[v])))]
    assert snapshots == [2, 4]
    for v in versions:
        cid = CheckpointId(v, uids[v])
        lineage = read_delta_lineage(store.get(delta_name("0", partition, cid)), name=cid.name)
        assert lineage == [uids[v - 1 - i] for i in range(len(lineage))], (v, lineage)
        assert loser.uid not in lineage
        if store.exists(snapshot_name("0", partition, cid)):
            index = read_snapshot_index(store, snapshot_name("0", partition, cid))
            assert not referenced_objects(snapshot_name("0", partition, cid), index) & loser_objects, v
