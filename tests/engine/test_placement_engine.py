"""With nothing failing, every partition stays on one executor batch after batch (local-cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.demo.clickstream import StreamShape, generate_batches, generate_profiles, write_batches
from blobstate.lineage.commitlog import CommitLog

BATCHES = 6


@pytest.mark.spark
@pytest.mark.slow
def test_partitions_stay_on_their_executor_across_batches(tmp_path: Path) -> None:
    batches = generate_batches(StreamShape(batches=BATCHES, events_per_batch=400, users=200))
    write_batches(batches[:BATCHES], tmp_path / "input")
    write_batches(generate_profiles(StreamShape(users=200), BATCHES), tmp_path / "profiles", "profiles")
    checkpoint = tmp_path / "checkpoint"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "blobstate.demo.job",
            "--input",
            str(tmp_path / "input"),
            "--profiles",
            str(tmp_path / "profiles"),
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(tmp_path / "output"),
            "--local-dir",
            str(tmp_path / "local"),
            "--partitions",
            "4",
            "--master",
            "local-cluster[2,1,1024]",
            "--locality-wait",
            "60s",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    # One batch per input file, then (the watermark moved) the batch without input Spark would run.
    assert [r["batch_id"] for r in reports] == list(range(BATCHES + 1))
    assert reports[-1]["input_rows"] == 0

    log = CommitLog(open_blob_store(str(checkpoint)))
    placements = [log.read_commit(v).placement for v in range(1, BATCHES + 1)]
    executors = {p: {placement[p]["executor_id"] for placement in placements} for p in placements[0]}
    assert sorted(executors) == [0, 1, 2, 3]
    for partition, seen in executors.items():
        assert len(seen) == 1, f"partition {partition} ran on executors {seen} over {BATCHES} batches"
    # Both executors hold state: partitions are spread, not piled on one executor.
    assert len({next(iter(seen)) for seen in executors.values()}) == 2
    # After the first batch every partition opened its clean working store: no remote restore.
    for report in reports[1:]:
        assert report["restore_bytes"] == 0
