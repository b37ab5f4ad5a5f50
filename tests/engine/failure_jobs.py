"""Pieces of the failure tests (``test_failures.py``): a processor, its plain-Python reference, a job.

Python workers import this module by name (``failure_jobs``), so it lives beside the tests and the
tests put its directory on the workers' ``PYTHONPATH``. Run as a script it is a standalone streaming
job (its own SparkSession, ``local[2]`` or ``local-cluster[2,1,1024]``) that prints one JSON line
per committed batch, so a test can kill it (or one of its executors) mid-stream and restart it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

INPUT_SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
OUTPUT_SCHEMA = "k string, count long, total long"

Totals = dict[str, tuple[int, int]]
"""Per key: (rows seen, sum of their values)."""


class TotalsProcessor(StatefulProcessor):
    """Running count and sum of ``v`` per key; emits the key's new totals whenever it has input."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the per-key totals."""
        self.handle = handle
        self.totals = handle.getValueState("totals", "count LONG, total LONG")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add this batch's rows of the key to its totals."""
        (k,) = key
        count, total = self.totals.get() or (0, 0)
        for frame in rows:
            count += len(frame)
            total += int(frame["v"].sum())
        self.totals.update((count, total))
        yield pd.DataFrame({"k": [k], "count": [count], "total": [total]})

    def close(self) -> None:
        """Nothing to release."""


