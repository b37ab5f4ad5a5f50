"""A streaming query continues on a rescaled checkpoint (real Spark, the session's one SparkSession).

A processing-time query (value, list and map state, TTL, processing-time timers, a partitioned adjunct
store) runs three batches on 2 partitions, then restarts with 4, 2, 3, 7 and 1 partitions
(``allow_rescale=True``), running a batch or two after each: every restart rescales before its first
batch; the first also skips the batch Spark replays (committed before the rescale). An event-time query
(timers fired by the watermark, late rows dropped by the watermark before) runs two batches on 3
partitions; a rescale to 7 dies right after its commit, as a driver that died before its first batch;
the query restarts without a partition count and continues on the rescaled checkpoint, then restarts
with 1 partition. Every output equals a plain-Python reference, and the state read at the last version
before each rescale equals the state read at the rescale's version."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rescale_checkpoints import frozen
from resume_jobs import (
    MAIN,
    OUTPUT,
    SIDE,
    VARIABLES,
    Ledger,
    main_batches,
    main_table,
    reference,
    side_batches,
    side_table,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_helpers import (
    EVENT_BATCHES,
    EVENT_DDL,
    SESSION_OUTPUT,
    SESSION_WATERMARK_DELAY_MS,
    BatchRecorder,
    EventTimeSessions,
    event_table,
    expected_event_time_sessions,
    run_to_end,
    spark_conf,
    write_batch_files,
)

import blobstate
from blobstate import Adjunct
from blobstate.blobstore import open_blob_store
from blobstate.encoding.codec import decode_key
from blobstate.lineage.commitlog import CommitLog
from blobstate.reader import TIMERS
from blobstate.reader.checkpoint import open_version, restored_partition
from blobstate.reader.plan import plan_read
from blobstate.reader.rows import partition_rows
from blobstate.rescale import rescale_checkpoint
from blobstate.state.verify import verify

pytestmark = pytest.mark.spark

NO_DATA_BATCHES = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}
"""Batches only for input files, so ``processAllAvailable`` returns (processing time would tick forever)."""


def state_rows(url: str, version: int, variables: tuple[str, ...], adjunct: str | None = None) -> Counter:
    """Every (variable, key, value) row the state reader returns at ``version`` (without the partition
    id), and each (key, value) record of a partitioned adjunct store, as a multiset."""
    rows: Counter = Counter()
    for var in (*variables, TIMERS):
        plan = plan_read(url, version=version, state_var=var)
        for p in plan.partitions:
            for row in partition_rows(url, plan.version, plan.operator, p, plan.state_var, plan.schema):
                rows[(var, frozen(row[:-1]))] += 1
    if adjunct is not None:
        with open_blob_store(url) as store:
            checkpoint = open_version(store, version)
            for p in range(len(checkpoint.commit.checkpoints["0"])):
                with restored_partition(store, checkpoint, "0", p) as rocks:
                    for key, value in rocks.items(f"$adjunct:{adjunct}"):
                        rows[(adjunct, decode_key(key, 1)[0], value)] += 1
    return rows


def start_ledger(spark: Any, base: Path, sink: Any, **options: Any) -> Any:
    def stream(name: str, schema: str) -> Any:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(base / name))

    return blobstate.transform_with_state(
        stream("main", MAIN),
        key="key",
        processor=Ledger(),
        output_schema=OUTPUT,
        checkpoint=str(base / "ckpt"),
        sink=sink,
        adjuncts=[Adjunct("tiers", stream("side", SIDE), key="who", value="tier", bootstrap=False)],
        time_mode="ProcessingTime",
        local_dir=str(base / "local"),
        async_cleanup=False,
        **options,
    )


CHAIN = (4, 2, 3, 7, 1)
"""The partition counts the processing-time query restarts with, after starting on 2: every pair of
2 -> 4, 4 -> 2, 3 -> 7 and 7 -> 1 (2 -> 3 leads from the second pair to the third)."""


def test_a_query_rescales_at_start_and_continues_with_every_state_kind(spark: Any, tmp_path: Path) -> None:
    batches = 3 + 2 + len(CHAIN) - 1  # 3 on 2 partitions, 2 after the first rescale, 1 after each other
    mains, sides = main_batches(batches, seed=8), side_batches(batches, seed=9)
    expected = reference(mains, sides)
    write_batch_files(tmp_path / "main", [main_table(b) for b in mains[:3]])
    write_batch_files(tmp_path / "side", [side_table(b) for b in sides[:3]])
    url = str(tmp_path / "ckpt")
    first = BatchRecorder()
    with spark_conf(spark, NO_DATA_BATCHES):
        run_to_end(start_ledger(spark, tmp_path, first, num_partitions=2))
    assert first.rows == {b: expected[b] for b in range(3)}
    before = state_rows(url, 3, VARIABLES, "tiers")
    assert any(var == TIMERS for var, *_ in before) and any(var == "tiers" for var, *_ in before)

    # The same count again needs no rescale; another one without allow_rescale is refused in one line.
    with pytest.raises(blobstate.BlobstateError) as refused:
        start_ledger(spark, tmp_path, first, num_partitions=4)
    assert str(refused.value).count("\n") == 0
    assert "records 2 partitions (version 3, its newest commit), the query asks for 4" in str(refused.value)
    assert "allow_rescale=True" in str(refused.value) and not spark.streams.active

    # Spark forgets it finished batch 2 (a driver that died after blobstate's commit): the restarted
    # query replays it after the rescale, and finds it committed.
    for name in ("2", ".2.crc"):
        (tmp_path / "ckpt" / "_spark" / "commits" / name).unlink(missing_ok=True)
    newest, batch, replayed = 3, 3, [(2, 4, True)]
    for count in CHAIN:
        runs = 2 if replayed else 1
        write_batch_files(
            tmp_path / "main", [main_table(b) for b in mains[batch : batch + runs]], first=batch
        )
        write_batch_files(
            tmp_path / "side", [side_table(b) for b in sides[batch : batch + runs]], first=batch
        )
        sink = BatchRecorder()
        with spark_conf(spark, NO_DATA_BATCHES):
            query = start_ledger(spark, tmp_path, sink, num_partitions=count, allow_rescale=True)
            run_to_end(query)
        rescaled = newest + 1  # the rescale's own version, before the first batch on the new layout
        assert [(r.batch_id, r.version, r.skipped) for r in blobstate.batch_reports(query)] == [
            *replayed,
            *((b, rescaled + 1 + i, False) for i, b in enumerate(range(batch, batch + runs))),
        ], f"restart with {count} partitions"
        assert sink.rows == {b: expected[b] for b in range(batch, batch + runs)}, f"{count} partitions"
        assert state_rows(url, rescaled, VARIABLES, "tiers") == before, f"rescale to {count} partitions"
        with open_blob_store(url) as store:
            log = CommitLog(store)
            layouts = [
                (c.num_partitions, c.layout_from) for c in map(log.read_commit, (rescaled, rescaled + runs))
            ]
            assert layouts == [(count, rescaled)] * 2
            assert log.read_metadata().num_partitions == 2  # metadata.json as first written
            assert verify(store).problems == []
        newest, batch, replayed = rescaled + runs, batch + runs, []
        before = state_rows(url, newest, VARIABLES, "tiers")


def test_a_restart_after_a_driver_died_between_the_rescale_commit_and_the_first_batch(
    spark: Any, tmp_path: Path
) -> None:
    expected = expected_event_time_sessions()
    write_batch_files(tmp_path / "in", [event_table(b) for b in EVENT_BATCHES[:2]])
    url = str(tmp_path / "ckpt")

    def run(**options: Any) -> tuple[BatchRecorder, list[Any]]:
        sink = BatchRecorder()
        with spark_conf(spark, NO_DATA_BATCHES):
            query = blobstate.transform_with_state(
                spark.readStream.schema(EVENT_DDL)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(tmp_path / "in")),
                key="key",
                processor=EventTimeSessions(),
                output_schema=SESSION_OUTPUT,
                checkpoint=url,
                sink=sink,
                local_dir=str(tmp_path / "local"),
                async_cleanup=False,
                time_mode="EventTime",
                event_time_column="ts",
                watermark_delay_ms=SESSION_WATERMARK_DELAY_MS,
                **options,
            )
            run_to_end(query)
        return sink, blobstate.batch_reports(query)

    first, _ = run(num_partitions=3)
    assert first.rows == {b: expected[b] for b in (0, 1)}
    before = state_rows(url, 2, ("session",))

    class Died(Exception):
        """The driver died here."""

    def die_after_commit(step: str) -> None:
        if step == "committed":
            raise Died(step)

    # What transform_with_state(num_partitions=7, allow_rescale=True) runs first, dying right after its
    # commit: the new layout is committed, its cleanup undone, no batch ran on it.
    with pytest.raises(Died):
        rescale_checkpoint(spark, url, 7, fault=die_after_commit)
    with open_blob_store(url) as store:
        report = verify(store)
        assert report.problems == [] and report.cleanup_pending  # its cleanup is pending: a note

    write_batch_files(tmp_path / "in", [event_table(EVENT_BATCHES[2])], first=2)
    second, reports = run()  # no partition count: the newest commit's
    assert [(r.batch_id, r.version) for r in reports] == [(2, 4)]
    assert second.rows == {2: expected[2]}  # late rows dropped, timers fired as before
    assert state_rows(url, 3, ("session",)) == before
    with open_blob_store(url) as store:
        log = CommitLog(store)
        assert [(c.num_partitions, c.layout_from) for c in map(log.read_commit, (3, 4))] == [(7, 3)] * 2
        assert verify(store).problems == []  # the start finished the rescale's cleanup

    # 7 -> 1 at the start of the next run: the watermark and the open sessions' timers move with the state.
    before = state_rows(url, 4, ("session",))
    write_batch_files(tmp_path / "in", [event_table(EVENT_BATCHES[3])], first=3)
    third, reports = run(num_partitions=1, allow_rescale=True)
    assert [(r.batch_id, r.version) for r in reports] == [(3, 6)]
    assert third.rows == {3: expected[3]}
    assert state_rows(url, 5, ("session",)) == before
    with open_blob_store(url) as store:
        log = CommitLog(store)
        assert [(c.num_partitions, c.layout_from) for c in map(log.read_commit, (5, 6))] == [(1, 5)] * 2
        assert verify(store).problems == []
