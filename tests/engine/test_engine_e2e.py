"""End-to-end: blobstate queries on the shared Spark session, checked against plain-Python references.

Covers a running count over several batches, a restart on the same checkpoint (with empty local disks)
that resumes from the commit log and skips a batch Spark replays, the checks that stop a restart with
another partition count or key, event-time timers and late rows, and task retries that must not
duplicate outputs or mix two attempts' state.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    EVENT_BATCHES,
    EVENT_DDL,
    KV_DDL,
    RUNNING_COUNT_OUTPUT,
    SESSION_OUTPUT,
    SESSION_WATERMARK_DELAY_MS,
    T0,
    BatchRecorder,
    EventTimeSessions,
    RunningCount,
    event_table,
    expected_event_time_sessions,
    file_stream,
    kv_table,
    reference_running_count,
    run_blobstate,
    write_batch_files,
)

import blobstate
from blobstate.blobstore import open_blob_store
from blobstate.layout import state_prefix
from blobstate.lineage.commitlog import CommitLog, MetadataConflictError

pytestmark = pytest.mark.spark

KEYS = [f"k{i:02d}" for i in range(12)]


def kv_batches(n: int, rows: int = 60, seed: int = 7) -> list[list[tuple[str, int]]]:
    """``n`` batches of ``rows`` random ``(key, value)`` rows over :data:`KEYS`."""
    rng = random.Random(seed)
    return [[(rng.choice(KEYS), rng.randint(-50, 100)) for _ in range(rows)] for _ in range(n)]


def test_running_count_matches_reference_per_batch(spark: Any, tmp_path: Path) -> None:
    batches = kv_batches(4)
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches])
    out, reports = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        RunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        num_partitions=3,
        local_dir=tmp_path / "local",
    )
    assert out.rows == reference_running_count(batches)
    assert dict(out.calls) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert [r.input_rows for r in reports] == [60] * 4
    commit = CommitLog(open_blob_store(str(tmp_path / "ckpt"))).latest_commit()
    assert commit is not None and commit.version == 4
    assert sorted(commit.checkpoints["0"]) == [0, 1, 2]


def test_restart_resumes_from_commit_log_and_skips_a_replayed_batch(spark: Any, tmp_path: Path) -> None:
    batches = kv_batches(4, seed=11)
    expected = reference_running_count(batches)
    ckpt = tmp_path / "ckpt"
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches[:2]])
    first, _ = run_blobstate(
        spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local-1",
    )  # fmt: skip
    assert first.rows == {0: expected[0], 1: expected[1]}

    store = open_blob_store(str(ckpt))
    committed = {name: store.get(name) for name in store.list("commits/")}
    assert sorted(committed) == ["commits/1.json", "commits/2.json"]
    # Spark forgets it finished batch 1, so the restarted query replays it: it is already committed.
    for name in ("1", ".1.crc"):
        (ckpt / "_spark" / "commits" / name).unlink(missing_ok=True)
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches[2:]], first=2)

    # A new run with empty local disks (as on a new cluster) must restore state from the checkpoint.
    second, reports = run_blobstate(
        spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local-2",
    )  # fmt: skip
    assert [(r.batch_id, r.skipped) for r in reports] == [(1, True), (2, False), (3, False)]
    assert 1 not in second.calls, "the sink was called again for an already committed batch"
    assert second.rows == {2: expected[2], 3: expected[3]}
    assert reports[1].restore_bytes > 0
    for name, data in committed.items():
        assert store.get(name) == data, f"{name} changed"
    assert store.list("commits/") == ["commits/1.json", "commits/2.json", "commits/3.json", "commits/4.json"]


def test_a_lost_spark_checkpoint_stops_the_query_not_the_input(spark: Any, tmp_path: Path) -> None:
    """Finding 7: Spark's offsets checkpoint lost while blobstate's commit log holds versions."""
    import shutil

    from pyspark.errors import StreamingQueryException

    batches = kv_batches(3, seed=5)
    ckpt = tmp_path / "ckpt"
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches[:2]])
    run_blobstate(
        spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local",
    )  # fmt: skip
    log = CommitLog(open_blob_store(str(ckpt)))
    assert log.read_commit(2).source is not None, "the commit records where its batch came from"
    shutil.rmtree(ckpt / "_spark")  # Spark starts again at batch 0, now with three files of input
    write_batch_files(tmp_path / "in", [kv_table(batches[2])], first=2)
    recorder = BatchRecorder()
    with pytest.raises(StreamingQueryException) as raised:
        run_blobstate(
            spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
            local_dir=tmp_path / "local", sink=recorder,
        )  # fmt: skip
    message = str(raised.value)
    assert "SparkCheckpointMismatchError" in message and "was lost or replaced" in message
    assert "restore Spark's checkpoint directory" in message
    assert not recorder.calls, "no batch may be skipped or run on a checkpoint that does not belong"
    assert log.latest_version() == 2


class Raises(RunningCount):
    """A running count whose handler raises for one key, as it yields."""

    def handleInputRows(self, key, rows, timerValues):  # type: ignore[no-untyped-def]
        if key == ("k1",):
            raise ValueError("the processor's own message")
        yield from super().handleInputRows(key, rows, timerValues)


def test_a_processor_exception_reaches_the_user_with_its_key(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    write_batch_files(tmp_path / "in", [kv_table([("k0", 1), ("k1", 2)])])
    with pytest.raises(StreamingQueryException) as raised:
        run_blobstate(
            spark, tmp_path / "in", tmp_path / "ckpt", Raises(), output_schema=RUNNING_COUNT_OUTPUT,
            local_dir=tmp_path / "local",
        )  # fmt: skip
    first = str(raised.value).splitlines()[0]
    assert "ValueError: the processor's own message" in first, str(raised.value)[:2000]
    assert "handleInputRows for grouping key ('k1',)" in first and "partition" in first
    assert isinstance(raised.value.__cause__, StreamingQueryException)  # Spark's own, underneath


def test_restart_with_other_partitions_or_key_is_refused(spark: Any, tmp_path: Path) -> None:
    write_batch_files(tmp_path / "in", [kv_table([("a", 1), ("b", 2)])])
    ckpt = tmp_path / "ckpt"
    run_blobstate(
        spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
        num_partitions=2, local_dir=tmp_path / "local",
    )  # fmt: skip
    metadata = (ckpt / "metadata.json").read_bytes()

    def restart(**kwargs: Any) -> None:
        options: dict[str, Any] = {"key": "key", "num_partitions": 2, **kwargs}
        blobstate.transform_with_state(
            file_stream(spark, tmp_path / "in", KV_DDL),
            processor=RunningCount(),
            output_schema=RUNNING_COUNT_OUTPUT,
            checkpoint=str(ckpt),
            sink=lambda df, batch_id: None,
            local_dir=str(tmp_path / "local"),
            **options,
        )

    with pytest.raises(
        MetadataConflictError,
        match=r"2 partitions \(version 1, its newest commit\), the query asks for 3: pass allow_rescale=True",
    ):
        restart(num_partitions=3)
    with pytest.raises(MetadataConflictError, match=r"\['key'\].*\['key', 'value'\]"):
        restart(key=["key", "value"])
    assert not spark.streams.active
    assert (ckpt / "metadata.json").read_bytes() == metadata


def test_event_time_timers_fire_and_late_rows_are_dropped(spark: Any, tmp_path: Path) -> None:
    write_batch_files(tmp_path / "in", [event_table(b) for b in EVENT_BATCHES])
    out, _ = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        EventTimeSessions(),
        input_schema=EVENT_DDL,
        output_schema=SESSION_OUTPUT,
        local_dir=tmp_path / "local",
        time_mode="EventTime",
        event_time_column="ts",
        watermark_delay_ms=SESSION_WATERMARK_DELAY_MS,
    )
    assert out.rows == expected_event_time_sessions()
    commits = CommitLog(open_blob_store(str(tmp_path / "ckpt")))
    assert [commits.read_commit(v).watermark_ms for v in (1, 2, 3, 4)] == [
        T0 - 2_000,
        T0 + 25_000,
        T0 + 55_000,
        T0 + 56_000,
    ]


# ---------------------------------------------------------------------------------------------- retries
class FlakyCount(RunningCount):
    """RunningCount whose first attempt of a task fails on marker keys, outside the processor (a
    processor's own exception is not retried: it stops the query).

    On ``fail_before`` the task's partition commit fails before it uploads anything (nothing is
    committed); on ``fail_after`` it uploads its delta and then fails (the attempt's delta exists but
    must never be used).
    """

    def __init__(self, fail_before: str, fail_after: str) -> None:
        self.fail_before = fail_before
        self.fail_after = fail_after

    def init(self, handle: Any) -> None:
        """Declare the counters; note whether this is a task's first attempt."""
        from pyspark import TaskContext

        super().init(handle)
        context = TaskContext.get()
        self.first_attempt = context is not None and context.attemptNumber() == 0

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        """Count, failing on the marker keys in a first attempt."""
        if self.first_attempt and key[0] in (self.fail_before, self.fail_after):
            _fail_at_next_commit(upload=key[0] == self.fail_after)
        return super().handleInputRows(key, rows, timerValues)


