"""The per-batch metrics table, read from a commit log written through the real commit log API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_helpers import T0, N, partition_metrics, write_background_checkpoint, write_checkpoint

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLogFormatError
from blobstate.report.metrics import load_batch_metrics


@pytest.fixture
def store(tmp_path: Path):
    with open_blob_store(str(tmp_path / "checkpoint")) as s:
        yield s


def test_every_version_gets_its_figures_from_its_commit(store) -> None:
    meta = write_checkpoint(store, versions=4)
    summary, rows = load_batch_metrics(store)

    assert (summary.query_id, summary.num_partitions, summary.operators) == (meta.query_id, N, ["0"])
    assert summary.versions == [1, 2, 3, 4] and summary.missing == []
    assert [r.version for r in rows] == [1, 2, 3, 4]
    for r in rows[1:]:
        v = r.version
        parts = [partition_metrics(v, p) for p in range(N)]
        assert r.created_time_ms == T0 + 1000 * v
        assert r.seconds == 1.5 * v
        assert r.input_rows == sum(m["input_rows"] for m in parts)
        assert r.output_rows == sum(m["output_rows"] for m in parts)
        assert r.bytes_uploaded == sum(m["bytes_uploaded"] for m in parts)
        assert r.restore_seconds == max(m["load_seconds"] for m in parts)  # the slowest partition
        assert r.state_keys == sum(m["state_keys"] for m in parts)
        assert r.max_task_seconds == 0.5 + N - 1
        assert r.partitions[2].restore_seconds == parts[2]["load_seconds"]
        assert r.partitions[1].load_rule == "working" and r.partitions[1].executor_id == "exec-1"
    assert rows[2].split == {"stage_seconds": 2.0, "sink_seconds": 1.0, "commit_seconds": 0.5}
    assert rows[1].split == {}
    assert [r.writer for r in rows] == ["driver-a", "driver-a", "driver-b", "driver-b"]


def test_snapshots_and_delta_sizes_come_from_the_commit_references(store) -> None:
    write_checkpoint(store, versions=4)
    _, rows = load_batch_metrics(store)
    for r in rows:
        expected = [p for p in range(N) if (r.version + p) % 3 == 0]
        assert [p for p, m in r.partitions.items() if m.snapshot] == expected
        assert r.snapshots == len(expected)
        assert r.delta_bytes == sum(100 * r.version + p for p in range(N))
        assert r.checkpoint_kind == (f"snapshot {len(expected)}/{N}" if expected else "delta")


def test_a_commit_without_metrics_has_none_not_zero(store) -> None:
    write_checkpoint(store, versions=2, no_metrics=(1,))
    _, rows = load_batch_metrics(store)
    old = rows[0]
    assert not old.has_metrics and rows[1].has_metrics
    assert (old.seconds, old.input_rows, old.output_rows, old.bytes_uploaded, old.restore_seconds) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert old.standby is None and old.partitions[0].restore_seconds is None
    assert old.delta_bytes > 0  # the references are always there


def test_standby_lag_and_failovers(store) -> None:
    write_checkpoint(store, versions=4)
    _, rows = load_batch_metrics(store)
    three = rows[2].standby
    assert three is not None and three.eventful
    assert (three.failovers, three.active_failures, three.replicas) == (1, 1, 1)
    assert [m.describe() for m in three.moves] == ["partition 1: exec-1 -> exec-9, standby"]
    assert three.lag_versions == {p: 3 % 2 + p for p in range(N)}
    assert three.max_lag_versions == 1 + N - 1
    assert three.sync_bytes == 4096
    assert rows[3].standby is not None and rows[3].standby.failovers == 0


def test_spark_recovery_and_overhead_apart_and_in_older_commits(store) -> None:
    write_checkpoint(store, versions=4)
    _, rows = load_batch_metrics(store)
    # version 2's spark_recovery_seconds was the stage time beyond the slowest task: no recovery figure
    assert (rows[1].spark_overhead_seconds, rows[1].spark_recovery_seconds) == (0.25, None)
    assert [(r.spark_overhead_seconds, r.spark_recovery_seconds) for r in rows[2:]] == [
        (0.25, 1.5),
        (0.25, 0.0),
    ]


def test_a_hole_in_the_log_is_reported_and_skipped(store) -> None:
    write_checkpoint(store, versions=4)
    store.delete("commits/2.json")
    summary, rows = load_batch_metrics(store)
    assert summary.missing == [2] and summary.latest == 4
    assert [r.version for r in rows] == [1, 3, 4]


def test_only_chosen_versions_are_read(store) -> None:
    write_checkpoint(store, versions=4)
    _, rows = load_batch_metrics(store, versions=[2, 4, 99])
    assert [r.version for r in rows] == [2, 4]


def test_progress_is_reported_per_commit(store) -> None:
    write_checkpoint(store, versions=3)
    seen: list[tuple[int, int, str]] = []
    load_batch_metrics(store, progress=lambda done, total, what: seen.append((done, total, what)))
    assert [s for s in seen if s[2] == "commits"] == [(i, 3, "commits") for i in range(4)]


def test_a_changed_commit_is_an_error_naming_it(store) -> None:
    write_checkpoint(store, versions=3)
    raw = json.loads(store.get("commits/2.json"))
    raw["metrics"]["seconds"] = 99.0
    store.put("commits/2.json", json.dumps(raw).encode())
    with pytest.raises(CommitLogFormatError, match=r"commits/2\.json"):
        load_batch_metrics(store)


def test_a_background_snapshot_counts_at_the_version_it_holds_with_its_size(tmp_path: Path) -> None:
    """Snapshots uploaded in the background (the engine's default) are named by the next commit; the
    report shows each at the version (batch) whose state it holds, with the size of its files."""
    url = str(tmp_path / "checkpoint")
    write_background_checkpoint(url, tmp_path / "local", versions=5, every=2)
    with open_blob_store(url) as store:
        _, rows = load_batch_metrics(store)
    assert {r.batch_id: r.checkpoint_kind for r in rows} == {
        0: "delta",
        1: "snapshot",
        2: "delta",
        3: "snapshot",
        4: "delta",
    }
    sizes = {r.version: r.partitions[0].state_bytes for r in rows}
    assert sizes[2] and sizes[4] and sizes[4] > sizes[2]  # the RocksDB files grew with the keys
    assert sizes[1] is sizes[3] is sizes[5] is None
    assert [r.partitions[0].snapshot_named_in for r in rows] == [None, 3, None, 5, None]
