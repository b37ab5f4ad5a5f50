"""Where a small batch's time goes: blobstate's per-batch fixed cost against a stateless floor; prints JSON.

Both queries read ``--events`` events per batch (one parquet file per batch, ``maxFilesPerTrigger=1``)
over ``--keys`` keys on ``local[2]`` with ``--partitions`` partitions and write to the ``noop`` sink:

* ``blobstate``: the row API's running count (``RowRunningCount``), with the default
  ``inline_output_bytes`` (or ``--local-bytes``): small outputs come to the driver with the tasks'
  metadata, the sink gets a local DataFrame (one Spark job for the stage);
* ``blobstate_persisted``: the same with ``inline_output_bytes=0`` (outputs persisted on the executors,
  the sink's job reads them: the path of large outputs, and of every batch before small outputs came
  back with the tasks' metadata);
* ``blobstate_writer``: the same with the sink declared as ``WriterSink("noop", mode="overwrite")``:
  the stage runs inside the sink's write, one Spark job as the floor's (``QueryConfig.write_through``);
* ``floor``: ``foreachBatch`` with the same hash shuffle and one ``mapInArrow`` stage that passes the
  rows through, no state.

Per batch (the first ``--warmup`` batches are left out): the CPU time of the whole process tree
(driver, JVM, Python workers, read from /proc; ``cpu_ms_per_batch``, which holds up under a shared
machine's noise better than times do), medians of Spark's own phases from the query
progress (``durationMs``: latestOffset, getBatch, queryPlanning, walCommit, addBatch (the
``foreachBatch`` call), commitOffsets, triggerExecution) and, for blobstate, of its ``BatchReport``:
the shuffle (its map stage, run when the stage's input is placed), the stage (tasks, persisting or
collecting outputs), the sink, the commit (commit log write, progress, post-commit start), the
post-commit cleanup (on a background thread, overlapping the next batch), the slowest task and, inside
it, load, process and commit of the partition.

    .venv/bin/python bench/fixed_cost.py [--events 100] [--keys 50] [--batches 12] [--warmup 2] \
        [--rounds 3] [--more-events 10000,30000,100000]
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proctree import tree_cpu_by_kind
from running_count_query import start_running_count

PHASES = (
    "latestOffset",
    "getBatch",
    "queryPlanning",
    "walCommit",
    "addBatch",
    "commitOffsets",
    "triggerExecution",
)


def write_inputs(directory: Path, batches: int, events: int, keys: int) -> None:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for b in range(batches):
        table = pa.table(
            {
                "key": [f"k{i}" for i in rng.integers(0, keys, events)],
                "value": rng.integers(0, 100, events).astype(np.int64),
            }
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_600_000_000 + b, 1_600_000_000 + b))


def passthrough(batches: Any) -> Any:
    """The floor's stage: the partition's rows, unchanged."""
    yield from batches


def timed(step: Any, seconds: list[float]) -> Any:
    """``step`` (a post-commit step, run on the driver's background thread), timing each run."""

    def run(commit: Any) -> None:
        started = time.perf_counter()
        try:
            step(commit)
        finally:
            seconds.append(time.perf_counter() - started)

    return run


class SteadyCpu:
    """CPU seconds of the whole process tree (driver, JVM, Python workers) over a query's steady batches:
    read from /proc when the last warm-up batch ends and again once every batch ran."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.batches = 0
        self.started: dict[str, float] | None = None

    def batch_done(self) -> None:
        """One batch with input finished (called on the driver, at the batch's end)."""
        self.batches += 1
        if self.batches == self.warmup:
            self.started = tree_cpu_by_kind()

    def per_batch_ms(self) -> dict[str, float] | None:
        """CPU milliseconds per steady batch, read now: ``total`` and per kind of process (None: no
        steady batch)."""
        steady = self.batches - self.warmup
        if self.started is None or steady <= 0:
            return None
        now = tree_cpu_by_kind()
        out = {kind: round((now[kind] - self.started[kind]) * 1000 / steady, 1) for kind in now}
        return {"total": round(sum(out.values()), 1), **out}


def cpu_fields(cpu_ms: dict[str, float] | None) -> dict[str, float | None]:
    """A run's CPU per steady batch as result fields: ``cpu_ms_per_batch`` and one per kind of process."""
    if cpu_ms is None:
        return {"cpu_ms_per_batch": None}
    fields: dict[str, float | None] = {"cpu_ms_per_batch": cpu_ms["total"]}
    fields |= {f"cpu_ms_per_batch_{kind}": ms for kind, ms in cpu_ms.items() if kind != "total"}
    return fields


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def spark_phases(query: Any, warmup: int) -> dict[str, Any]:
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0][warmup:]
    return {f"spark_{k}_ms": median([p["durationMs"].get(k, 0) for p in progress]) for k in PHASES} | {
        "batches": len(progress)
    }


def run_blobstate(
    spark: Any, work: Path, args: argparse.Namespace, inline: int | None, writer: bool = False
) -> dict[str, Any]:
    from blobstate import WriterSink

    reports: list[Any] = []
    if writer:
        options: dict[str, Any] = {"sink": WriterSink("noop", mode="overwrite")}
    else:
        options = {} if inline is None else {"inline_output_bytes": inline}
    cpu = SteadyCpu(args.warmup)

    def on_batch(report: Any) -> None:
        reports.append(report)
        if not report.skipped and report.input_rows > 0:
            cpu.batch_done()

    query = start_running_count(
        spark,
        work / "in",
        work / f"blobstate-ckpt-{inline}-{writer}",
        work / f"local-{inline}-{writer}",
        args.partitions,
        on_batch,
        **options,
    )
    cleanup: list[float] = []
    driver = query.blobstate_driver
    post = driver.post_commit
    post.steps[:] = [(name, timed(step, cleanup)) for name, step in post.steps]
    query.processAllAvailable()
    cpu_ms = cpu.per_batch_ms()
    time.sleep(1)
    out = spark_phases(query, args.warmup) | cpu_fields(cpu_ms)
    query.stop()
    steady = [r for r in reports if not r.skipped and r.input_rows > 0][args.warmup :]

    def part(name: str) -> float | None:
        return median([max(float(m.get(name) or 0) for m in r.partitions.values()) for r in steady])

    out |= {
        "batch_seconds": median([r.seconds for r in steady]),
        "shuffle_seconds": median([r.shuffle_seconds for r in steady]),
        "stage_seconds": median([r.stage_seconds - r.shuffle_seconds for r in steady]),
        "sink_seconds": median([r.sink_seconds for r in steady]),
        "commit_seconds": median([r.commit_seconds for r in steady]),
        "cleanup_seconds": median(cleanup[args.warmup :]),
        "slowest_task_seconds": median([r.max_task_seconds for r in steady]),
        "task_load_seconds": part("load_seconds"),
        "task_process_seconds": part("process_seconds"),
        "task_commit_seconds": part("commit_seconds"),
        "spark_overhead_seconds": median([r.spark_overhead_seconds for r in steady]),
        "inlined_partitions": median([r.inlined_partitions for r in steady]),
    }
    return out


def run_floor(spark: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    events = (
        spark.readStream.schema("key STRING, value BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in"))
    )
    seconds: list[float] = []
    cpu = SteadyCpu(args.warmup)

    def stateless(frame: Any, _: int) -> None:
        started = time.perf_counter()
        frame.repartition(args.partitions, "key").mapInArrow(passthrough, frame.schema).write.format(
            "noop"
        ).mode("overwrite").save()
        seconds.append(time.perf_counter() - started)
        cpu.batch_done()

    query = (
        events.writeStream.foreachBatch(stateless)
        .option("checkpointLocation", str(work / "floor-ckpt"))
        .start()
    )
    query.processAllAvailable()
    cpu_ms = cpu.per_batch_ms()
    time.sleep(1)
    out = spark_phases(query, args.warmup) | cpu_fields(cpu_ms)
    query.stop()
    out["stage_and_sink_seconds"] = median(seconds[args.warmup :])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run the three queries this many times, in a rotating order; report the median round",
    )
    parser.add_argument(
        "--more-events",
        default="",
        help="comma-separated larger batch sizes, each run the same way after --events (key space"
        " --more-keys): where the local path stops paying off (reported in 'larger_batches')",
    )
    parser.add_argument("--more-keys", type=int, default=200_000)
    parser.add_argument(
        "--local-bytes",
        type=int,
        default=None,
        help="the 'blobstate' query's inline_output_bytes (default: blobstate's): a large value shows the"
        " local path at every size",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="blobstate-bench-fixed-"))
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    result = {"rounds": args.rounds, "load_average_start": os.getloadavg()}
    result |= measure(spark, work / "small", args)
    sizes = [int(e) for e in args.more_events.split(",") if e]
    result["larger_batches"] = [
        measure(
            spark,
            work / f"events-{e}",
            argparse.Namespace(**{**vars(args), "events": e, "keys": args.more_keys}),
        )
        for e in sizes
    ]
    result["load_average_end"] = os.getloadavg()
    spark.stop()
    print(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)


