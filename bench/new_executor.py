"""The batch after a host loss and the batches after its replacement executor joins, by locality wait.

Starts the multi-host Spark standalone cluster of the tests (``tests/cluster.py``: three one-core
workers on 127.0.0.2-4 with private disks, two executors, one spare worker) and, for each
``spark.locality.wait`` given, runs a fresh query (a driver subprocess) of ``PARTITIONS`` partitions, so
each executor has several tasks a batch and a free executor may take a task whose own one is busy:

1. batch 0 writes the state (``MB`` per partition), then ``steady`` batches of 2,000 updates each;
2. the driver pauses, the host that runs partition 0 is killed with its disk; the driver goes on as
   soon as Spark saw the executor go, so the failover batch runs on the executor left while Spark
   starts a replacement on the spare worker (it joins a few seconds later, during a batch);
3. ``after`` more batches run back to back: the replacement joins in one of them, and blobstate's
   planner moves partitions onto it through warm-ups in the following ones.

Prints one JSON object: per locality wait, every batch's seconds, the executors its tasks ran on, its
moves (planned ones, and tasks Spark ran ``elsewhere`` than planned), its restore bytes and the partitions
that restored from the blob store, plus the steady median. Run by hand (about 5 minutes):

    .venv/bin/python bench/new_executor.py [--waits 3s,1s]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from failover import (  # noqa: E402
    BlobPerKey,
    DriverRun,
    _write_batch,
    batch_line,
    cluster_session,
    pause_for_kill,
)

from cluster import MultiHostCluster  # type: ignore[import-not-found]  # noqa: E402  (tests/, on sys.path above)

PARTITIONS = 6
VALUE_BYTES = 8192
UPDATES_PER_BATCH = 2000


# ---------------------------------------------------------------------------------------------- the job
def job(args: argparse.Namespace) -> int:
    """The driver subprocess: run batches, pause after ``steady`` for the kill, print a line per batch."""
    import blobstate

    spark, helper = cluster_session(args.conf, "blobstate-new-executor-bench", PARTITIONS)
    control = Path(args.control)
    state: dict[str, Any] = {}

    def on_batch(report: Any) -> None:
        line = batch_line(state["query"], report)
        line["alive_after"] = sorted(e.executor_id for e in helper.executors())
        print(json.dumps(line), flush=True)
        if report.batch_id == args.pause_after and not args.kill_during_batch:
            pause_for_kill(report.batch_id, control, helper)

    frames = spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1).parquet(args.input)
    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=BlobPerKey(args.value_bytes),
        output_schema="k string",
        checkpoint=args.checkpoint,
        sink=lambda frame, batch_id: frame.count(),
        num_partitions=PARTITIONS,
        local_dir=args.local_dir,
        standby_replicas=1,
        snapshot_every=10,
        on_batch=on_batch,
    )
    state["query"] = query
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


# ---------------------------------------------------------------------------------------------- runs
def _summary(line: dict[str, Any]) -> dict[str, Any]:
    """What the table needs of one batch's report."""
    partitions = line["partitions"]
    return {
        "batch": line["batch_id"],
        "seconds": line["seconds"],
        "max_task_seconds": line["max_task_seconds"],
        "max_load_seconds": line["max_load_seconds"],
        "spark_overhead_seconds": line["spark_overhead_seconds"],
        "ran_on": sorted(set(line["executors"].values())),
        "alive_after": line["alive_after"],
        "moves": [
            f"{m['partition']}:{m['from']}->{m['to']} {m['reason']}" for m in line["standby"].get("moves", [])
        ],
        "restore_bytes": line["restore_bytes"],
        "cold_restores": sorted(
            int(p) for p, m in partitions.items() if m.get("snapshot_restore_bytes", 0) > 0
        ),
    }


def run(
    cluster: MultiHostCluster,
    wait: str,
    mb_per_partition: int,
    steady: int,
    after: int,
    updates: int,
    during_batch: bool,
) -> dict[str, Any]:
    """One query under ``spark.locality.wait=wait``: load, steady batches, host loss, the batches after."""
    work = Path(tempfile.mkdtemp(prefix="new-executor-bench-"))
    keys = mb_per_partition * 1024 * 1024 * PARTITIONS // VALUE_BYTES
    rng = np.random.default_rng(11)
    _write_batch(work / "in", 0, np.arange(keys))
    for i in range(1, steady + after + 2):
        _write_batch(work / "in", i, rng.choice(keys, min(keys, updates), replace=False))
    conf = {**cluster.driver_conf(), **cluster.fast_recovery_conf(), "spark.locality.wait": wait}
    extra = [f"--value-bytes={VALUE_BYTES}", f"--pause-after={steady}"]
    driver = DriverRun(
        __file__, work, cluster, conf, extra + (["--kill-during-batch"] if during_batch else [])
    )
    driver.wait_for(lambda x: x.get("paused") == steady or x.get("batch_id") == steady, poll=0.05)
    paused = next(x for x in driver.lines() if x.get("batch_id") == steady)
    victim = paused["assignment"]["0"]["active"]["host"]
    if during_batch:  # halfway through the next batch's expected time
        seconds = [x["seconds"] for x in driver.lines() if x.get("batch_id", 0) > 1]
        time.sleep(statistics.median(seconds) / 2)
    cluster.kill_host(cluster.hosts.index(victim))
    driver.resume()
    driver.finish()
    cluster.start_host(cluster.hosts.index(victim))
    batches = {x["batch_id"]: x for x in driver.lines() if "batch_id" in x}
    steady_seconds = statistics.median(batches[b]["seconds"] for b in range(2, steady + 1))
    return {
        "locality_wait": wait,
        "updates_per_batch": updates,
        "killed": "during a batch" if during_batch else "between batches",
        "steady_batch_seconds": steady_seconds,
        "killed_host": victim,
        "batches": [_summary(batches[b]) for b in range(steady, steady + after + 2)],
        "log": str(work / "job.log"),
    }


def main() -> int:
    """Parse arguments; run the job, or the whole benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--waits", default="3s,1s", help="spark.locality.wait values, comma-separated")
    parser.add_argument("--mb", type=int, default=20, help="MB of state per partition")
    parser.add_argument("--steady", type=int, default=4, help="steady batches before the host loss")
    parser.add_argument("--after", type=int, default=6, help="batches after the failover batch")
    parser.add_argument("--updates", type=int, default=UPDATES_PER_BATCH, help="updated keys per batch")
    parser.add_argument(
        "--kill-during-batch", action="store_true", help="kill the host halfway through a batch, not between"
    )
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    for name in ("--input", "--checkpoint", "--local-dir", "--control"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES, help=argparse.SUPPRESS)
    parser.add_argument("--pause-after", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return job(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cluster is stopped below
    results = []
    for wait in args.waits.split(","):
        # A fresh cluster per run: the spare worker must be free for the replacement.
        cluster = MultiHostCluster(workers=3, worker_memory="2g").start()
        try:
            started = time.monotonic()
            result = run(
                cluster, wait, args.mb, args.steady, args.after, args.updates, args.kill_during_batch
            )
            result["run_seconds"] = round(time.monotonic() - started, 1)
            print(json.dumps(result), file=sys.stderr, flush=True)
            results.append(result)
        finally:
            cluster.stop()
    print(json.dumps({"benchmark": "new_executor", "partitions": PARTITIONS, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    import new_executor  # the importable module, so workers unpickle the processor by name

    sys.exit(new_executor.main())
