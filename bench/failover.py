"""Failover time with and without standby replicas, against the state size, on a multi-host cluster.

Starts the multi-host Spark standalone cluster of the tests (``tests/standby/cluster.py``: three workers
on 127.0.0.2-4 with private disks, two one-core executors, one spare worker) and, for each state size and
for ``standby_replicas`` 1 and 0, runs a fresh query (a driver subprocess):

1. batch 0 writes ``keys`` keys of ``value_bytes`` random bytes each (the state: about keys x value_bytes
   over two partitions, snapshotted at once);
2. ``steady`` batches update 2,000 random keys each (steady batch time: their median);
3. the driver pauses, the host that runs partition 0 is killed (worker, executor, Python workers and
   its disk with them); the driver goes on as soon as Spark saw the executor go (a replacement starts
   on the spare worker meanwhile);
4. one more batch of 2,000 updates: the failover batch (its time, restore bytes and seconds).

Prints one JSON object: per run the steady and failover batch seconds, their ratio, restore bytes and
seconds of the moved partitions, Spark's recovery and overhead seconds, and the standby's cost per
steady batch (sync task seconds and bytes). Run by hand (takes several minutes at the 1 GB size):

    .venv/bin/python bench/failover.py [--sizes 100,1000] (MB per partition)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle  # noqa: E402
from cluster import MultiHostCluster  # type: ignore[import-not-found]  # noqa: E402  (tests/, on sys.path above)

PARTITIONS = 2
VALUE_BYTES = 8192
UPDATES_PER_BATCH = 2000


class BlobPerKey(StatefulProcessor):
    """Keeps ``value_bytes`` random bytes per key; every input row replaces its key's value."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = value_bytes

    # blobstate passes its own handle; PySpark types init with PySpark's.
    def init(self, handle: StatefulProcessorHandle) -> None:  # type: ignore[override]
        """One binary value per key."""
        self.blob = handle.getValueState("blob", "data BINARY")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Replace the key's value; emit the key."""
        for _ in rows:
            pass
        self.blob.update((os.urandom(self.value_bytes),))
        yield pd.DataFrame({"k": [key[0]]})

    def close(self) -> None:
        """Nothing to release."""


def _write_batch(directory: Path, index: int, keys: np.ndarray) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"k": pa.array([f"k{k:09d}" for k in keys]), "v": pa.array(keys, pa.int64())})
    tmp = directory / f".b{index}.tmp"
    pq.write_table(table, tmp)
    os.utime(tmp, (1_600_000_000 + index, 1_600_000_000 + index))
    os.replace(tmp, directory / f"part-{index:05d}.parquet")


# ---------------------------------------------------------------------------------------------- the job
def cluster_session(confs: list[str], app_name: str, partitions: int) -> tuple[Any, Any]:
    """A driver subprocess's session on the cluster (``confs``: ``key=value``) and its placement helper,
    once two executors have registered."""
    from pyspark.sql import SparkSession

    from blobstate.engine.jvm.classic import PlacementHelper

    builder = SparkSession.builder.appName(app_name)
    for item in confs:
        key, value = item.split("=", 1)
        builder = builder.config(key, value)
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    helper = PlacementHelper.get(spark)
    assert helper is not None
    deadline = time.monotonic() + 300
    while len(helper.executors()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return spark, helper


def batch_line(query: Any, report: Any) -> dict[str, Any]:
    """One batch's report as JSON, with the standby assignment, once its standby sync finished."""
    from dataclasses import asdict

    from blobstate.standby.step import StandbyStep

    standby = query.blobstate_driver.step(StandbyStep)
    if standby.syncer is not None:
        standby.syncer.wait(600)
    line = asdict(report)
    line["assignment"] = {str(p): a.to_json() for p, a in standby.assignment.items()}
    return line


def pause_for_kill(batch_id: int, control: Path, helper: Any) -> None:
    """Print that the driver paused after ``batch_id``; wait for the kill, then until Spark saw the
    executor go (about 0.15 s): the next batch runs on the executor left, without waiting for the
    replacement (whose cold start is Spark's, not blobstate's)."""
    print(json.dumps({"paused": batch_id}), flush=True)
    while not (control / "resume").exists():
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while len(helper.executors()) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def job(args: argparse.Namespace) -> int:
    """The driver subprocess: run batches, pause before the last one, print one JSON line per batch."""
    import blobstate

    spark, helper = cluster_session(args.conf, "blobstate-failover-bench", PARTITIONS)
    control = Path(args.control)
    state: dict[str, Any] = {}

    def on_batch(report: Any) -> None:
        print(json.dumps(batch_line(state["query"], report)), flush=True)
        if report.batch_id == args.pause_after:
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
        standby_replicas=args.replicas,
        snapshot_every=10,
        on_batch=on_batch,
    )
    state["query"] = query
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