def measure(spark: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The floor, the persisted path and the local path on one input, ``args.rounds`` times each."""
    write_inputs(work / "in", args.batches, args.events, args.keys)
    runs: dict[str, Any] = {
        "floor": lambda d: run_floor(spark, d, args),
        "blobstate_persisted": lambda d: run_blobstate(spark, d, args, 0),
        "blobstate": lambda d: run_blobstate(spark, d, args, args.local_bytes),
        "blobstate_writer": lambda d: run_blobstate(spark, d, args, None, writer=True),
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            directory = work / f"round-{r}-{name}"
            directory.mkdir()
            (directory / "in").symlink_to(work / "in")
            rounds[name].append(runs[name](directory))
    result: dict[str, Any] = {"events_per_batch": args.events, "keys": args.keys}
    result["per_round"] = {
        name: [
            {"trigger_ms": x.get("spark_triggerExecution_ms"), "cpu_ms_per_batch": x.get("cpu_ms_per_batch")}
            for x in results
        ]
        for name, results in rounds.items()
    }
    for name, results in rounds.items():
        result[name] = {k: median([x[k] for x in results if x.get(k) is not None]) for k in results[0]}
    f = result["floor"]
    for name in ("blobstate_persisted", "blobstate", "blobstate_writer"):
        b = result[name]
        result[f"{name}_over_floor_trigger_ms"] = (
            round(b["spark_triggerExecution_ms"] / f["spark_triggerExecution_ms"], 2)
            if b.get("spark_triggerExecution_ms") and f.get("spark_triggerExecution_ms")
            else None
        )
        result[f"{name}_over_floor_cpu"] = (
            round(b["cpu_ms_per_batch"] / f["cpu_ms_per_batch"], 2)
            if b.get("cpu_ms_per_batch") and f.get("cpu_ms_per_batch")
            else None
        )
    return result


if __name__ == "__main__":
    main()