class FailAfterCommitProcessor(TotalsProcessor):
    """:class:`TotalsProcessor` whose first attempt seeing ``trigger_key`` fails after its partition commit.

    The failure is injected at a real point of the engine: when ``PartitionState.commit`` returns (the
    delta is uploaded, the working store is clean at the new uncommitted version) and before the task
    returns its metadata row. What that attempt committed (``checkpoint``, ``objects``) is written to
    ``record`` as JSON; ``record``'s existence also makes the failure happen once only.
    """

    def __init__(self, trigger_key: str, record: str) -> None:
        self.trigger_key = trigger_key
        self.record = record

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """As the parent; arms the failure on the first attempt that handles ``trigger_key``."""
        from pyspark import TaskContext

        if key[0] == self.trigger_key and TaskContext.get().attemptNumber() == 0:
            try:
                os.close(os.open(self.record, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                _fail_when_partition_commit_returns(Path(self.record))
        yield from super().handleInputRows(key, rows, timerValues)


def _fail_when_partition_commit_returns(record: Path) -> None:
    from blobstate.state.partition import PartitionState

    target = PartitionState.commit.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is target and arg is not None:
            sys.setprofile(None)
            record.write_text(
                json.dumps({"checkpoint": arg.checkpoint_id.name, "objects": arg.objects_written})
            )
            raise RuntimeError(f"injected task failure after committing {arg.checkpoint_id.name}")

    sys.setprofile(profile)


# ---------------------------------------------------------------------------------------------- data
class Recorder:
    """An idempotent in-memory sink: each batch id's sorted rows (a replay replaces them), and call counts."""

    def __init__(self, fail_on: dict[int, Exception] | None = None) -> None:
        self.rows: dict[int, list[tuple[str, int, int]]] = {}
        self.calls: Counter[int] = Counter()
        self.fail_on = dict(fail_on or {})

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.calls[batch_id] += 1
        if batch_id in self.fail_on:
            raise self.fail_on.pop(batch_id)
        self.rows[batch_id] = rows_of(frame.toArrow())


def start_query(
    spark: Any, tmp_path: Path, sink: Any, processor: Any = None, *, partitions: int = 2, **options: Any
) -> Any:
    """The totals query over ``tmp_path/in`` (one file per batch) with its checkpoint in ``tmp_path``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    import blobstate

    frames = (
        spark.readStream.schema(from_arrow_schema(INPUT_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
    )
    settings: dict[str, Any] = {"snapshot_every": 2, "async_cleanup": False}
    settings.update(options)
    return blobstate.transform_with_state(
        frames,
        key="k",
        processor=processor if processor is not None else TotalsProcessor(),
        output_schema=OUTPUT_SCHEMA,
        checkpoint=str(tmp_path / "ckpt"),
        sink=sink,
        num_partitions=partitions,
        local_dir=str(tmp_path / "local"),
        **settings,
    )


def make_batches(batches: int, rows: int = 400, keys: int = 60, seed: int = 11) -> list[pa.Table]:
    """Deterministic input: ``batches`` tables of (k, v) rows over ``keys`` keys."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        ks = rng.integers(0, keys, rows)
        vs = rng.integers(-1000, 1000, rows)
        out.append(pa.table({"k": [f"k{k:03d}" for k in ks], "v": vs.astype(np.int64)}, schema=INPUT_SCHEMA))
    return out


def write_inputs(tables: list[pa.Table], directory: Path, first: int = 0) -> None:
    """One parquet file per batch, with increasing modification times (the file source's order)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, table in enumerate(tables, start=first):
        path = directory / f"part-{i:05d}.parquet"
        tmp = directory / f".part-{i:05d}.tmp"
        pq.write_table(table, tmp)
        os.utime(tmp, (1_600_000_000 + i, 1_600_000_000 + i))
        os.replace(tmp, path)


def reference_outputs(tables: list[pa.Table]) -> dict[int, list[tuple[str, int, int]]]:
    """What :class:`TotalsProcessor` must emit per batch id, computed without Spark."""
    totals: Totals = {}
    out: dict[int, list[tuple[str, int, int]]] = {}
    for batch_id, table in enumerate(tables):
        seen: set[str] = set()
        for row in table.to_pylist():
            count, total = totals.get(row["k"], (0, 0))
            totals[row["k"]] = (count + 1, total + row["v"])
            seen.add(row["k"])
        out[batch_id] = sorted((k, *totals[k]) for k in seen)
    return out


def rows_of(table: pa.Table) -> list[tuple[str, int, int]]:
    """The sorted (k, count, total) rows of an output table."""
    return sorted((r["k"], r["count"], r["total"]) for r in table.to_pylist())


def read_output_dir(directory: Path) -> dict[int, list[tuple[str, int, int]]]:
    """Outputs of :func:`overwrite_by_batch_sink`, by batch id."""
    return {
        int(p.stem.split("-")[1]): rows_of(pq.read_table(p))
        for p in sorted(directory.glob("batch-*.parquet"))
    }


def overwrite_by_batch_sink(
    output_dir: Path, *, hang_on_batch: int | None = None
) -> Callable[[Any, int], None]:
    """An idempotent sink: batch ``b`` goes to ``batch-<b>.parquet``, replaced on replay.

    With ``hang_on_batch``, it prints ``{"sink_hangs": b}`` before writing that batch and sleeps, so a
    test can kill the driver while the batch is in flight (state uploaded, nothing committed).
    """

    def sink(frame: Any, batch_id: int) -> None:
        table = frame.toArrow()
        if batch_id == hang_on_batch:
            print(json.dumps({"sink_hangs": batch_id}), flush=True)
            time.sleep(3600)
        output_dir.mkdir(parents=True, exist_ok=True)
        tmp = output_dir / f".batch-{batch_id}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, output_dir / f"batch-{batch_id:05d}.parquet")

    return sink


# ---------------------------------------------------------------------------------------------- executors
def executor_pids(app_id: str, executor_id: str) -> list[int]:
    """Pids of the executor JVM(s) ``executor_id`` of application ``app_id`` on this machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" not in argv:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if _arg(args, "--app-id") == app_id and _arg(args, "--executor-id") == executor_id:
            found.append(int(entry.name))
    return found


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def kill_executor(spark: Any, executor_id: str, timeout: float = 120.0) -> int:
    """SIGKILL the JVM of ``executor_id`` and wait until the driver no longer lists it; returns its pid."""
    from blobstate.engine.jvm.classic import PlacementHelper

    app_id = spark.sparkContext.applicationId
    pids = executor_pids(app_id, executor_id)
    if len(pids) != 1:
        raise RuntimeError(f"expected one JVM for executor {executor_id} of {app_id}, found {pids}")
    os.kill(pids[0], signal.SIGKILL)
    helper = PlacementHelper.get(spark)
    deadline = time.monotonic() + timeout
    while executor_id in {e.executor_id for e in helper.executors()}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the driver still lists executor {executor_id} {timeout}s after its kill")
        time.sleep(0.2)
    return pids[0]


# ---------------------------------------------------------------------------------------------- the job
def build_spark(master: str) -> Any:
    """A SparkSession for the job: ``local[2]`` or ``local-cluster[2,1,1024]``."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("blobstate-failure-job")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if master.startswith("local-cluster"):
        # One shared host: a busy machine must not let a task drift to the other executor.
        builder = builder.config("spark.locality.wait", "30s").config("spark.executor.memory", "768m")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def main(argv: list[str] | None = None) -> int:
    """Run the totals query over every input file, printing a JSON line per batch; then exit."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--snapshot-every", type=int, default=2)
    parser.add_argument("--hang-on-batch", type=int, default=None)
    parser.add_argument("--kill-executor-after-batch", type=int, default=None)
    parser.add_argument(
        "--kill-executor-in-sink",
        type=int,
        default=None,
        help="in this batch's sink, before it reads the outputs, SIGKILL the executor of partition 0",
    )
    parser.add_argument(
        "--inline-output-bytes",
        type=int,
        default=None,
        help="the query's inline_output_bytes (0: outputs always persisted on the executors)",
    )
    args = parser.parse_args(argv)

    import blobstate
    from blobstate.engine.driver import BatchReport

    spark = build_spark(args.master)
    print(json.dumps({"started": spark.sparkContext.applicationId}), flush=True)
    if args.master.startswith("local-cluster"):
        from blobstate.engine.jvm.classic import PlacementHelper

        helper = PlacementHelper.get(spark)
        assert helper is not None, "placement helper unavailable"
        deadline = time.monotonic() + 300
        while len(helper.executors()) < 2:
            assert time.monotonic() < deadline, "executors did not register"
            time.sleep(0.5)
    from pyspark.sql.pandas.types import from_arrow_schema

    source = spark.readStream.schema(from_arrow_schema(INPUT_SCHEMA)).option("maxFilesPerTrigger", 1)
    frames = source.parquet(str(args.input))

    last_executors: dict[int, str] = {}
    sink = overwrite_by_batch_sink(args.output, hang_on_batch=args.hang_on_batch)

    def killing_sink(frame: Any, batch_id: int) -> None:
        if batch_id == args.kill_executor_in_sink and "killed" not in last_executors.values():
            victim = last_executors[0]  # placement is sticky: it also ran partition 0 of this batch
            last_executors[-1] = "killed"
            print(
                json.dumps({"killed_in_sink": {"executor_id": victim, "pid": kill_executor(spark, victim)}})
            )
        sink(frame, batch_id)

    def on_batch(report: BatchReport) -> None:
        last_executors.update(report.executors)
        line = asdict(report)
        if report.batch_id == args.kill_executor_after_batch and not report.skipped:
            victim = report.executors[0]
            line["killed"] = {"executor_id": victim, "pid": kill_executor(spark, victim)}
        print(json.dumps(line), flush=True)

    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=TotalsProcessor(),
        output_schema=OUTPUT_SCHEMA,
        checkpoint=args.checkpoint,
        sink=killing_sink,
        num_partitions=args.partitions,
        local_dir=args.local_dir,
        snapshot_every=args.snapshot_every,
        on_batch=on_batch,
        **({} if args.inline_output_bytes is None else {"inline_output_bytes": args.inline_output_bytes}),
    )
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    import failure_jobs  # the importable module, so workers unpickle its classes by name

    sys.exit(failure_jobs.main())
