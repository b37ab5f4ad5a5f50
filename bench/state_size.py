"""blobstate's cost per event at two state sizes, side by side in one run; prints JSON.

The workload of ``bench/spark_vs_native.py --large`` (a running count and sum per key, 200,000-event
micro-batches, ``local[2]``, 2 partitions) with the vectorized processor (``api="arrow"``), run once
with ``--small-keys`` keys (default 1,000,000) and once with ``--keys`` keys (default 10,000,000).
In both runs every key is in the state from the first batch on (``initial_state`` holds each key with
a zero count), so the steady batches update a state of that many keys, drawn uniformly: the figure is
how the cost per event grows with the state's size. The first batch (the load of the initial state)
is the warm-up and is not counted. ``cost_ratio_large_over_small`` is the large run's CPU per event
over the small run's (1.0: no growth).

    .venv/bin/python bench/state_size.py [--keys 10000000] [--small-keys 1000000] [--events 200000]
        [--batches 6] [--impl blobstate_arrow] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_vs_native as svn


def write_initial_state(path: Path, keys: int) -> None:
    """Every key of the vocabulary with a zero count and total, as one parquet file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    step = 1_000_000
    with pq.ParquetWriter(
        path / "state.parquet",
        pa.schema([("key", pa.string()), ("count", pa.int64()), ("total", pa.int64())]),
    ) as writer:
        for start in range(0, keys, step):
            n = min(step, keys - start)
            writer.write_table(
                pa.table(
                    {
                        "key": pa.array([f"k{i:07d}" for i in range(start, start + n)]),
                        "count": np.zeros(n, np.int64),
                        "total": np.zeros(n, np.int64),
                    }
                )
            )


def one_size(keys: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    base = workdir / f"keys-{keys}"
    source = base / "input"
    run_args = argparse.Namespace(**vars(args))
    run_args.keys = keys
    data = svn.write_inputs(source, keys, args.events, args.batches + 1, args.seed)
    write_initial_state(base / "initial", keys)
    svn.log(f"{keys} keys: inputs and initial state written")
    entry = svn.run_implementation(
        args.impl, run_args, source, base, data, extra={"initial_state": str(base / "initial")}
    )
    entry["keys"] = keys
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--small-keys", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument(
        "--impl", default="blobstate_arrow", choices=[i for i in svn.IMPLEMENTATIONS if svn.is_blobstate(i)]
    )
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.no_restart = True
    args.timeout = 1800 + 300 * args.batches
    args.restart_timeout = 900
    svn.become_subreaper()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="state_size-"))
    started = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "state_size",
        "config": {k: v for k, v in vars(args).items() if k != "workdir"},
        "machine": {"cores": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    runs = {str(keys): one_size(keys, args, workdir) for keys in (args.small_keys, args.keys)}
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["runs"] = {
        k: {"status": v["status"], "summary": v.get("summary"), "checkpoint_bytes": v.get("checkpoint_bytes")}
        for k, v in runs.items()
    }
    small = (runs[str(args.small_keys)].get("summary") or {}).get("events_per_cpu_s")
    large = (runs[str(args.keys)].get("summary") or {}).get("events_per_cpu_s")
    report["cost_ratio_large_over_small"] = svn.ratio(small, large)
    report["seconds"] = round(time.monotonic() - started, 1)
    ok = all(v["status"] == "ok" for v in runs.values())
    if ok and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
