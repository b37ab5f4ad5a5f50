"""The input's ``withWatermark`` read from Spark's plan, and reconciled with blobstate's options."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from engine_helpers import (
    EVENT_BATCHES,
    EVENT_DDL,
    SESSION_OUTPUT,
    SESSION_WATERMARK_DELAY_MS,
    BatchRecorder,
    EventTimeSessions,
    event_table,
    expected_event_time_sessions,
    file_stream,
    run_to_end,
    write_batch_files,
)

from blobstate.engine.config import QueryConfig, QueryConfigError, resolve_event_time
from blobstate.engine.watermark import InputWatermark, InputWatermarkError, input_watermark

TEN_MINUTES = InputWatermark(event_time_column="event_time", delay_ms=600_000, delay="10 minutes")


@pytest.fixture
def stream(spark: Any, tmp_path: Path) -> Any:
    """A streaming DataFrame over a directory of parquet files (no query is started)."""
    table = pa.table(
        {
            "user": ["u1"],
            "event_time": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet")
    return spark.readStream.schema("user STRING, event_time TIMESTAMP").parquet(str(tmp_path))


# ------------------------------------------------------------------------------- reading Spark's plan


@pytest.mark.spark
def test_an_input_without_watermark_has_none(stream: Any) -> None:
    assert input_watermark(stream) is None
    assert input_watermark(stream.select("user")) is None


@pytest.mark.spark
@pytest.mark.parametrize(
    ("delay", "ms"),
    [
        ("10 minutes", 600_000),
        ("1 hour 30 seconds", 3_630_000),
        ("2 days", 172_800_000),
        ("250 milliseconds", 250),
    ],
)
def test_one_watermark_gives_its_column_and_delay(stream: Any, delay: str, ms: int) -> None:
    found = input_watermark(stream.withWatermark("event_time", delay).select("user", "event_time"))
    assert found is not None
    assert (found.event_time_column, found.delay_ms) == ("event_time", ms)


@pytest.mark.spark
def test_a_renamed_event_time_column_is_followed(stream: Any) -> None:
    renamed = stream.withWatermark("event_time", "10 minutes").withColumnRenamed("event_time", "ts")
    found = input_watermark(renamed)
    assert found is not None and (found.event_time_column, found.delay_ms) == ("ts", 600_000)


@pytest.mark.spark
def test_several_watermarks_are_refused_naming_them(stream: Any) -> None:
    union = stream.withWatermark("event_time", "10 minutes").union(
        stream.withWatermark("event_time", "5 minutes")
    )
    with pytest.raises(InputWatermarkError) as raised:
        input_watermark(union)
    assert str(raised.value) == (
        "the input declares 2 event-time watermarks (withWatermark('event_time', '10 minutes'),"
        " withWatermark('event_time', '5 minutes')); blobstate follows one: call withWatermark once, on"
        " the input of the stateful query"
    )
    twice = stream.withWatermark("event_time", "10 minutes").withWatermark("event_time", "5 minutes")
    with pytest.raises(InputWatermarkError, match="declares 2 event-time watermarks"):
        input_watermark(twice)


@pytest.mark.spark
def test_a_delay_in_months_is_refused(stream: Any) -> None:
    with pytest.raises(InputWatermarkError) as raised:
        input_watermark(stream.withWatermark("event_time", "1 month 2 days"))
    assert str(raised.value).startswith(
        "the input's withWatermark('event_time', '1 months 2 days') counts months, which have no fixed length"
    )


@pytest.mark.spark
def test_a_dropped_event_time_column_is_named(stream: Any) -> None:
    with pytest.raises(InputWatermarkError, match=r"event-time column 'event_time', which is not among"):
        input_watermark(stream.withWatermark("event_time", "10 minutes").select("user"))


@pytest.mark.spark
def test_the_input_watermark_fills_the_query_config(stream: Any) -> None:
    found = input_watermark(stream.withWatermark("event_time", "10 minutes"))
    config = QueryConfig.build({}, {"time_mode": "eventtime"}, found)
    assert (config.time_mode, config.event_time_column, config.watermark_delay_ms) == (
        "EventTime",
        "event_time",
        600_000,
    )


@pytest.mark.spark
def test_transform_with_state_takes_event_time_from_the_input(spark: Any, tmp_path: Path) -> None:
    """As with Spark's transformWithStateInPandas: withWatermark on the input and time mode EventTime,
    no blobstate event-time option; the outputs are those Spark gives (test_tws_compat)."""
    import blobstate

    write_batch_files(tmp_path / "in", [event_table(b) for b in EVENT_BATCHES])
    recorder = BatchRecorder()
    delay = f"{SESSION_WATERMARK_DELAY_MS // 1000} seconds"
    query = blobstate.transform_with_state(
        file_stream(spark, tmp_path / "in", EVENT_DDL).withWatermark("ts", delay),
        key="key",
        processor=EventTimeSessions(),
        output_schema=SESSION_OUTPUT,
        checkpoint=str(tmp_path / "ckpt"),
        sink=recorder,
        num_partitions=2,
        local_dir=str(tmp_path / "local"),
        async_cleanup=False,
        time_mode="EventTime",
    )
    run_to_end(query)
    assert recorder.rows == expected_event_time_sessions()


# ------------------------------------------------------------------------ resolving (no Spark needed)


def test_without_input_watermark_the_options_stand() -> None:
    assert resolve_event_time("t", 5, None) == ("t", 5)
    assert resolve_event_time(None, None, None) == (None, None)
    config = QueryConfig.build({}, {"event_time_column": "t", "watermark_delay": "5 seconds"})
    assert (config.event_time_column, config.watermark_delay_ms) == ("t", 5000)


def test_options_not_given_come_from_the_input() -> None:
    assert resolve_event_time(None, None, TEN_MINUTES) == ("event_time", 600_000)
    assert resolve_event_time("event_time", None, TEN_MINUTES) == ("event_time", 600_000)
    assert resolve_event_time(None, 600_000, TEN_MINUTES) == ("event_time", 600_000)
    config = QueryConfig.build({}, {"time_mode": "EventTime"}, TEN_MINUTES)
    assert (config.event_time_column, config.watermark_delay_ms) == ("event_time", 600_000)


def test_the_time_mode_is_still_the_users_choice() -> None:
    config = QueryConfig.build({}, {}, TEN_MINUTES)
    assert config.time_mode == "None"
    with pytest.raises(QueryConfigError, match="declare it on the input with withWatermark"):
        QueryConfig.build({}, {"time_mode": "EventTime"})


def test_options_that_agree_with_the_input_are_accepted() -> None:
    config = QueryConfig.build(
        {"spark.blobstate.watermark_delay": "10 minutes"},
        {"event_time_column": "event_time", "time_mode": "EventTime"},
        TEN_MINUTES,
    )
    assert (config.event_time_column, config.watermark_delay_ms) == ("event_time", 600_000)


def test_options_that_disagree_with_the_input_name_both() -> None:
    with pytest.raises(QueryConfigError) as raised:
        QueryConfig.build({}, {"event_time_column": "ts"}, TEN_MINUTES)
    assert str(raised.value) == (
        "event_time_column 'ts' disagrees with the input's withWatermark('event_time', '10 minutes'):"
        " drop event_time_column (the input's column is used, as in Spark) or name 'event_time'"
    )
    with pytest.raises(QueryConfigError) as raised:
        QueryConfig.build({}, {"watermark_delay": "5 minutes"}, TEN_MINUTES)
    assert str(raised.value) == (
        "watermark_delay '5 minutes' (300000 ms) disagrees with the input's withWatermark('event_time',"
        " '10 minutes') (600000 ms): drop the option (the input's delay is used, as in Spark) or give the"
        " same delay"
    )
    with pytest.raises(QueryConfigError, match=r"^watermark_delay_ms 0 \(0 ms\) disagrees"):
        QueryConfig.build({"spark.blobstate.watermark_delay_ms": "0"}, {}, TEN_MINUTES)
