"""Adjunct stores in real queries: enrichment against its reference, replays, what the commit records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adjunct_jobs import (
    RecordingSink,
    clicks,
    discounts,
    profiles,
    reference,
    start_query,
    write_files,
)

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog, MetadataConflictError

pytestmark = pytest.mark.spark

CLICKS = [
    clicks([("a", 1), ("b", 2), ("d", 3)]),
    clicks([("a", 4), ("c", 5)]),
    clicks([("b", 6), ("c", 7), ("a", 8)]),
    clicks([("d", 9)]),
]
PROFILES = [
    profiles([("a", "gold"), ("b", "silver"), (None, "gold")]),
    profiles([("c", "gold"), ("a", None), ("b", "bronze")]),
    profiles([("d", "silver"), ("a", "silver")]),
]
DISCOUNTS = [
    discounts([("gold", 10)]),
    discounts([]),
    discounts([("silver", 5), ("gold", 20), ("bronze", None)]),
    discounts([("silver", None)]),
]


def test_enrichment_from_a_partitioned_and_a_broadcast_side_stream_equals_the_reference(
    spark: Any, tmp_path: Path
) -> None:
    write_files(tmp_path / "clicks", CLICKS)
    write_files(tmp_path / "profiles", PROFILES)
    write_files(tmp_path / "discounts", DISCOUNTS)
    sink = RecordingSink()
    checkpoint = str(tmp_path / "ckpt")
    query = start_query(
        spark, tmp_path, checkpoint, sink, local_dir=str(tmp_path / "local"), snapshot_every=2
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink.rows == reference(CLICKS, PROFILES, DISCOUNTS)

    log = CommitLog(open_blob_store(checkpoint))
    commits = [log.read_commit(v) for v in range(1, log.latest_commit().version + 1)]
    # The broadcast store is its own one-partition operator, one version per batch.
    assert all(set(c.checkpoints["adjunct-discounts"]) == {0} for c in commits)
    first = commits[0].metrics["adjuncts"]
    assert first["profiles"] == {**first["profiles"], "rows": 3, "upserts": 2, "null_keys": 1}
    assert first["discounts"]["upserts"] == 1
    third = commits[2].metrics["adjuncts"]["discounts"]
    assert (third["upserts"], third["deletes"]) == (2, 1)
    # Each batch records its side streams' offsets from Spark's offset log.
    assert [c.adjunct_offsets["profiles"] for c in commits[:3]] == [
        [{"logOffset": 0}],
        [{"logOffset": 1}],
        [{"logOffset": 2}],
    ]

    # A side stream cannot be added to (or dropped from) an existing checkpoint: said clearly.
    from adjunct_jobs import CLICKS as CLICKS_DDL
    from adjunct_jobs import OUTPUT, Enrich

    from blobstate import transform_with_state

    main = spark.readStream.schema(CLICKS_DDL).parquet(str(tmp_path / "clicks"))
    with pytest.raises(MetadataConflictError, match="adding or removing a side stream"):
        transform_with_state(
            main,
            key="user",
            processor=Enrich(),
            output_schema=OUTPUT,
            checkpoint=checkpoint,
            sink=sink,
            num_partitions=2,
        )


def _driver(base: Path, checkpoint: str, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [
        sys.executable,
        str(Path(__file__).with_name("adjunct_jobs.py")),
        "--base",
        str(base),
        "--checkpoint",
        checkpoint,
        "--output",
        str(output),
        *extra,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_a_batch_replayed_after_the_driver_died_before_its_commit_sees_the_same_adjunct_version(
    tmp_path: Path,
) -> None:
    write_files(tmp_path / "clicks", CLICKS[:3])
    write_files(tmp_path / "profiles", PROFILES[:2])
    write_files(tmp_path / "discounts", DISCOUNTS[:2])
    checkpoint = str(tmp_path / "ckpt")
    output = tmp_path / "out"
    died = _driver(tmp_path, checkpoint, output, "--die-in-sink-of", "1")
    assert died.returncode == 17, died.stderr[-2000:]
    seen_before = json.loads((output / "died-1.json").read_text())
    log = CommitLog(open_blob_store(checkpoint))
    assert log.latest_commit().version == 1  # batch 1 ran its stage but was never committed

    # New side data arrives while the driver is down: the replayed batch 1 must not see it.
    write_files(tmp_path / "profiles", PROFILES[2:], first=2)
    write_files(tmp_path / "discounts", DISCOUNTS[2:], first=2)
    write_files(tmp_path / "clicks", CLICKS[3:], first=3)
    rerun = _driver(tmp_path, checkpoint, output)
    assert rerun.returncode == 0, rerun.stderr[-2000:]

    replayed = json.loads((output / "batch-1.json").read_text())
    assert replayed == seen_before
    expected = reference(CLICKS, PROFILES, DISCOUNTS)
    got = {b: json.loads((output / f"batch-{b}.json").read_text()) for b in expected}
    assert got == {b: [list(r) for r in rows] for b, rows in expected.items()}
    # The profile and discount files of batch 2 went to batch 2, not to the replayed batch 1.
    commits = {v: log.read_commit(v) for v in range(1, log.latest_commit().version + 1)}
    assert commits[2].adjunct_offsets["profiles"] == [{"logOffset": 1}]
    assert commits[3].adjunct_offsets["profiles"] == [{"logOffset": 2}]
