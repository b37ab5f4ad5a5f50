"""blobstate against Spark's own stateful Python APIs on one streaming workload; prints JSON.

The workload: a per-key running count and sum of ``value`` over ``--keys`` string keys, micro-batches
of ``--events`` uniformly random events read from a parquet file source (one file per micro-batch,
``maxFilesPerTrigger=1``, every file written beforehand with increasing mtimes). Implementations,
each run in its own subprocess (a fresh JVM) one after the other, on Spark ``local[2]`` with
``spark.sql.shuffle.partitions`` = blobstate's ``num_partitions`` = ``--partitions``:

* ``blobstate``: ``blobstate.transform_with_state`` with :class:`RunningCountSum`;
* ``blobstate_row``: the same with ``api="row"`` and :class:`RowRunningCountSum` (Rows, no pandas);
* ``blobstate_arrow``: the same with ``api="arrow"`` and :class:`ArrowRunningCountSum` (vectorized: one
  call per partition and batch, state read and written for every key at once);
* ``blobstate_arrow_per_partition``: the same with ``partitions_per_task=1``, a Spark task per state
  partition (blobstate before partition groups; the same as ``blobstate_arrow`` below 8 partitions a core);
* ``tws``: Spark's ``groupBy(key).transformWithStateInPandas`` with the same processor class as
  ``blobstate``;
* ``tws_row``: Spark's row-based ``groupBy(key).transformWithState`` with the same processor class as
  ``blobstate_row``;
* ``apply``: Spark's ``groupBy(key).applyInPandasWithState`` (GroupState holding count and sum);
* ``native``: Spark's JVM-native ``groupBy(key).agg(count, sum)`` in update mode;
* ``floor``: the same pipeline without state, the cost no state layer can remove: the same source,
  ``foreachBatch``, the same hash shuffle into ``--partitions`` partitions and one ``mapInArrow`` stage
  that counts and sums each key's events of the batch with pyarrow (vectorized, no per-key Python
  call), written to the ``noop`` sink. ``cpu_per_event_over_floor`` gives each implementation's CPU per
  event over the floor's;
* ``floor_grouped``: the floor with its ``mapInArrow`` stage run in as many tasks as blobstate's
  partition groups make (``coalesce`` of the shuffled partitions, a narrow grouping as blobstate's):
  what a stateless stage costs with blobstate's task count.

Spark's queries use the RocksDB state store provider, changelog checkpointing and checkpoint format
version 2, and write to the ``noop`` sink; blobstate's sink writes each batch's output DataFrame to
the ``noop`` sink too. Per implementation: the median batch latency (``durationMs.triggerExecution``
of the query's progress; for blobstate its ``BatchReport.seconds``, its trigger time is given too),
steady-state events/s (the first ``--warmup`` batches, default 1, are warm-up; ``events_per_s`` over
the others' latencies, ``events_per_s_trigger`` over trigger times, ``events_per_s_wall`` over the
wall-clock time from the end of the warm-up to the end of the last batch, everything included) and
events per CPU-second, where CPU is that of the whole process tree (driver, JVM, Python workers): the
own user+system time of every process in it, sampled from /proc every 0.25 s by this process and read
off at each batch's end. ``cpu_seconds_per_batch_by_kind`` splits it per steady batch into the JVM, the
driver's Python process and the Python workers (PySpark's daemon and its workers).

The JVM's JIT compiler threads keep compiling for ten or more batches of a fresh JVM (on this workload
they took about half the JVM's CPU in batches 2-6 and a quarter from batch 9 on, in every
implementation); ``--warmup`` leaves them out of the measured batches as far as it goes.
``getrusage(RUSAGE_CHILDREN)`` is reported too but undercounts: PySpark's daemon ignores SIGCHLD, so
its Python workers' time is never accounted to a parent. This process is a child subreaper, so
descendants orphaned on exit stay in the tree it samples. Then restart-to-first-batch: a new
process on the same checkpoint, one more input file, empty local directories (Spark's
``spark.local.dir``, blobstate's ``local_dir``); the time from query start to the first batch's
completion. Ratios are blobstate over the other implementation (above 1: blobstate better).

The machine is shared: ``machine`` gives the load average, a fixed pure-Python loop's time
(``calibration_us``, about 10 us when idle) and, per subprocess, the CPU the rest of the machine used
meanwhile. Events per CPU-second is the figure that holds up under load.

    .venv/bin/python bench/spark_vs_native.py [--keys 100000] [--events 20000] [--batches 4]
        [--warmup 1] [--partitions 2] [--only blobstate,tws,apply,native] [--no-restart]
        [--large | --many-partitions] [--timeout SECONDS] [--timeout-restart SECONDS]
        [--workdir DIR (kept)] [--keep]

``--large``: 1,000,000 keys, 200,000-event batches, 6 batches (unless given), blobstate beside the
JVM-native aggregation. Spark's Python APIs need 35-50 s per default batch on this machine.
``--many-partitions``: Spark's default partition count, 200 (``spark.sql.shuffle.partitions``, which a
new checkpoint takes by default), with 20,000 keys and 2,000-event batches (a low-latency job's small
batches), 6 batches: the cost of a partition in a batch, blobstate beside the JVM-native aggregation and
the floor.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pandas as pd

from blobstate.demo.running_count import ArrowRunningCount, RowRunningCount, RunningCount

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.state import GroupState

INPUT_SCHEMA = "key STRING, value BIGINT"
OUTPUT_SCHEMA = "key STRING, count BIGINT, total BIGINT"
STATE_SCHEMA = "count BIGINT, total BIGINT"
IMPLEMENTATIONS = (
    "blobstate",
    "blobstate_row",
    "blobstate_arrow",
    "blobstate_arrow_per_partition",
    "tws",
    "tws_row",
    "apply",
    "native",
    "floor",
    "floor_grouped",
)
DEFAULT_SET = ("blobstate", "blobstate_row", "blobstate_arrow", "tws", "tws_row", "apply")
LARGE_SET = ("blobstate", "blobstate_row", "blobstate_arrow", "native", "floor")
MANY_PARTITIONS_SET = ("blobstate_arrow", "blobstate_arrow_per_partition", "native", "floor", "floor_grouped")
RESULT_FILE = "result.json"


RunningCountSum = RunningCount
"""Running count and sum of ``value`` per key, written exactly as for transformWithStateInPandas."""

RowRunningCountSum = RowRunningCount
"""The same, written exactly as for Spark's row-based transformWithState."""

