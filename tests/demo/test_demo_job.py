"""The demo job's remote mode without Spark: a batch's line read back from Spark's query progress, each
batch once, and the query stopped after ``--stop-after`` batches."""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import asdict
from typing import Any

import pytest
from pyspark.sql.streaming.listener import StreamingQueryProgress

from blobstate.demo.job import (
    REPORT_KEYS,
    STOPPED_KEY,
    ProgressFollower,
    _arguments,
    follow_progress,
    report_from_progress,
)
from blobstate.demo.run import snapshot_taken
from blobstate.engine.driver import BatchReport
from blobstate.engine.progress import progress_metrics


def a_report(batch_id: int = 4, skipped: bool = False) -> BatchReport:
    return BatchReport(
        batch_id=batch_id,
        version=batch_id + 1,
        input_rows=10_000,
        output_rows=462,
        seconds=0.77,
        max_load_seconds=0.055,
        restore_bytes=16528,
        bytes_uploaded=33_792,
        snapshots=0,
        skipped=skipped,
        partitions={
            0: {"load_rule": "working", "snapshot_upload": {"mode": "background", "started": "5_ab"}},
            1: {"load_rule": "working", "snapshot_upload": {"mode": "background"}},
        },
    )


def connect_progress(report: BatchReport | None, spark_batch: int = 0) -> StreamingQueryProgress:
    """A progress as a Spark Connect client's ``query.recentProgress`` gives it (PySpark builds it from
    the server's JSON), whose ``blobstate`` source carries ``report``'s metrics as the strings Spark keeps
    (none: a query's progress before blobstate reported a batch)."""
    metrics = {} if report is None else {k: json.dumps(v) for k, v in report.progress_metrics().items()}

    def source(description: str, metrics: dict[str, str]) -> dict[str, Any]:
        return {
            "description": description,
            "startOffset": None,
            "endOffset": "0",
            "latestOffset": "0",
            "numInputRows": 0,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 0.0,
            "metrics": metrics,
        }

    return StreamingQueryProgress.fromJson(
        {
            "id": str(uuid.uuid4()),
            "runId": str(uuid.uuid4()),
            "name": None,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "batchId": spark_batch,
            "batchDuration": 700,
            "stateOperators": [],
            "sources": [source("FileStreamSource[file:/in]", {}), source("blobstate", metrics)],
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        }
    )


def test_a_line_from_the_progress_is_the_line_the_local_job_prints() -> None:
    report = a_report()
    local = json.loads(json.dumps(asdict(report)))  # what run.py reads from a local job's line
    for metrics in (report.progress_metrics(), progress_metrics(connect_progress(report))):
        remote = json.loads(json.dumps(report_from_progress(metrics)))
        assert remote == {field: local[field] for field in REPORT_KEYS}
        assert snapshot_taken(remote) and snapshot_taken(local)


def test_every_field_the_mapping_names_is_one_a_batch_report_has() -> None:
    assert set(REPORT_KEYS) <= set(asdict(a_report()))
    assert set(REPORT_KEYS.values()) <= set(a_report().progress_metrics())


def test_the_follower_prints_each_batch_once_in_order() -> None:
    lines: list[str] = []
    follower = ProgressFollower(lines.append)
    first, skipped, second = a_report(4), a_report(5, skipped=True), a_report(6)
    follower.poll([connect_progress(None, 0), connect_progress(first, 1)])
    # a later poll lists the earlier batches again, and a progress may repeat the last batch's metrics
    follower.poll(
        [
            connect_progress(first, 1),
            connect_progress(first, 2),
            connect_progress(skipped, 3),
            connect_progress(second, 4),
        ]
    )
    assert [json.loads(line)["batch_id"] for line in lines] == [4, 5, 6]
    assert follower.committed == 2  # the skipped batch is not counted, as run.py does not


class ScriptedQuery:
    """A streaming query whose ``recentProgress`` shows one more entry of ``script`` at each call; its
    ``processAllAvailable`` returns (or raises ``fails``) once all are shown or the query stopped. ``stop``
    shows one more entry first: a batch that committed while the follower waited to stop the query."""

    def __init__(self, script: list[StreamingQueryProgress], fails: Exception | None = None) -> None:
        self.script = script
        self.shown = 0
        self.stops = 0
        self.fails = fails
        self._done = threading.Event()

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:
        if not self.stops:
            self.shown = min(self.shown + 1, len(self.script))
            if self.shown == len(self.script):
                self._done.set()
        return self.script[: self.shown]

    def processAllAvailable(self) -> None:
        assert self._done.wait(10)
        if self.fails is not None and not self.stops:
            raise self.fails

    def stop(self) -> None:
        if not self.stops:
            self.shown = min(self.shown + 1, len(self.script))
        self.stops += 1
        self._done.set()


def batches(*ids: int) -> list[StreamingQueryProgress]:
    return [connect_progress(a_report(b), b) for b in ids]


def follow(query: ScriptedQuery, stop_after: int | None = None) -> list[dict[str, Any]]:
    lines: list[str] = []
    follow_progress(query, stop_after, lines.append, poll_seconds=0.001, stop_delay_seconds=0)
    return [json.loads(line) for line in lines]


def test_without_stop_after_the_query_runs_until_all_is_processed_and_every_batch_is_printed() -> None:
    query = ScriptedQuery(batches(0, 1, 2, 3))
    assert [line["batch_id"] for line in follow(query)] == [0, 1, 2, 3]
    assert query.stops == 0  # the job's main stops it, after


def test_stop_after_stops_the_query_and_says_after_how_many_batches_as_its_last_line() -> None:
    query = ScriptedQuery(batches(0, 1, 2, 3, 4, 5))
    lines = follow(query, stop_after=2)
    # batch 2 committed while the follower waited: it is printed, and counted, before the stop line
    assert lines == [
        *[report_from_progress(a_report(b).progress_metrics()) for b in (0, 1, 2)],
        {STOPPED_KEY: 3},
    ]
    assert query.stops == 1


def test_a_query_that_fails_raises_after_the_lines_of_its_committed_batches() -> None:
    lines: list[str] = []
    query = ScriptedQuery(batches(0, 1), fails=RuntimeError("the query failed"))
    with pytest.raises(RuntimeError, match="the query failed"):
        follow_progress(query, None, lines.append, poll_seconds=0.001)
    assert [json.loads(line)["batch_id"] for line in lines] == [0, 1]


def test_stop_after_is_refused_without_remote(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--input", "i", "--profiles", "p", "--checkpoint", "c", "--output", "o", "--local-dir", "l"]
    assert _arguments([*base, "--remote", "sc://localhost:15002", "--stop-after", "3"]).stop_after == 3
    with pytest.raises(SystemExit):
        _arguments([*base, "--stop-after", "3"])
    assert "--stop-after needs --remote" in capsys.readouterr().err
