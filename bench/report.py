"""How long ``blobstate report`` takes on a long commit log: read the commits, draw, write; prints JSON.

The commit log is written through the real commit log API on a local directory (commits with
driver-like metrics for every partition, standby metrics included, a snapshot every 10 versions).

Usage: .venv/bin/python bench/report.py [--versions N] [--partitions P]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from blobstate.blobstore import open_blob_store
from blobstate.ids import new_uid
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.report.metrics import load_batch_metrics
from blobstate.report.render import write_report


def _write_log(url: str, versions: int, partitions: int) -> None:
    with open_blob_store(url) as store:
        log = CommitLog(store)
        log.write_metadata(QueryMetadata.new(partitions, {"0": {"key_columns": ["k"]}}))
        delta, index = ObjectRef.of(b"d" * 1000), ObjectRef.of(b"index")
        for v in range(1, versions + 1):
            metrics = {
                "seconds": 1.0 + (v % 7) / 10,
                "partitions": {
                    p: {
                        "input_rows": 1000 + p,
                        "output_rows": 100 + p,
                        "bytes_uploaded": 20_000 + p,
                        "load_seconds": 0.01 * (p % 5),
                        "load_rule": "working",
                        "state_keys": 10 * v + p,
                        "task_seconds": 0.5,
                    }
                    for p in range(partitions)
                },
                "spark_recovery_seconds": 0.2,
                "standby": {
                    "replicas": 1,
                    "failovers": int(v % 50 == 0),
                    "failovers_without_standby": 0,
                    "lag_versions": {str(p): {"h2": v % 3} for p in range(partitions)},
                },
            }
            log.write_commit(
                Commit(
                    version=v,
                    checkpoints={"0": {p: new_uid() for p in range(partitions)}},
                    writer="bench",
                    objects={
                        "0": {
                            p: PartitionObjects(delta, index if v % 10 == 0 else None)
                            for p in range(partitions)
                        }
                    },
                    retained_from=max(1, v - 10),
                    metrics=metrics,
                )
            )


def main() -> None:
    """Write a commit log, then time reading it into the metrics table and writing the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = str(Path(tmp) / "checkpoint")
        _write_log(url, args.versions, args.partitions)
        with open_blob_store(url) as store:
            started = time.perf_counter()
            summary, rows = load_batch_metrics(store, state_sizes=False)
            read_s = time.perf_counter() - started
        started = time.perf_counter()
        page, pngs = write_report(summary, rows, Path(tmp) / "report")
        render_s = time.perf_counter() - started
        result = {
            "versions": args.versions,
            "partitions": args.partitions,
            "read_commits_seconds": round(read_s, 3),
            "render_seconds": round(render_s, 3),
            "plots": len(pngs),
            "page_bytes": page.stat().st_size,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