ArrowRunningCountSum = ArrowRunningCount
"""The same for blobstate's vectorized API (api="arrow")."""

PROCESSORS = {"blobstate_row": RowRunningCountSum, "blobstate_arrow": ArrowRunningCountSum}


def apply_running_count_sum(
    key: Any, pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """The same running count and sum for applyInPandasWithState (GroupState, no timeout)."""
    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["value"].sum())
    state.update((count, total))
    yield pd.DataFrame({"key": [key[0]], "count": [count], "total": [total]})


# ---------------------------------------------------------------------------------------- CPU time
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def descendants() -> dict[tuple[int, int], float]:
    """Own CPU seconds (user + system) of every live descendant of this process, by (pid, start time).
    (:func:`descendant_kinds` tells what each one is.)

    Own time only: PySpark's daemon ignores SIGCHLD, so its Python workers are reaped by the kernel
    and their time never reaches anyone's ``cutime`` or ``getrusage(RUSAGE_CHILDREN)``; sampling the
    live processes is the only way to count them.
    """
    root = os.getpid()
    parents: dict[int, int] = {}
    own: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        own[int(entry)] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    found: dict[tuple[int, int], float] = {}
    for pid, (started, seconds) in own.items():
        p = parents[pid]
        while p not in (0, 1) and p != root:
            p = parents.get(p, 0)
        if p == root and pid != root:
            found[(pid, started)] = seconds
    return found


CPU_KINDS = ("jvm", "driver_python", "python_workers")
"""What a sampled process is: Spark's JVM, the worker's own (driver) Python process, or anything else
(PySpark's daemon and its Python workers)."""


