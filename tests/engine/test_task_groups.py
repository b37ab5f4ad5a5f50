"""A processing stage whose tasks run groups of state partitions (``QueryConfig.partitions_per_task``).

What users depend on: grouping changes how many Spark tasks a batch takes, never what the query
computes. Outputs equal a plain-Python reference whether the sink reads the outputs inlined with the
tasks' metadata or from the persisted stage (whose check of each partition's attempt now meets
several headers per task); a restart with another grouping continues the same state; a task that
fails after some partitions of its group committed is retried whole, and the commit names the
retry's uids only; a processor's exception names its partition. Spark itself runs fewer tasks: the
processing stage's task count is read from Spark's status tracker.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from failure_jobs import (
    INPUT_SCHEMA,
    FailAfterCommitProcessor,
    Recorder,
    TotalsProcessor,
    make_batches,
    reference_outputs,
    start_query,
    write_inputs,
)

import blobstate
from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

PARTITIONS = 6


def _start(spark: Any, tmp_path: Path, sink: Any, processor: Any = None, **options: Any) -> Any:
    return start_query(spark, tmp_path, sink, processor, partitions=PARTITIONS, **options)


def _run(spark: Any, tmp_path: Path, sink: Any, **options: Any) -> tuple[list[Any], list[int]]:
    """Run the query on what is there; its reports and the task counts of its Python stages."""
    query = _start(spark, tmp_path, sink, **options)
    try:
        query.processAllAvailable()
        return blobstate.batch_reports(query), _processing_stage_tasks(spark, query)
    finally:
        query.stop()


def _processing_stage_tasks(spark: Any, query: Any) -> list[int]:
    """The task counts of the stages Spark ran for ``query`` that ran Python (the processing stage, and
    the sink's read of its persisted outputs), from Spark's status tracker."""
    tracker = spark.sparkContext.statusTracker()
    counts = []
    for job_id in tracker.getJobIdsForGroup(str(query.runId)):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None and stage.numTasks > 1:
                counts.append(stage.numTasks)
    return counts


def test_grouped_tasks_compute_what_a_task_per_partition_computes(spark: Any, tmp_path: Path) -> None:
    """Batches 0-1 with 4 partitions a task, the outputs persisted (no inlining); batches 2-3 after a
    restart with 5 a task, inlined; batches 4-5 after a restart with a task per partition. Every batch
    equals the reference, the reports count the stage's tasks, and Spark ran that many."""
    tables = make_batches(6)
    write_inputs(tables[:2], tmp_path / "in")
    sink = Recorder()
    reports, spark_tasks = _run(spark, tmp_path, sink, partitions_per_task=4, inline_output_bytes=0)
    assert [(r.batch_id, r.stage_tasks, r.inlined_partitions) for r in reports] == [(0, 2, 0), (1, 2, 0)]
    assert spark_tasks and set(spark_tasks) == {2}, spark_tasks  # groups (0-3) and (4, 5), never 6

    write_inputs(tables[2:4], tmp_path / "in", first=2)
    reports, _ = _run(spark, tmp_path, sink, partitions_per_task=5)
    assert [(r.batch_id, r.stage_tasks, r.inlined_partitions) for r in reports] == [(2, 2, 6), (3, 2, 6)]

    write_inputs(tables[4:], tmp_path / "in", first=4)
    reports, _ = _run(spark, tmp_path, sink, partitions_per_task=1)
    assert [(r.batch_id, r.stage_tasks) for r in reports] == [(4, 6), (5, 6)]
    assert sink.rows == reference_outputs(tables)
    assert sink.calls == Counter(dict.fromkeys(range(6), 1))
    state = {
        r.key[0]: (r.value["count"], r.value["total"])
        for r in blobstate.read_state(spark, str(tmp_path / "ckpt")).collect()
    }
    last = {k: (c, t) for batch in reference_outputs(tables).values() for k, c, t in batch}
    assert state == last


def test_a_group_task_failing_after_some_partitions_committed_is_retried_whole(
    spark: Any, tmp_path: Path
) -> None:
    """One task runs all six partitions. Its first attempt of batch 1 fails right after the partition
    holding key ``boom`` committed (others of the group committed before it, or come after it); Spark
    retries the task, the batch commits the retry's uids, and every batch equals the reference."""
    tables = make_batches(4)
    tables[1] = pa.concat_tables([tables[1], pa.table({"k": ["boom"], "v": [7]}, schema=INPUT_SCHEMA)])
    write_inputs(tables, tmp_path / "in")
    record = tmp_path / "failed-attempt.json"
    sink = Recorder()
    query = _start(
        spark,
        tmp_path,
        sink,
        processor=FailAfterCommitProcessor("boom", str(record)),
        partitions_per_task=PARTITIONS,
        inline_output_bytes=0,
    )
    try:
        query.processAllAvailable()
        reports = blobstate.batch_reports(query)
    finally:
        query.stop()
    assert record.exists(), "the injected failure did not fire"
    assert [r.stage_tasks for r in reports] == [1, 1, 1, 1]
    assert sink.rows == reference_outputs(tables)
    assert sink.calls == Counter(dict.fromkeys(range(4), 1))
    failed = json.loads(record.read_text())
    loser = CheckpointId.parse(failed["checkpoint"])
    partition = int(failed["objects"][0].split("/")[2])
    commit = CommitLog(open_blob_store(str(tmp_path / "ckpt"))).read_commit(loser.version)
    assert commit.checkpoints["0"][partition] != loser.uid
    retried = {int(p): m for p, m in (commit.metrics or {})["partitions"].items()}
    assert sorted(retried) == list(range(PARTITIONS))


def test_a_processor_exception_in_a_group_task_names_its_partition(spark: Any, tmp_path: Path) -> None:
    tables = make_batches(1)
    tables[0] = pa.concat_tables([tables[0], pa.table({"k": ["bad"], "v": [-1]}, schema=INPUT_SCHEMA)])
    write_inputs(tables, tmp_path / "in")
    query = _start(spark, tmp_path, Recorder(), processor=_RaisesOn("bad"), partitions_per_task=3)
    try:
        with pytest.raises(
            Exception, match=r"ValueError: no 'bad' here.*\(partition \d of operator 0, batch 0\)"
        ):
            query.processAllAvailable()
    finally:
        query.stop()
    assert not CommitLog(open_blob_store(str(tmp_path / "ckpt"))).versions()


class _RaisesOn(TotalsProcessor):
    def __init__(self, key: str) -> None:
        self.key = key

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        if key[0] == self.key:
            raise ValueError(f"no {self.key!r} here")
        yield from super().handleInputRows(key, rows, timerValues)


def test_the_committed_outputs_view_checks_every_header_of_a_group(spark: Any) -> None:
    """The persisted stage's view (``CommittedOutputs``) passes a group's output rows when its headers
    carry the committed uids in order, and fails the task when any of them is another attempt's."""
    from blobstate.engine.jvm.classic import ClassicJvm
    from blobstate.engine.outputs import is_attempt_mismatch
    from blobstate.engine.task import META_COLUMN, UID_COLUMN

    rows = [  # one stage partition: partitions 3 and 4 of a group, each header, output, metadata
        ("u3", None, None),
        (None, None, "a"),
        (None, "{}", None),
        ("u4", None, None),
        (None, None, "b"),
        (None, None, "c"),
        (None, "{}", None),
    ]
    stage = spark.createDataFrame(rows, f"{UID_COLUMN} string, {META_COLUMN} string, out string").coalesce(1)
    seam = ClassicJvm(spark)
    assert seam.load_helper()
    view = seam.committed_only(stage, UID_COLUMN, META_COLUMN, ["u3,u4"], "batch 9")
    assert sorted(r["out"] for r in view.collect()) == ["a", "b", "c"]
    for uids in (["u3,u5"], ["u3"], ["u3,u4,u6"], ["u4,u3"]):
        with pytest.raises(Exception) as failure:
            seam.committed_only(stage, UID_COLUMN, META_COLUMN, uids, "batch 9").collect()
        assert is_attempt_mismatch(failure.value), uids