def _fail_at_next_commit(upload: bool) -> None:
    """Fault injection in this worker: the next partition commit raises, after uploading its delta if
    ``upload``."""
    from blobstate.state.partition import PartitionState

    original = PartitionState.commit

    def commit(self: Any, uid: Any = None) -> Any:
        PartitionState.commit = original  # type: ignore[method-assign]
        if not upload:
            raise RuntimeError("injected failure before the commit")
        original(self, uid)
        raise RuntimeError("injected failure after the delta was uploaded")

    PartitionState.commit = commit  # type: ignore[method-assign]


def _one_key_per_partition(spark: Any, candidates: list[str], num_partitions: int) -> dict[int, str]:
    """The first candidate key that blobstate hashes to each partition."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(k,) for k in candidates], "key STRING")
    rows = df.select("key", F.pmod(F.hash("key"), F.lit(num_partitions)).alias("p")).collect()
    chosen: dict[int, str] = {}
    for row in rows:
        chosen.setdefault(row["p"], row["key"])
    assert len(chosen) == num_partitions
    return chosen


def test_retried_tasks_emit_once_and_commit_one_uid_per_partition(spark: Any, tmp_path: Path) -> None:
    markers = _one_key_per_partition(spark, [f"marker{i}" for i in range(20)], 2)
    batches = kv_batches(3, rows=40, seed=3)
    batches[1] += [(markers[0], 5), (markers[1], 7)]
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches])
    out, _ = run_blobstate(
        spark,
        tmp_path / "in",
        tmp_path / "ckpt",
        FlakyCount(fail_before=markers[0], fail_after=markers[1]),
        output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local",
    )
    assert out.rows == reference_running_count(batches)
    assert dict(out.calls) == {0: 1, 1: 1, 2: 1}

    store = open_blob_store(str(tmp_path / "ckpt"))
    commit = CommitLog(store).read_commit(2)  # batch 1
    uids = commit.checkpoints["0"]
    assert sorted(uids) == [0, 1]
    for partition in (0, 1):
        deltas = [n for n in store.list(state_prefix("0", partition)) if n.rsplit("/", 1)[1].startswith("2_")]
        chosen = f"{state_prefix('0', partition)}2_{uids[partition]}.delta"
        assert chosen in deltas and not store.has_ttl(chosen)
        others = [n for n in deltas if n != chosen]
        # partition 0 failed before uploading; partition 1's first attempt uploaded a delta that lost
        assert len(others) == partition, deltas
        for name in others:
            assert store.has_ttl(name), f"{name} of an attempt that did not commit was made permanent"
            assert name.rsplit("_", 1)[1].removesuffix(".delta") not in uids.values()


def test_a_spark_checkpoint_ahead_of_the_commit_log_is_refused(spark: Any, tmp_path: Path) -> None:
    """Spark would resume at batch 1, but blobstate's commits/1.json is gone while the objects its cleanup
    made permanent remain: a lost newest commit, refused at the start in one line (before Spark runs a
    batch), never run on empty state."""
    from blobstate.state.lost import LostCommitError

    write_batch_files(tmp_path / "in", [kv_table([("a", 1)])])
    ckpt = tmp_path / "ckpt"
    run_blobstate(
        spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
        local_dir=tmp_path / "local",
    )  # fmt: skip
    (ckpt / "commits" / "1.json").unlink()
    write_batch_files(tmp_path / "in", [kv_table([("a", 2)])], first=1)
    with pytest.raises(LostCommitError, match=r"start a query on .* its newest commits were lost"):
        run_blobstate(
            spark, tmp_path / "in", ckpt, RunningCount(), output_schema=RUNNING_COUNT_OUTPUT,
            local_dir=tmp_path / "local",
        )  # fmt: skip
    assert not (ckpt / "commits" / "2.json").exists()