def descendant_kinds(pids: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The :data:`CPU_KINDS` of each ``(pid, start time)``: by command name, and the direct children of
    this process (the benchmark's worker subprocesses) are the driver Python."""
    root = os.getpid()
    kinds: dict[tuple[int, int], str] = {}
    for pid, started in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kind = "jvm" if comm == "java" else "driver_python" if parent == root else "python_workers"
        kinds[(pid, started)] = kind
    return kinds


class TreeCpuSampler:
    """Samples the CPU time of this process's descendants every ``interval`` seconds on a thread.

    The total counts every process ever seen up to its last sample, so a process that exits loses at
    most ``interval`` seconds of CPU, and one living shorter than that may be missed.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.seen: dict[tuple[int, int], float] = {}
        self.kinds: dict[tuple[int, int], str] = {}
        self.series: list[tuple[float, float]] = []
        self.kind_series: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def sample(self) -> None:
        found = descendants()
        # Every time: a process is first seen as the launcher script that later execs the JVM.
        self.kinds.update(descendant_kinds(found))
        self.seen.update(found)
        now = time.monotonic()
        self.series.append((now, sum(self.seen.values())))
        by_kind = dict.fromkeys(CPU_KINDS, 0.0)
        for key, seconds in self.seen.items():
            kind = self.kinds.get(key, "python_workers")
            by_kind[kind] += seconds
        self.kind_series.append((now, by_kind))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Self:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def total(self) -> float:
        return self.series[-1][1]

    def at(self, moment: float) -> float:
        """The cumulative CPU seconds at a ``time.monotonic()`` moment (linear interpolation)."""
        times = [t for t, _ in self.series]
        i = bisect.bisect_left(times, moment)
        if i == 0:
            return self.series[0][1]
        if i >= len(self.series):
            return self.series[-1][1]
        (t0, c0), (t1, c1) = self.series[i - 1], self.series[i]
        return c0 + (c1 - c0) * (moment - t0) / (t1 - t0) if t1 > t0 else c1

    def kinds_at(self, moment: float) -> dict[str, float]:
        """The cumulative CPU seconds of each kind of process at a moment (the nearest sample before)."""
        times = [t for t, _ in self.kind_series]
        i = max(bisect.bisect_right(times, moment) - 1, 0)
        return self.kind_series[i][1]


def kill_descendants() -> None:
    """SIGKILL every live descendant of this process (PySpark's daemon leaves the process group)."""
    for pid, _started in descendants():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def calibration_us() -> float:
    """A fixed pure-Python loop's time in microseconds: about 10 on an idle machine here."""
    return round(min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) / 1000 * 1e6, 2)


def children_cpu_seconds() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


# ---------------------------------------------------------------------------------------- input data
def write_inputs(directory: Path, keys: int, events: int, files: int, seed: int) -> dict[str, Any]:
    """``files`` parquet files of ``events`` rows, mtimes one second apart; their key statistics."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocabulary = pa.array([f"k{i:07d}" for i in range(keys)], pa.string())
    seen = np.zeros(keys, dtype=bool)
    distinct, cumulative = [], []
    base = time.time() - 10 * files
    for i in range(files):
        idx = rng.integers(0, keys, events)
        table = pa.table(
            {"key": vocabulary.take(pa.array(idx)), "value": rng.integers(0, 1000, events, dtype=np.int64)}
        )
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + i, base + i))
        distinct.append(len(np.unique(idx)))
        seen[idx] = True
        cumulative.append(int(seen.sum()))
    return {"files": files, "distinct_keys_per_file": distinct, "keys_seen_after_file": cumulative}


def link_inputs(source: Path, target: Path, indices: range) -> None:
    """Hard links (same mtimes) of the source's files ``indices`` in ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for i in indices:
        name = f"part-{i:05d}.parquet"
        if not (target / name).exists():
            os.link(source / name, target / name)


def du_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


# ---------------------------------------------------------------------------------------- worker side
def build_spark(spec: dict[str, Any]) -> SparkSession:
    """A local[2] session: RocksDB provider, changelog checkpointing, checkpoint format version 2."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName(f"spark_vs_native-{spec['impl']}-{spec['phase']}")
        .config("spark.driver.memory", spec["driver_memory"])
        .config("spark.local.dir", spec["spark_local_dir"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.checkpointFormatVersion", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def progress_dict(progress: Any) -> dict[str, Any]:
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        parsed: dict[str, Any] = json.loads(text)
        return parsed
    return dict(progress)


def start_query(spark: Any, spec: dict[str, Any], events: Any, on_batch: Any) -> Any:
    """Start the implementation's streaming query on the streaming DataFrame ``events``."""
    impl = spec["impl"]
    if is_blobstate(impl):
        import blobstate

        # The same write as a sink function, declared, so the stage and the write run as one job.
        sink = blobstate.WriterSink("noop", mode="overwrite")
        initial = spec.get("initial_state")
        base = impl.removesuffix("_per_partition")
        return blobstate.transform_with_state(
            events,
            initial_state=spark.read.parquet(initial) if initial else None,
            key="key",
            processor=PROCESSORS.get(base, RunningCountSum)(),
            output_schema=OUTPUT_SCHEMA,
            checkpoint=spec["checkpoint"],
            sink=sink,
            num_partitions=spec["partitions"],
            local_dir=spec["blobstate_local_dir"],
            on_batch=on_batch,
            api={"blobstate_row": "row", "blobstate_arrow": "arrow"}.get(base, "pandas"),
            partitions_per_task=1 if impl != base else 0,
        )
    if impl in ("floor", "floor_grouped"):
        from blobstate.engine.groups import partitions_per_task

        partitions = spec["partitions"]
        per_task = partitions_per_task(partitions, spark.sparkContext.defaultParallelism, 0)
        tasks = -(-partitions // per_task) if impl == "floor_grouped" else partitions

        def stateless(frame: Any, batch_id: int) -> None:
            shuffled = frame.repartition(partitions, "key")
            if tasks < partitions:
                shuffled = shuffled.coalesce(tasks)
            shuffled.mapInArrow(count_sum_per_key, OUTPUT_SCHEMA).write.format("noop").mode(
                "overwrite"
            ).save()

        return (
            events.writeStream.foreachBatch(stateless)
            .option("checkpointLocation", spec["checkpoint"])
            .start()
        )
    if impl in ("tws", "tws_row"):
        grouped = events.groupBy("key")
        rows = impl == "tws_row"
        transform = grouped.transformWithState if rows else grouped.transformWithStateInPandas
        out = transform(
            statefulProcessor=RowRunningCountSum() if rows else RunningCountSum(),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Update",
            timeMode="None",
        )
    elif impl == "apply":
        from pyspark.sql.streaming.state import GroupStateTimeout

        out = events.groupBy("key").applyInPandasWithState(
            apply_running_count_sum,
            outputStructType=OUTPUT_SCHEMA,
            stateStructType=STATE_SCHEMA,
            outputMode="Update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    elif impl == "native":
        from pyspark.sql import functions as F

        out = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return (
        out.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", spec["checkpoint"])
        .start()
    )


def count_sum_per_key(batches: Any) -> Any:
    """The floor's Arrow stage: this batch's count and sum per key of one partition, vectorized."""
    import pyarrow as pa

    collected = [b for b in batches if b.num_rows]
    if not collected:
        return
    table = pa.Table.from_batches(collected).group_by("key").aggregate([("value", "count"), ("value", "sum")])
    table = table.rename_columns(
        ["count" if c == "value_count" else "total" if c == "value_sum" else c for c in table.column_names]
    )
    yield from table.select(["key", "count", "total"]).to_batches()


def worker(spec_path: Path) -> int:
    """One implementation, one phase (run or restart), in this fresh process; writes result.json."""
    spec = json.loads(spec_path.read_text())
    result_path = spec_path.with_name(RESULT_FILE)
    result: dict[str, Any] = {"impl": spec["impl"], "phase": spec["phase"]}
    try:
        started = time.monotonic()
        spark = build_spark(spec)
        result["session_seconds"] = round(time.monotonic() - started, 3)
        from pyspark.sql.streaming.listener import StreamingQueryListener

        samples: dict[int, float] = {}

        class Sampler(StreamingQueryListener):
            """Records when each batch's progress arrived and the process tree's CPU at that time."""

            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                if p.numInputRows > 0 and p.batchId not in samples:
                    samples[p.batchId] = time.monotonic()

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Sampler())
        reports: list[dict[str, Any]] = []

        def on_batch(report: Any) -> None:
            from dataclasses import asdict

            reports.append(asdict(report))

        events = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(spec["input"])
        query_started = time.monotonic()
        result["query_started_at"] = query_started
        query = start_query(spark, spec, events, on_batch)
        query.processAllAvailable()
        batches_expected = spec["expected_batches"]
        deadline = time.monotonic() + 30  # the listener bus delivers the last progress asynchronously
        while len(samples) < batches_expected and time.monotonic() < deadline:
            time.sleep(0.1)
        progress = [progress_dict(p) for p in query.recentProgress]
        query.stop()
        progress = [p for p in progress if p.get("numInputRows", 0) > 0]
        by_batch = {p["batchId"]: p for p in progress}
        batches = []
        for batch_id in sorted(by_batch):
            p = by_batch[batch_id]
            ops = p.get("stateOperators") or [{}]
            entry: dict[str, Any] = {
                "batch_id": batch_id,
                "input_rows": p["numInputRows"],
                "trigger_seconds": p["durationMs"]["triggerExecution"] / 1000,
                "duration_ms": p["durationMs"],
                "state_rows_total": ops[0].get("numRowsTotal"),
                "state_rows_updated": ops[0].get("numRowsUpdated"),
                "state_commit_ms": ops[0].get("commitTimeMs"),
                "sink_output_rows": (p.get("sink") or {}).get("numOutputRows"),
            }
            if batch_id in samples:
                entry["done_at"] = samples[batch_id]
                entry["done_at_seconds"] = round(samples[batch_id] - query_started, 3)
            batches.append(entry)
        for report in reports:
            for entry in batches:
                if entry["batch_id"] == report["batch_id"]:
                    entry["blobstate"] = report
        result["batches"] = batches
        result["blobstate_reports"] = reports
        result["state_operator_last"] = (
            (progress[-1].get("stateOperators") or [None])[0] if progress else None
        )
        first = min(samples) if samples else None
        result["query_start_to_first_batch_seconds"] = (
            round(samples[first] - query_started, 3) if first is not None else None
        )
        spark.stop()
        result["status"] = "ok"
    except BaseException as error:  # the parent records the failure in its JSON
        result["status"] = "failed"
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()[-4000:]
    result_path.write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0 if result["status"] == "ok" else 1)  # do not wait for non-daemon py4j threads


# ---------------------------------------------------------------------------------------- parent side
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants (the JVM, Python workers) are re-parented here, so their CPU is counted."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        status: int = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return status == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(grace: float = 30.0) -> None:
    """Wait for re-parented descendants to exit (SIGKILL after ``grace`` seconds) and reap them."""
    deadline = time.monotonic() + grace
    killed = False
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            if not descendants():
                return
            pid = 0  # descendants that are not our children yet (still being re-parented)
        if pid:
            continue
        if time.monotonic() > deadline:
            if killed:
                return
            kill_descendants()
            killed = True
            deadline = time.monotonic() + 10
        time.sleep(0.1)


def run_worker(spec: dict[str, Any], directory: Path, timeout: float) -> dict[str, Any]:
    """Run one worker subprocess under a timeout; its result, process-tree CPU and the machine's load."""
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    (directory / RESULT_FILE).unlink(missing_ok=True)
    rusage_before, _ = children_cpu_seconds()
    busy_before = machine_busy_seconds()
    load_before = os.getloadavg()
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    timed_out = False
    with (
        open(directory / "stdout.log", "w") as out,
        open(directory / "stderr.log", "w") as err,
        TreeCpuSampler() as sampler,
    ):
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(spec_path)],
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_descendants()
            proc.wait()
        wall = time.monotonic() - started
        reap_orphans()
    rusage_after, max_rss_kb = children_cpu_seconds()
    busy = machine_busy_seconds() - busy_before
    process_cpu = sampler.total()
    result: dict[str, Any] = {}
    if (directory / RESULT_FILE).exists():
        result = json.loads((directory / RESULT_FILE).read_text())
    if timed_out:
        result["status"] = "failed"
        result["error"] = f"timed out after {timeout:.0f} s"
    elif not result:
        result = {"status": "failed", "error": f"worker exited with code {proc.returncode} and no result"}
    if result.get("status") != "ok":
        result["stderr_tail"] = (directory / "stderr.log").read_text(errors="replace")[-3000:]
    if "query_started_at" in result:
        cpu_at_query_start = sampler.at(result["query_started_at"])
        for entry in result.get("batches") or []:
            if "done_at" in entry:
                entry["tree_cpu_seconds"] = round(sampler.at(entry["done_at"]) - cpu_at_query_start, 2)
                entry["cpu_seconds_by_kind"] = {
                    kind: round(seconds, 2) for kind, seconds in sampler.kinds_at(entry["done_at"]).items()
                }
    result["process"] = {
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(process_cpu, 2),
        "cpu_seconds_rusage_children": round(rusage_after - rusage_before, 2),
        "max_rss_mb_one_process": round(max_rss_kb / 1024),
        "machine_busy_cpu_seconds": round(busy, 2),
        "others_cpu_seconds": round(max(busy - process_cpu, 0.0), 2),
        "machine_cores": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "logs": str(directory),
    }
    return result


def summarize_run(run: dict[str, Any], impl: str, data: dict[str, Any], warmup: int = 1) -> dict[str, Any]:
    """Steady-state figures of a run (every batch after the first ``warmup``) and a check of the output
    row counts."""
    all_batches = run.get("batches") or []
    steady = all_batches[warmup:]
    if not steady:
        return {"error": f"no batch completed after the {warmup} warm-up batch(es)"}
    # the reference point: the end of the last warm-up batch
    batches = all_batches[warmup - 1 :]

    def latency(entry: dict[str, Any]) -> float:
        seconds: float = (
            entry["blobstate"]["seconds"]
            if is_blobstate(impl) and "blobstate" in entry
            else entry["trigger_seconds"]
        )
        return seconds

    events = sum(b["input_rows"] for b in steady)
    latencies = [latency(b) for b in steady]
    triggers = [b["trigger_seconds"] for b in steady]
    summary: dict[str, Any] = {
        "steady_batches": len(steady),
        "steady_events": events,
        "median_batch_seconds": round(statistics.median(latencies), 3),
        "events_per_s": round(events / sum(latencies)),
        "median_trigger_seconds": round(statistics.median(triggers), 3),
        "events_per_s_trigger": round(events / sum(triggers)),
        "warmup_batch_seconds": round(latency(all_batches[0]), 3),
        "output_rows_match_distinct_keys": output_rows_ok(all_batches, data),
    }
    if "tree_cpu_seconds" in batches[0] and "tree_cpu_seconds" in steady[-1]:
        cpu = steady[-1]["tree_cpu_seconds"] - batches[0]["tree_cpu_seconds"]
        wall = steady[-1]["done_at_seconds"] - batches[0]["done_at_seconds"]
        summary["steady_cpu_seconds"] = round(cpu, 2)
        summary["steady_wall_seconds"] = round(wall, 2)
        summary["events_per_cpu_s"] = round(events / cpu) if cpu > 0 else None
        summary["cpu_per_wall"] = round(cpu / wall, 2) if wall > 0 else None
        summary["events_per_s_wall"] = round(events / wall) if wall > 0 else None
    if "cpu_seconds_by_kind" in batches[0] and "cpu_seconds_by_kind" in steady[-1]:
        first, last = batches[0]["cpu_seconds_by_kind"], steady[-1]["cpu_seconds_by_kind"]
        summary["cpu_seconds_per_batch_by_kind"] = {
            kind: round((last[kind] - first[kind]) / len(steady), 3) for kind in CPU_KINDS
        }
    if is_blobstate(impl):
        reports = [b["blobstate"] for b in steady if "blobstate" in b]
        for name in BLOBSTATE_PHASES:
            values = [r[name] for r in reports]
            if values:
                summary[f"median_{name}"] = round(statistics.median(values), 3)
    return summary


BLOBSTATE_PHASES = ("stage_seconds", "max_task_seconds", "max_load_seconds", "sink_seconds", "commit_seconds")


def output_rows_ok(batches: list[dict[str, Any]], data: dict[str, Any]) -> bool | None:
    """One output row per distinct key of each batch's file (None when the sink reports no count)."""
    distinct = data["distinct_keys_per_file"]
    checked = False
    for entry in batches:
        rows = entry["blobstate"]["output_rows"] if "blobstate" in entry else entry.get("sink_output_rows")
        if rows is None or rows < 0:
            continue
        checked = True
        if rows != distinct[entry["batch_id"]]:
            return False
    return True if checked else None


def summarize_restart(restart: dict[str, Any], impl: str, run_summary: dict[str, Any]) -> dict[str, Any]:
    """The first batch after a restart, against a steady batch and the first run's warm-up batch."""
    batches = restart.get("batches") or []
    if not batches:
        return {"error": "no batch completed after the restart"}
    first = batches[0]
    summary: dict[str, Any] = {
        "session_seconds": restart.get("session_seconds"),
        "query_start_to_first_batch_seconds": restart.get("query_start_to_first_batch_seconds"),
        "first_batch_trigger_seconds": first["trigger_seconds"],
    }
    own = first["trigger_seconds"]
    if is_blobstate(impl) and "blobstate" in first:
        report = first["blobstate"]
        own = report["seconds"]
        summary.update(
            first_batch_seconds=report["seconds"],
            max_load_seconds=report["max_load_seconds"],
            restore_bytes=report["restore_bytes"],
        )
    if run_summary.get("median_batch_seconds"):
        summary["first_batch_minus_steady_median_seconds"] = round(
            own - run_summary["median_batch_seconds"], 3
        )
    if run_summary.get("warmup_batch_seconds"):
        # both are a fresh JVM's first batch; the difference is roughly what restoring state cost
        summary["first_batch_minus_warmup_batch_seconds"] = round(
            own - run_summary["warmup_batch_seconds"], 3
        )
    return summary


def ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=None, help="default 100000 (1000000 with --large)")
    parser.add_argument("--events", type=int, default=None, help="default 20000 (200000 with --large)")
    parser.add_argument(
        "--batches", type=int, default=None, help="default 4 (6 with --large), warm-up included"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="batches not measured (default 1): the JVM's JIT compiles for several batches",
    )
    parser.add_argument("--partitions", type=int, default=None, help="default 2 (200 with --many-partitions)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLEMENTATIONS)}")
    parser.add_argument(
        "--large", action="store_true", help="1M keys, 200k-event batches, blobstate vs native"
    )
    parser.add_argument(
        "--many-partitions",
        action="store_true",
        help="200 partitions (Spark's default), 20k keys, 2k-event batches: arrow API vs native and floor",
    )
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run (300 + 300 per batch)")
    parser.add_argument("--timeout-restart", type=float, default=None, help="seconds per restart (900)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.large and args.many_partitions:
        parser.error("choose one of --large and --many-partitions")
    many = args.many_partitions
    args.keys = args.keys or (1_000_000 if args.large else 20_000 if many else 100_000)
    args.events = args.events or (200_000 if args.large else 2_000 if many else 20_000)
    args.batches = args.batches or (6 if args.large or many else 4)
    args.partitions = args.partitions or (200 if many else 2)
    preset = LARGE_SET if args.large else MANY_PARTITIONS_SET if many else DEFAULT_SET
    names = args.only.split(",") if args.only else list(preset)
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; choose from {IMPLEMENTATIONS}")
    if args.warmup < 1 or args.batches <= args.warmup:
        parser.error("--warmup must be at least 1 and --batches more than --warmup")
    args.implementations = names
    args.timeout = args.timeout or 300 + 300 * args.batches
    args.restart_timeout = args.timeout_restart or 900
    return args


def log(text: str) -> None:
    """Progress on stderr (stdout carries only the JSON report)."""
    print(f"[spark_vs_native {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run_implementation(
    impl: str,
    args: argparse.Namespace,
    source: Path,
    workdir: Path,
    data: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One implementation's run and, unless disabled, its restart with one more input file; ``extra``
    adds to the worker's spec (``initial_state``: a parquet path of initial-state rows)."""
    base = workdir / impl
    if base.exists():
        shutil.rmtree(base)
    input_dir = base / "input"
    link_inputs(source, input_dir, range(args.batches))
    spec = {
        "impl": impl,
        "phase": "run",
        "input": str(input_dir),
        "checkpoint": str(base / "checkpoint"),
        "partitions": args.partitions,
        "driver_memory": args.driver_memory,
        "spark_local_dir": str(base / "local-run" / "spark"),
        "blobstate_local_dir": str(base / "local-run" / "blobstate"),
        "expected_batches": args.batches,
        **(extra or {}),
    }
    log(f"{impl}: run ({args.batches} batches, timeout {args.timeout:.0f} s)")
    run = run_worker(spec, base / "run", args.timeout)
    entry: dict[str, Any] = {"status": run.get("status"), "run": run}
    if run.get("status") == "ok":
        entry["summary"] = summarize_run(run, impl, data, args.warmup)
        entry["checkpoint_bytes"] = du_bytes(base / "checkpoint")
    log(f"{impl}: {entry['status']} {entry.get('summary') or run.get('error')}")
    if args.no_restart or run.get("status") != "ok":
        return entry
    link_inputs(source, input_dir, range(args.batches + 1))
    restart_spec = dict(
        spec,
        phase="restart",
        spark_local_dir=str(base / "local-restart" / "spark"),
        blobstate_local_dir=str(base / "local-restart" / "blobstate"),
        expected_batches=1,
    )
    log(f"{impl}: restart")
    restart = run_worker(restart_spec, base / "restart", args.restart_timeout)
    entry["restart"] = restart
    if restart.get("status") == "ok":
        entry["restart_summary"] = summarize_restart(restart, impl, entry.get("summary") or {})
    else:
        entry["status"] = "restart failed"
    log(f"{impl}: restart {restart.get('status')} {entry.get('restart_summary') or restart.get('error')}")
    return entry


def main(argv: list[str] | None = None) -> int:
    """Generate the input, run every implementation (and its restart), print the JSON report."""
    args = parse_args(argv)
    subreaper = become_subreaper()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark_vs_native-"))
    workdir.mkdir(parents=True, exist_ok=True)
    import pyspark

    report: dict[str, Any] = {
        "benchmark": "spark_vs_native",
        "config": {
            "keys": args.keys,
            "events_per_batch": args.events,
            "batches": args.batches,
            "warmup_batches": args.warmup,
            "partitions": args.partitions,
            "master": "local[2]",
            "implementations": args.implementations,
            "pyspark": pyspark.__version__,
            "timeout_seconds_per_subprocess": [args.timeout, args.restart_timeout],
            "driver_memory": args.driver_memory,
            "cpu_measure": "own user+system time of every process of the subprocess's tree, sampled"
            " from /proc every 0.25 s (RUSAGE_CHILDREN misses PySpark's Python workers: their daemon"
            " ignores SIGCHLD)" + ("" if subreaper else "; not a subreaper: orphans may be missed"),
        },
        "machine": {
            "cores": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "calibration_us_start": calibration_us(),
        },
    }
    source = workdir / "input"
    started = time.monotonic()
    data = write_inputs(source, args.keys, args.events, args.batches + 1, args.seed)
    report["data"] = data
    log(f"wrote {args.batches + 1} files of {args.events} events in {time.monotonic() - started:.1f} s")
    results = {impl: run_implementation(impl, args, source, workdir, data) for impl in args.implementations}
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["machine"]["calibration_us_end"] = calibration_us()
    report["implementations"] = results
    report["ratios_blobstate_over_other"] = ratios(results)
    report["cpu_per_event_over_floor"] = over_floor(results)
    if "floor_grouped" in results:
        report["cpu_per_event_over_floor_grouped"] = over_floor(results, "floor_grouped")
    all_ok = all(e["status"] == "ok" for e in results.values())
    keep = args.keep or args.workdir is not None or not all_ok  # failures keep their logs
    report["workdir"] = str(workdir) if keep else None
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0 if all_ok else 1


def is_blobstate(impl: str) -> bool:
    """Whether ``impl`` is one of blobstate's own implementations."""
    return impl.startswith("blobstate")


def over_floor(results: dict[str, Any], floor_name: str = "floor") -> dict[str, Any]:
    """Each implementation's CPU per event divided by the stateless floor's (1.0: no cost beyond it);
    ``floor_name`` picks the floor (``floor_grouped``: blobstate's task count)."""
    floor = ((results.get(floor_name) or {}).get("summary") or {}).get("events_per_cpu_s")
    return {
        impl: ratio(floor, (entry.get("summary") or {}).get("events_per_cpu_s"))
        for impl, entry in results.items()
        if impl != floor_name
    }


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Per blobstate variant and other implementation: throughput ratios blobstate/other and latency
    ratios other/blobstate (above 1: blobstate better)."""
    out: dict[str, Any] = {}
    for ours_name, ours in results.items():
        if not is_blobstate(ours_name):
            continue
        mine = ours.get("summary") or {}
        my_restart = ours.get("restart_summary") or {}
        for impl, entry in results.items():
            if is_blobstate(impl):
                continue
            other = entry.get("summary") or {}
            other_restart = entry.get("restart_summary") or {}
            out[f"{ours_name}/{impl}"] = {
                "events_per_s": ratio(mine.get("events_per_s"), other.get("events_per_s")),
                "events_per_s_trigger": ratio(
                    mine.get("events_per_s_trigger"), other.get("events_per_s_trigger")
                ),
                "events_per_s_wall": ratio(mine.get("events_per_s_wall"), other.get("events_per_s_wall")),
                "events_per_cpu_s": ratio(mine.get("events_per_cpu_s"), other.get("events_per_cpu_s")),
                "median_batch_latency_other_over_blobstate": ratio(
                    other.get("median_batch_seconds"), mine.get("median_batch_seconds")
                ),
                "restart_to_first_batch_other_over_blobstate": ratio(
                    other_restart.get("query_start_to_first_batch_seconds"),
                    my_restart.get("query_start_to_first_batch_seconds"),
                ),
            }
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]))
    sys.exit(main())
