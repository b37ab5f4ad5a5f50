"""Benchmark of the partition API: commit cost, cold restore and warm opens at several state sizes.

For each size (MB of key+value bytes) it builds one partition on the local-directory blob store:

1. load: versions of up to 100 MB of writes each, the last one with a (full) snapshot;
2. steady commits that update ~1% of the keys: time, bytes uploaded and changelog bytes per commit,
   for commits without a snapshot and for one with an (incremental) snapshot;
3. cold restore of the newest version in an empty local directory (snapshot plus deltas);
4. warm opens: rule 1 (clean working store) and rule 2 (local hard-link checkpoint).

Prints one JSON document. The page cache is not dropped, so cold restores read a warm blob store.
Warm opens are dominated by RocksDB's own open (table readers loading index and filter blocks), so
they grow with the number of SST files; on a shared machine compare minimums as well as medians.

Usage: .venv/bin/python bench/state.py [--sizes 10,100,1000] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import CHECKPOINT_ID_FILE, LocalPartitionLayout
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.state.partition import open_partition
from blobstate.state.retention import retained_from

QUERY_ID = "0b1c2d3e-4f50-4a6b-8c7d-8e9fa0b1c2d3"
OP = "0"
KEY_BYTES = 16
VALUE_BYTES = 100
NEVER = 10**9
LOAD_CHUNK_MB = 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def keys_and_values(start: int, count: int) -> list[tuple[bytes, bytes]]:
    blob = os.urandom(count * VALUE_BYTES)
    return [
        (b"key-%012d" % i, blob[j * VALUE_BYTES : (j + 1) * VALUE_BYTES])
        for j, i in enumerate(range(start, start + count))
    ]


class Partition:
    """One partition driven through the real commit log (as the engine's driver does)."""

    def __init__(self, store: Any, local: Path) -> None:
        self.store, self.local = store, local
        self.committed: CheckpointId | None = None
        self.log = CommitLog(store)
        self.log.write_metadata(QueryMetadata(QUERY_ID, 1, {OP: {"key_columns": ["k"]}}))

    def publish(self, result: Any) -> None:
        """Write the commit of ``result``'s version, as the driver does after the sink."""
        version = result.checkpoint_id.version
        previous = self.log.read_commit(version - 1) if version > 1 else None
        self.log.write_commit(
            Commit(
                version=version,
                checkpoints={OP: {0: result.checkpoint_id.uid}},
                objects={OP: {0: result.objects}},
                retained_from=retained_from(previous, version, NEVER),
                writer="bench",
            )
        )
        self.committed = result.checkpoint_id

    def open(self, local: Path | None = None, **options: Any) -> Any:
        options.setdefault("snapshot_every", NEVER)
        options.setdefault("snapshot_delta_bytes", 1 << 62)
        return open_partition(self.store, local or self.local, QUERY_ID, OP, 0, self.committed, **options)

    def commit_writes(self, pairs: list[tuple[bytes, bytes]], **options: Any) -> dict[str, Any]:
        with self.open(**options) as state:
            for start in range(0, len(pairs), 100_000):
                state.store.put_many("v", pairs[start : start + 100_000])
            result = state.commit()
        self.publish(result)
        return {
            "version": result.checkpoint_id.version,
            "seconds": round(result.seconds, 4),
            "changelog_bytes": result.changelog_bytes,
            "bytes_uploaded": result.bytes_uploaded,
            "upload_ratio": round(result.bytes_uploaded / max(1, result.changelog_bytes), 3),
            "snapshot": result.snapshot_name is not None,
            "objects_written": len(result.objects_written),
        }


def timed_open(partition: Partition, local: Path, expected_rule: str) -> dict[str, Any]:
    started = time.perf_counter()
    state = partition.open(local)
    seconds = time.perf_counter() - started
    rule = state.load_rule
    report = state.load_report
    result = {
        "rule": rule,
        "seconds": round(seconds, 4),
        "bytes_downloaded": report.bytes_downloaded,
        "deltas_replayed": report.deltas_replayed,
        "records_replayed": report.records_replayed,
        "base": report.base_kind,
    }
    # commit nothing so the working store is clean again for the next warm open
    committed = state.commit()
    state.close()
    partition.publish(committed)
    if rule != expected_rule:
        raise AssertionError(f"expected load rule {expected_rule}, got {rule}")
    return result


def bench_size(size_mb: int, workdir: Path, repeat: int) -> dict[str, Any]:
    root = workdir / f"size-{size_mb}"
    shutil.rmtree(root, ignore_errors=True)
    store = open_blob_store(str(root / "blobs"))
    p = Partition(store, root / "writer")
    records = size_mb * 1_000_000 // (KEY_BYTES + VALUE_BYTES)
    out: dict[str, Any] = {"size_mb": size_mb, "records": records}

    log(f"[{size_mb} MB] loading {records:,} records")
    started = time.perf_counter()
    chunk = LOAD_CHUNK_MB * 1_000_000 // (KEY_BYTES + VALUE_BYTES)
    load = []
    for start in range(0, records, chunk):
        last = start + chunk >= records
        pairs = keys_and_values(start, min(chunk, records - start))
        load.append(p.commit_writes(pairs, snapshot_every=1 if last else NEVER))
    out["load"] = {"seconds": round(time.perf_counter() - started, 2), "commits": load}

    log(f"[{size_mb} MB] steady commits")
    updates = max(1, records // 100)
    steady, snapshot_commit = [], None
    for i in range(6):
        start = (i * 7919 * updates) % max(1, records - updates)
        pairs = keys_and_values(start, updates)
        with_snapshot = i == 3
        result = p.commit_writes(pairs, snapshot_every=1 if with_snapshot else NEVER)
        if with_snapshot:
            snapshot_commit = result
        else:
            steady.append(result)
    out["commit_without_snapshot"] = {
        "changelog_bytes": steady[0]["changelog_bytes"],
        "median_seconds": statistics.median(c["seconds"] for c in steady),
        "median_bytes_uploaded": statistics.median(c["bytes_uploaded"] for c in steady),
        "max_upload_ratio": max(c["upload_ratio"] for c in steady),
        "commits": steady,
    }
    out["commit_with_incremental_snapshot"] = snapshot_commit

    log(f"[{size_mb} MB] cold restore")
    cold = timed_open(p, root / "cold", "remote")
    out["cold_restore"] = cold

    log(f"[{size_mb} MB] warm opens")
    timed_open(p, root / "cold", "working")  # settle: the first open after a restore may compact
    rule1, rule2 = [], []
    layout = LocalPartitionLayout(root / "cold", QUERY_ID, OP, 0)
    for _ in range(repeat):
        rule1.append(timed_open(p, root / "cold", "working"))
        (layout.working / CHECKPOINT_ID_FILE).unlink()
        rule2.append(timed_open(p, root / "cold", "local-checkpoint"))
    out["warm_open_rule1_seconds"] = statistics.median(r["seconds"] for r in rule1)
    out["warm_open_rule2_seconds"] = statistics.median(r["seconds"] for r in rule2)
    out["warm_open_rule1_min_seconds"] = min(r["seconds"] for r in rule1)
    out["warm_open_rule2_min_seconds"] = min(r["seconds"] for r in rule2)
    working = LocalPartitionLayout(root / "cold", QUERY_ID, OP, 0).working
    out["local_sst_bytes"] = sum(f.stat().st_size for f in working.rglob("*.sst"))
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000", help="state sizes in MB, comma-separated")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--repeat", type=int, default=7, help="warm opens per rule (median reported)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="blobstate-bench-state-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            results.append(bench_size(size, workdir, args.repeat))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary: dict[str, Any] = {
        "benchmark": "state partition: commit, cold restore, warm open",
        "key_bytes": KEY_BYTES,
        "value_bytes": VALUE_BYTES,
        "sizes": results,
    }
    if len(results) > 1:
        small, big = results[0], results[-1]
        summary["warm_open_rule1_ratio_largest_to_smallest"] = round(
            big["warm_open_rule1_seconds"] / small["warm_open_rule1_seconds"], 2
        )
        summary["warm_open_rule2_ratio_largest_to_smallest"] = round(
            big["warm_open_rule2_seconds"] / small["warm_open_rule2_seconds"], 2
        )
        for rule in ("rule1", "rule2"):
            summary[f"warm_open_{rule}_min_ratio_largest_to_smallest"] = round(
                big[f"warm_open_{rule}_min_seconds"] / small[f"warm_open_{rule}_min_seconds"], 2
            )
    summary["load_average"] = os.getloadavg()
    ratios = [r["commit_without_snapshot"]["max_upload_ratio"] for r in results]
    summary["max_non_snapshot_upload_ratio"] = max(ratios)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
