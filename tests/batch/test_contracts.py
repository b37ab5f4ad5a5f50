"""The batch contracts travel as plain JSON and come back equal (no Spark session)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from blobstate import defaults
from blobstate.adjunct.broadcast import PendingVersion
from blobstate.adjunct.step import pending_from_json, pending_json
from blobstate.adjunct.task_step import AdjunctPlan
from blobstate.batch.contracts import (
    PARTITION_METRICS,
    BatchPlan,
    PartitionSpec,
    RunSpec,
    TaskResult,
)
from blobstate.engine.config import QueryConfig
from blobstate.state.policy import SnapshotPolicy
from task_results import a_result

OUTPUT = pa.schema([pa.field("key", pa.string()), pa.field("count", pa.int64(), nullable=False)])


def through_json(value: object) -> object:
    """``value``'s ``to_json`` written and read back as text, as a metadata row or closure carries it."""
    return json.loads(json.dumps(value.to_json()))  # type: ignore[attr-defined]


def test_a_batch_plan_comes_back_equal_from_json() -> None:
    plan = BatchPlan(
        version=7,
        uids={0: "a" * 32, 1: "b" * 32},
        run=RunSpec(
            key_columns=("user", "day"),
            output_schema=OUTPUT,
            time_mode="EventTime",
            output_mode="Append",
            api="arrow",
            timezone="Europe/Paris",
            event_time_column="ts",
            batch_timestamp_ms=1_700_000_000_000,
            watermark_ms=5_000,
            late_watermark_ms=4_000,
            initial_state_key_columns=("u", "d"),
        ),
        inline_output_bytes=4096,
        report_failures=False,
    )
    back = BatchPlan.from_json(through_json(plan))  # type: ignore[arg-type]
    assert back == plan
    assert back.run.output_schema.equals(OUTPUT) and back.committing == 8


def test_an_adjunct_plan_comes_back_equal_from_json() -> None:
    plan = AdjunctPlan(
        recreate=("prices",),
        defer_main=True,
        broadcast={"rates": {"version": 3}},
        side_files={"prices": ("f1.json", "f2.json")},
    )
    assert AdjunctPlan.from_json(through_json(plan)) == plan  # type: ignore[arg-type]
    assert AdjunctPlan.from_json(through_json(AdjunctPlan())) == AdjunctPlan()  # type: ignore[arg-type]


def test_a_run_spec_with_a_ddl_schema_and_defaults_comes_back_equal() -> None:
    run = RunSpec(key_columns=["key"], output_schema="key STRING, n BIGINT")  # type: ignore[arg-type]
    assert run.key_columns == ("key",)
    assert RunSpec.from_json(through_json(run)) == run  # type: ignore[arg-type]
    assert (run.max_rows_per_frame, run.flush_rows) == (defaults.MAX_ROWS_PER_FRAME, defaults.FLUSH_ROWS)


def test_a_partition_spec_comes_back_equal_and_takes_the_query_defaults() -> None:
    spec = PartitionSpec("s3://b/ckpt?read_timeout=5", "q", "0", 4)
    assert PartitionSpec.from_json(through_json(spec)) == spec  # type: ignore[arg-type]
    config = QueryConfig()
    assert (spec.snapshot_every, spec.snapshot_delta_bytes, spec.snapshot_upload) == (
        config.snapshot_every,
        config.snapshot_delta_bytes,
        config.snapshot_upload,
    )
    assert config.local_dir_grace_seconds == spec.local_dir_grace_seconds


def test_the_library_and_the_engine_share_one_set_of_defaults() -> None:
    policy = SnapshotPolicy()
    config = QueryConfig()
    assert (policy.every, policy.delta_bytes) == (config.snapshot_every, config.snapshot_delta_bytes)
    assert config.min_versions_to_retain == defaults.MIN_VERSIONS_TO_RETAIN
    import inspect

    from blobstate.state.partition import open_partition

    parameters = inspect.signature(open_partition).parameters
    assert parameters["snapshot_upload"].default == config.snapshot_upload
    assert parameters["snapshot_delta_bytes"].default == config.snapshot_delta_bytes


def test_a_task_result_comes_back_equal_and_keeps_the_metadata_row_keys() -> None:
    result = a_result(adjuncts={"prices": {"rows": 3}}, snapshot_repairs=("0/3/5_y.zip",))
    text = json.loads(json.dumps(result.to_json()))
    assert TaskResult.from_json(text) == result
    assert text["executor_id"] == "1" and text["snapshot_repairs"] == ["0/3/5_y.zip"]
    metrics = result.metrics()
    assert list(metrics) == [*PARTITION_METRICS, "adjuncts"]
    assert "adjuncts" not in a_result().to_json() and "adjuncts" not in a_result().metrics()


def test_a_task_result_with_unknown_or_missing_entries_is_refused() -> None:
    text = a_result().to_json()
    with pytest.raises(ValueError, match=r"partition 3: unknown entries \['surprise'\]"):
        TaskResult.from_json({**text, "surprise": 1})
    del text["uid"]
    with pytest.raises(TypeError, match="uid"):
        TaskResult.from_json(text)


def test_a_broadcast_stores_pending_version_comes_back_equal() -> None:
    pending = PendingVersion(4, "c" * 32, "d" * 32, {"size": 1, "sha256": "00" * 32}, ("d" * 32,), True)
    assert pending_from_json(json.loads(json.dumps(pending_json(pending)))) == pending