# ---------------------------------------------------------------------------------------------- runs
class DriverRun:
    """A benchmark's driver subprocess on the cluster (``script --job`` with the common arguments and
    ``extra``): its JSON lines on stdout, its log."""

    def __init__(
        self, script: str, work: Path, cluster: MultiHostCluster, conf: dict[str, str], extra: list[str]
    ) -> None:
        """Start it; the input is ``work/in``, the checkpoint ``work/ckpt``, the pause control
        ``work/control``."""
        (work / "control").mkdir()
        command = [
            sys.executable,
            script,
            "--job",
            *(f"--conf={k}={v}" for k, v in conf.items()),
            f"--input={work / 'in'}",
            f"--checkpoint={work / 'ckpt'}",
            f"--local-dir={cluster.host_disk}",
            f"--control={work / 'control'}",
            *extra,
        ]
        self.work = work
        self.out = work / "job.out"
        with self.out.open("w") as stdout, (work / "job.log").open("w") as stderr:
            self.proc = subprocess.Popen(
                command, env=cluster.driver_env([str(ROOT / "bench")]), stdout=stdout, stderr=stderr
            )

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far."""
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.startswith("{")]

    def wait_for(self, done: Callable[[dict[str, Any]], bool], poll: float = 0.2) -> None:
        """Until a printed line satisfies ``done``; the log's tail if the driver ended first."""
        while not any(done(x) for x in self.lines()):
            if self.proc.poll() is not None:
                raise RuntimeError((self.work / "job.log").read_text()[-4000:])
            time.sleep(poll)

    def resume(self) -> None:
        """Let a driver paused for the kill go on."""
        (self.work / "control" / "resume").touch()

    def finish(self, timeout: float = 1800) -> None:
        """Wait for the driver to end; the log's tail if it failed."""
        if self.proc.wait(timeout) != 0:
            raise RuntimeError((self.work / "job.log").read_text()[-4000:])


def run(cluster: MultiHostCluster, mb_per_partition: int, replicas: int, steady: int) -> dict[str, Any]:
    """One query: load, steady batches, host loss, failover batch."""
    work = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    keys = mb_per_partition * 1024 * 1024 * PARTITIONS // VALUE_BYTES
    rng = np.random.default_rng(7)
    _write_batch(work / "in", 0, np.arange(keys))
    for i in range(1, steady + 2):
        _write_batch(work / "in", i, rng.choice(keys, min(keys, UPDATES_PER_BATCH), replace=False))
    conf = {**cluster.driver_conf(), **cluster.fast_recovery_conf()}
    extra = [f"--replicas={replicas}", f"--value-bytes={VALUE_BYTES}", f"--pause-after={steady}"]
    driver = DriverRun(__file__, work, cluster, conf, extra)
    driver.wait_for(lambda x: x.get("paused") == steady)
    paused = next(x for x in driver.lines() if x.get("batch_id") == steady)
    victim = paused["assignment"]["0"]["active"]["host"]
    moved = [p for p, a in paused["assignment"].items() if a["active"]["host"] == victim]
    cluster.kill_host(cluster.hosts.index(victim))
    driver.resume()
    driver.finish()
    cluster.start_host(cluster.hosts.index(victim))
    batches = {x["batch_id"]: x for x in driver.lines() if "batch_id" in x}
    steady_lines = [batches[b] for b in range(2, steady + 1)]
    failover = batches[steady + 1]
    steady_seconds = statistics.median(x["seconds"] for x in steady_lines)
    sync = [r for x in steady_lines for r in x["standby"].get("sync", [])]
    return {
        "mb_per_partition": mb_per_partition,
        "keys": keys,
        "standby_replicas": replicas,
        "state_keys": batches[0]["state_keys"],
        "load_batch_seconds": batches[0]["seconds"],
        "steady_batch_seconds": steady_seconds,
        "failover_batch_seconds": failover["seconds"],
        "failover_over_steady": round(failover["seconds"] / steady_seconds, 2),
        "moved_partitions": moved,
        "moved_restore_bytes": {p: failover["partitions"][p]["restore_bytes"] for p in moved},
        "moved_snapshot_restore_bytes": {
            p: failover["partitions"][p]["snapshot_restore_bytes"] for p in moved
        },
        "moved_load_seconds": {p: failover["partitions"][p]["load_seconds"] for p in moved},
        "moved_load_rules": {p: failover["partitions"][p]["load_rule"] for p in moved},
        "failover_spark_recovery_seconds": failover["spark_recovery_seconds"],
        "failover_spark_overhead_seconds": failover["spark_overhead_seconds"],
        "failovers": failover["standby"].get("failovers"),
        "failovers_without_standby": failover["standby"].get("failovers_without_standby"),
        "sync_task_seconds_per_batch": round(
            sum(r["task_seconds"] for r in sync) / max(1, len(steady_lines)), 3
        ),
        "sync_bytes_per_batch": sum(r["bytes"] for r in sync) // max(1, len(steady_lines)),
    }


def main() -> int:
    """Parse arguments; run the job, or the whole benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000", help="MB of state per partition, comma-separated")
    parser.add_argument("--steady", type=int, default=4, help="steady batches before the host loss")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    for name in ("--input", "--checkpoint", "--local-dir", "--control"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--value-bytes", type=int, default=VALUE_BYTES, help=argparse.SUPPRESS)
    parser.add_argument("--pause-after", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return job(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cluster is stopped below
    cluster = MultiHostCluster(workers=3, worker_memory="2g").start()
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for replicas in (1, 0):
                started = time.monotonic()
                result = run(cluster, size, replicas, args.steady)
                result["run_seconds"] = round(time.monotonic() - started, 1)
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
    finally:
        cluster.stop()
    print(json.dumps({"benchmark": "failover", "partitions": PARTITIONS, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    import failover  # the importable module, so workers unpickle the processor by name

    sys.exit(failover.main())
