"""blobstate from a classic session and from a Spark Connect client, side by side; prints JSON.

The workload: a running count and sum of ``value`` per key over ``--keys`` keys, ``--batches`` micro-batches
of ``--events`` events (one parquet file each, ``maxFilesPerTrigger=1``), ``--partitions`` partitions,
``local[2]``, each batch's output written as parquet (the same sink everywhere). Implementations, one
after the other, each in fresh processes:

* ``classic``: ``blobstate.transform_with_state`` on a classic session (``api``: ``--api``), the driver in
  the client process;
* ``connect``: the same job from a Connect client process against a Connect server started with
  blobstate's plugin (``blobstate connect-server-args``): the driver runs in the server's Python;
* ``connect_no_plugin``: the same against a server without the plugin: refused at start, in one line
  (recorded as such: there is no run to measure);
* ``tws_connect``: Spark's own ``groupBy(key).transformWithStateInPandas`` from a Connect client, with
  blobstate's ``RunningCount`` processor and Spark's RocksDB state store provider.

CPU is that of every descendant of this process (client, Connect server JVM and its Python processes,
or the classic job's JVM and Python), sampled from /proc every 0.1 s; a batch ends when its output's
``_SUCCESS`` file appears. Per implementation: the median batch seconds and the CPU per event over the
batches after the first ``--warmup`` ones, and the bytes blobstate restored (``restore_bytes`` of its
commits, read from the checkpoint). Ratios are against ``classic``. Run by hand (several minutes):

    .venv/bin/python bench/connect.py [--keys 20000] [--events 20000] [--batches 8] [--partitions 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from spark_vs_native import descendants, write_inputs  # noqa: E402

from connect_server import connect_server  # type: ignore[import-not-found]  # noqa: E402  (tests/)


# ---------------------------------------------------------------------------------------------- the job
def job(args: argparse.Namespace) -> int:
    """One implementation's client process: run the query until the input is processed."""
    from pyspark.sql import SparkSession

    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, ArrowRunningCount, RunningCount
    from blobstate.errors import BlobstateError

    if args.remote:
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", str(args.partitions))
            .getOrCreate()
        )
    work = Path(args.work)
    out = str(work / "out")
    events = (
        spark.readStream.schema("key STRING, value BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(args.input)
    )

    def sink(frame: Any, batch_id: int) -> None:
        frame.write.mode("overwrite").parquet(f"{out}/batch={batch_id:05d}")

    if args.kind == "tws":
        spark.conf.set(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
        query = (
            events.groupBy("key")
            .transformWithStateInPandas(
                RunningCount(), RUNNING_COUNT_OUTPUT, outputMode="Update", timeMode="None"
            )
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(work / "checkpoint"))
            .start()
        )
    else:
        processor = ArrowRunningCount() if args.api == "arrow" else RunningCount()
        try:
            query = blobstate.transform_with_state(
                events,
                key="key",
                processor=processor,
                output_schema=RUNNING_COUNT_OUTPUT,
                checkpoint=str(work / "checkpoint"),
                sink=sink,
                num_partitions=args.partitions,
                api=args.api,
            )
        except BlobstateError as error:
            print(json.dumps({"refused": f"{type(error).__name__}: {error}"}), flush=True)
            return 3
    query.processAllAvailable()
    query.stop()
    return 0


# ---------------------------------------------------------------------------------------------- runs
class Sampler:
    """This process's descendants' CPU seconds, sampled every 0.1 s; the total at given moments."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], float] = {}
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen.update(descendants())
            self.samples.append((time.monotonic(), sum(self.seen.values())))
            self._stop.wait(0.1)

    def at(self, moment: float) -> float:
        """The total CPU seconds at the first sample at or after ``moment``."""
        return next((cpu for t, cpu in self.samples if t >= moment), self.samples[-1][1])

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


def run(kind: str, args: argparse.Namespace, inputs: Path, url: str | None) -> dict[str, Any]:
    """One implementation: its client process, batch ends from the output's ``_SUCCESS`` files."""
    work = Path(tempfile.mkdtemp(prefix=f"connect-bench-{kind}-"))
    api = args.api
    command = [
        sys.executable,
        __file__,
        "--job",
        f"--kind={'tws' if kind == 'tws_connect' else 'blobstate'}",
        f"--input={inputs}",
        f"--work={work}",
        f"--api={api}",
        f"--partitions={args.partitions}",
        *([f"--remote={url}"] if url else []),
    ]
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    sampler = Sampler()
    started = time.monotonic()
    with (work / "job.log").open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        ends: dict[int, float] = {}
        while process.poll() is None:
            for done in (work / "out").glob("batch=*/_SUCCESS"):
                batch = int(done.parent.name.split("=")[1])
                ends.setdefault(batch, time.monotonic())
            time.sleep(0.05)
        for done in (work / "out").glob("batch=*/_SUCCESS"):
            ends.setdefault(int(done.parent.name.split("=")[1]), time.monotonic())
    stdout = process.stdout.read() if process.stdout else ""
    sampler.stop()
    result: dict[str, Any] = {"implementation": kind, "exit": process.returncode}
    refused = [json.loads(x)["refused"] for x in stdout.splitlines() if x.startswith('{"refused"')]
    if refused:
        result["refused"] = refused[0]
        return result
    if process.returncode != 0 or len(ends) < args.batches:
        result["log_tail"] = (work / "job.log").read_text(errors="replace")[-2000:]
        return result
    order = sorted(ends)
    steady = order[args.warmup :]
    first = ends[order[args.warmup - 1]]
    seconds = [ends[b] - ends[a] for a, b in zip(order[args.warmup - 1 :], steady, strict=False)]
    cpu = sampler.at(ends[steady[-1]]) - sampler.at(first)
    result.update(
        {
            "batches": len(order),
            "median_batch_seconds": round(statistics.median(seconds), 3),
            "cpu_seconds_steady": round(cpu, 2),
            "cpu_ms_per_event": round(1000 * cpu / (args.events * len(steady)), 4),
            "events_per_cpu_second": round(args.events * len(steady) / cpu),
            "run_seconds": round(time.monotonic() - started, 1),
            "restore_bytes": restore_bytes(work / "checkpoint"),
        }
    )
    return result


def restore_bytes(checkpoint: Path) -> int | None:
    """The sum of the partitions' ``restore_bytes`` over blobstate's commits (None: not blobstate's)."""
    commits = checkpoint / "commits"
    if not (checkpoint / "metadata.json").exists() or not commits.is_dir():
        return None
    total = 0
    for path in commits.glob("*.json"):
        commit = json.loads(path.read_text())
        for part in (commit.get("metrics") or {}).get("partitions", {}).values():
            total += int(part.get("restore_bytes", 0))
    return total


def main() -> int:
    """Parse arguments; run the job, or the whole benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--api", default="arrow", choices=["arrow", "pandas"])
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="blobstate", help=argparse.SUPPRESS)
    for name in ("--input", "--work", "--remote"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return job(args)
    base = Path(tempfile.mkdtemp(prefix="connect-bench-"))
    inputs = base / "in"
    write_inputs(inputs, args.keys, args.events, args.batches, seed=5)
    results = [run("classic", args, inputs, None)]
    with connect_server(base / "server", plugin=True) as server:
        results.append(run("connect", args, inputs, server.url))
        results.append(run("tws_connect", args, inputs, server.url))
    with connect_server(base / "server-bare", plugin=False) as server:
        results.append(run("connect_no_plugin", args, inputs, server.url))
    classic = results[0].get("cpu_ms_per_event")
    for r in results:
        if classic and r.get("cpu_ms_per_event"):
            r["cpu_per_event_over_classic"] = round(r["cpu_ms_per_event"] / classic, 2)
    print(
        json.dumps(
            {
                "benchmark": "connect",
                "keys": args.keys,
                "events_per_batch": args.events,
                "batches": args.batches,
                "warmup": args.warmup,
                "partitions": args.partitions,
                "api": args.api,
                "load_average": os.getloadavg(),
                "runs": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
