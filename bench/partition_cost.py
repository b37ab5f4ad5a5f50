"""A partition's fixed cost per batch in a task, without Spark: open, a few writes, commit, close.

Runs what a processing task does to its partition's state (``open_partition`` at the committed
version, ``rows`` puts, ``commit`` under a fresh uid, close) for ``partitions`` partitions and ``batches``
batches on a local-directory blob store, as one executor process would at Spark's default 200
partitions, and prints JSON: CPU and wall milliseconds per partition-batch, and with ``--profile`` the
functions that take the most cumulative time. Run by hand:

    .venv/bin/python bench/partition_cost.py [--partitions 200] [--batches 5] [--rows 10] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path

from blobstate.blobstore.local import LocalBlobStore
from blobstate.ids import CheckpointId, new_uid
from blobstate.state.partition import open_partition

CF = "default"
QUERY_ID = "0123456789abcdef"


def run(partitions: int, batches: int, rows: int, root: Path) -> tuple[float, float]:
    """Run ``batches`` batches over ``partitions`` partitions; CPU and wall seconds of all but the first."""
    store = LocalBlobStore(str(root / "blobs"))
    local_dir = root / "local"
    committed: dict[int, CheckpointId | None] = dict.fromkeys(range(partitions))
    cpu = wall = 0.0
    for batch in range(batches):
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        for p in range(partitions):
            state = open_partition(store, local_dir, QUERY_ID, "op", p, committed[p])
            try:
                for r in range(rows):
                    key = f"k{batch}-{r}".encode()
                    state.store.get(CF, key)
                    state.store.put(CF, key, b"v" * 16)
                result = state.commit(new_uid())
            finally:
                state.close()
            committed[p] = result.checkpoint_id
        if batch > 0:  # the first batch creates every store
            cpu += time.process_time() - cpu_started
            wall += time.perf_counter() - wall_started
    return cpu, wall


def main() -> int:
    """Parse arguments, run, print JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="partition-cost-") as tmp:
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        if profiler is not None:
            profiler.enable()
        cpu, wall = run(args.partitions, args.batches, args.rows, Path(tmp))
        if profiler is not None:
            profiler.disable()
    measured = args.partitions * (args.batches - 1)
    out: dict[str, object] = {
        "benchmark": "partition_cost",
        "partitions": args.partitions,
        "batches": args.batches,
        "rows": args.rows,
        "cpu_ms_per_partition_batch": round(1000 * cpu / measured, 3),
        "wall_ms_per_partition_batch": round(1000 * wall / measured, 3),
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        out["profile"] = text.getvalue().splitlines()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
