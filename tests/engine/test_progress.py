"""``blobstate.progress_metrics``: a batch's metrics read back from Spark's string map (no Spark session)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import blobstate
from blobstate.engine.driver import BatchReport
from blobstate.engine.progress import ProgressFormatError
from blobstate.engine.ticks import Ticks
from blobstate.errors import BlobstateError


class _Channel:
    """The JVM end of the ticks source as the driver sees it: what was published, by token."""

    published: dict[str, dict[str, str]] = {}

    @classmethod
    def publish(cls, token: str, keys: list[str], values: list[str]) -> None:
        cls.published[token] = dict(zip(keys, values, strict=True))


def published_progress(report: BatchReport) -> dict[str, Any]:
    """A progress as Spark's JSON holds it, with the metrics the driver publishes for ``report``."""
    ticks = Ticks(_Channel)
    ticks.publish(report.progress_metrics())
    return {
        "batchId": report.batch_id,
        "sources": [
            {"description": "FileStreamSource[file:/in]", "metrics": {}},
            {"description": "blobstate", "metrics": _Channel.published[ticks.token]},
        ],
    }


def a_report() -> BatchReport:
    return BatchReport(
        batch_id=4,
        version=5,
        input_rows=300,
        output_rows=12,
        seconds=1.5,
        max_load_seconds=0.25,
        restore_bytes=16528,
        bytes_uploaded=2048,
        snapshots=1,
        write_through=True,
        partitions={
            0: {"load_rule": "standby+deltas", "restore_bytes": 16528, "host": "127.0.0.3"},
            1: {"load_rule": "working", "restore_bytes": 0, "host": "127.0.0.2"},
        },
        standby={"failovers": 1, "moves": [{"partition": 0, "from": "1", "to": "2", "reason": "standby"}]},
    )


def test_progress_metrics_parses_the_strings_spark_keeps() -> None:
    progress = published_progress(a_report())
    raw = progress["sources"][1]["metrics"]
    assert raw["inputRows"] == "300" and raw["writeThrough"] == "true"  # what Spark hands a listener
    metrics = blobstate.progress_metrics(progress)
    assert metrics["inputRows"] == 300 and metrics["batchId"] == 4 and metrics["writeThrough"] is True
    assert metrics["loadRules"] == {"standby+deltas": 1, "working": 1}
    assert metrics["partitions"]["0"]["restore_bytes"] == 16528
    assert metrics["standby"]["moves"] == [{"partition": 0, "from": "1", "to": "2", "reason": "standby"}]
    assert blobstate.progress_metrics(json.dumps(progress)) == metrics  # progress.json


def test_progress_metrics_of_another_query_is_empty_and_a_non_progress_is_refused() -> None:
    assert blobstate.progress_metrics({"sources": [{"description": "KafkaV2", "metrics": {"a": "1"}}]}) == {}
    assert blobstate.progress_metrics({"sources": [{"description": "blobstate", "metrics": {}}]}) == {}
    with pytest.raises(ProgressFormatError, match="has no 'sources' list") as error:
        blobstate.progress_metrics({"batchId": 1})
    assert isinstance(error.value, BlobstateError)
    with pytest.raises(ProgressFormatError, match="not JSON"):
        blobstate.progress_metrics("{")
