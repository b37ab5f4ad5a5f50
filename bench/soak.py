"""Soak: one blobstate query for many micro-batches; whether any cost grows with the batches run.

The query: a rate source (``rate-micro-batch``, ``--rows`` rows per batch, so every batch does the same
work; ``--source rate`` takes Spark's time-based ``rate`` source instead), keys ``k<value % --keys>``,
the vectorized running count and sum (``ArrowRunningCount``, ``api="arrow"``) over ``--partitions``
partitions, a processing-time trigger of ``--trigger``, the ``noop`` sink, Spark ``local[2]``.
Retention, snapshots and RocksDB keep blobstate's defaults. Every ``--sample-every`` batches it
samples:

* the median batch latency of the window (``BatchReport.seconds``) and the median interval between
  batch completions;
* resident memory of the driver's Python process, of the JVM and of the Python workers (their sum);
  the driver's threads and glibc's malloc arenas and heaps in it (a heap appearing is memory its arena
  keeps resident);
* the interned-string tables (CPython 3.11) of the driver and, summed, of the Python workers: their
  entries used since the table was last rebuilt (a rebuild allocates a new block; see
  ``interned_strings``), read from ``/proc/<pid>/mem``;
* the local directory's bytes and files (``local_dir``: working stores, local checkpoints);
* the checkpoint's objects and bytes (blobstate's own, and Spark's offsets under ``_spark/``);
* the machine's 1-minute load average (the machine is shared).

Restarts, after ``--restart-at`` batches and at the end: the query is stopped, then

* ``cold``: a new process (new JVM, new Python workers, an empty local directory) starts the query on
  the same checkpoint; the time from starting the query to the first batch it runs and commits (a
  batch replayed because a stop cut Spark's own commit off is counted apart; its session's start-up is
  given apart), the median of ``--restart-repeat`` such processes one after the other;
* ``warm``: this process starts the query again (same session and local directory): the same time.

The JSON (stdout, and ``--out`` rewritten at every sample so an interrupted run keeps its figures)
gives every sample, each figure's least-squares slope per 1,000 batches over the samples after
``--warmup`` batches with its standard error, the slope relative to the figure's mean, the restart
times and their ratio (end over early), batches per second, and the load average at start and end.
``--png`` draws the curves (matplotlib; ``--replot JSON`` draws them again from a run's JSON;
``--resummarize JSON --warmup N`` computes the slopes again over the samples after N batches).
Progress lines go to stderr. A file ``FINISH`` created in the work directory ends the run at its next
sample, with the end restarts measured as usual.

The restarts of one run are minutes or hours apart, so the machine's load differs between them.
``--compare-restarts EARLY END`` measures cold restarts of two kept checkpoints side by side instead:
``--restart-repeat`` rounds, each restarting a fresh copy of both (their order alternating), and
gives each one's median, the ratio of the medians and the median of the per-round ratios. A kept
checkpoint is ``WORKDIR/checkpoint`` of a run with ``--workdir``; ``--keep-early`` also keeps a copy
of the checkpoint as it was at the early restart (``WORKDIR/checkpoint-early``).

    PYTHONPATH=src .venv/bin/python bench/soak.py [--batches 10000] [--sample-every 200]
        [--rows 2000] [--keys 10000] [--partitions 2] [--trigger "100 milliseconds"]
        [--restart-at 100] [--restart-repeat 3] [--warmup 500] [--store local|s3] [--out FILE] [--png FILE]
        [--workdir DIR (kept)] [--keep-early]
    PYTHONPATH=src .venv/bin/python bench/soak.py --compare-restarts EARLY_CHECKPOINT END_CHECKPOINT
        [--restart-repeat 5] [--partitions 2] [--rows 2000] [--keys 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
FINISH = "FINISH"
"""A file of this name in the work directory ends the run at its next sample (restarts measured)."""
FIGURES = (
    "batch_seconds",
    "interval_seconds",
    "driver_rss_mb",
    "jvm_rss_mb",
    "python_workers_rss_mb",
    "local_dir_mb",
    "local_dir_files",
    "checkpoint_objects",
    "checkpoint_mb",
    "spark_checkpoint_objects",
)
"""The sampled figures whose slope is reported."""


def log(text: str) -> None:
    """A progress line on stderr."""
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- measuring
def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process, from /proc."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as source:  # not pathlib: it interns every pid it sees
                stat = source.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(entry)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), name)
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as source:
            return int(source.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _python_workers() -> tuple[list[int], list[int]]:
    """(JVM pids under this process, Python worker pids under those JVMs)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)

    def below(pid: int) -> list[int]:
        found, todo = [], list(children.get(pid, []))
        while todo:
            p = todo.pop()
            found.append(p)
            todo.extend(children.get(p, []))
        return found

    jvms = [p for p in below(os.getpid()) if procs[p][1] == "java"]
    return jvms, [p for j in jvms for p in below(j) if procs[p][1].startswith("python")]


def memory(processes: tuple[list[int], list[int]] | None = None) -> dict[str, float]:
    """Resident memory (MB) of this process, its JVM and the Python workers under the JVM
    (``processes``: those pids as ``_python_workers`` found them, else found now)."""
    jvms, workers = processes or _python_workers()
    return {
        "driver_rss_mb": _rss_bytes(os.getpid()) / 2**20,
        "jvm_rss_mb": sum(_rss_bytes(p) for p in jvms) / 2**20,
        "python_workers_rss_mb": sum(_rss_bytes(p) for p in workers) / 2**20,
        "python_workers": len(workers),
    }


def malloc_arenas() -> int:
    """How many malloc arenas glibc has made in this process (``malloc_info``'s heaps; -1: not glibc).
    A thread takes a free arena when it first allocates and creates one when every arena is in use
    by a live thread; an arena is never given back."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    except (OSError, AttributeError):
        return -1
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        if not stream:
            return -1
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        with open(out.name) as xml:  # not pathlib: it would intern the temporary file's unique name
            return xml.read().count("<heap nr=")


def glibc_heaps() -> int:
    """How many glibc malloc heaps this process has mapped (each arena but the main one has one or
    more, 64 MiB-aligned reservations): a new one is memory an arena keeps."""
    starts = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) == 5 and fields[4] == "0":  # anonymous, no name
                start = int(fields[0].split("-")[0], 16)
                if start % (64 * 2**20) == 0:
                    starts.add(start)
    return len(starts)


def _interned_table_address(pid: int) -> int | None:
    """Where CPython 3.11 keeps process ``pid``'s interned-string dict (the ``interned`` static of
    unicodeobject.c), from the symbol table of the library or executable that holds it; None when it
    cannot be found."""
    if sys.version_info[:2] != (3, 11) or shutil.which("nm") is None:
        return None
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) == 6 and fields[2] == "00000000":
                found.setdefault(fields[5], int(fields[0].split("-")[0], 16))
    candidates = [f for f in found if "libpython3.11" in f] or [os.path.realpath(f"/proc/{pid}/exe")]
    binary = candidates[0]
    if binary not in found:
        return None
    listing = subprocess.run(["nm", binary], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] == "interned" and fields[1] in "bBdD":
            return found[binary] + int(fields[0], 16)
    return None


_INTERNED: dict[int, int | None] = {}


def interned_strings(pid: int | None = None) -> dict[str, int]:
    """A process's interned-string table (CPython 3.11 only; empty elsewhere or when unreadable): the
    strings in it, its slots, and its entries used since it was last rebuilt (deleted ones included).
    Python rebuilds the table, in a new block from the allocating thread's malloc arena, when the
    entries reach two thirds of the slots: entries climbing while the strings stay flat is churn
    (unique strings interned and freed, as pathlib does with every path part), strings climbing a leak.
    Read from ``/proc/<pid>/mem`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    try:
        if pid not in _INTERNED:
            _INTERNED[pid] = _interned_table_address(pid)
        address = _INTERNED[pid]
        if address is None:
            return {}
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:

            def word(at: int) -> int:
                mem.seek(at)
                return int.from_bytes(mem.read(8), sys.byteorder, signed=True)

            table = word(address)
            if not table:
                return {}
            # PyDictObject: ob_refcnt, ob_type, ma_used, ma_version_tag, ma_keys. PyDictKeysObject:
            # dk_refcnt, dk_log2_size (a byte), ..., dk_usable, dk_nentries.
            used, keys = word(table + 16), word(table + 32)
            mem.seek(keys + 8)
            log2_size = mem.read(1)[0]
            entries = word(keys + 24)
    except (OSError, IndexError, ValueError):
        return {}
    return {"interned_strings": used, "interned_slots": 1 << log2_size, "interned_entries": entries}


def workers_interned_entries(workers: list[int]) -> int | None:
    """The interned-table entries used since the last rebuild, summed over the Python worker pids
    ``workers``: its growth between samples is the workers' churn (None: unreadable)."""
    total, seen = 0, False
    for pid in workers:
        figures = interned_strings(pid)
        if figures:
            total += figures["interned_entries"]
            seen = True
    return total if seen else None


def driver_threads() -> int:
    """The driver process's threads (Python's and native ones), from /proc."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def disk(path: Path) -> tuple[int, int]:
    """Bytes and regular files under ``path`` (files vanishing while walked are skipped)."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_size
                files += 1
    return total, files


_STORES: dict[str, Any] = {}


def checkpoint_objects(url: str) -> dict[str, float]:
    """Objects and MB of the checkpoint: blobstate's own, and Spark's under ``_spark/``. One store per
    checkpoint for the whole run: with a store opened and closed per sample, each sample added an
    entry to the measured process's interned-string table (measured; the cause was not traced)."""
    from blobstate.blobstore import open_blob_store

    store = _STORES.get(url)
    if store is None:
        store = _STORES[url] = open_blob_store(url)
    sizes = store.list_sizes("")
    ours = {n: s for n, s in sizes.items() if not n.startswith("_spark/")}
    spark = {n: s for n, s in sizes.items() if n.startswith("_spark/")}
    return {
        "checkpoint_objects": len(ours),
        "checkpoint_mb": sum(ours.values()) / 2**20,
        "spark_checkpoint_objects": len(spark),
        "spark_checkpoint_mb": sum(spark.values()) / 2**20,
        "commits": sum(1 for n in ours if n.startswith("commits/")),
    }


def slope(xs: list[float], ys: list[float]) -> dict[str, float | None]:
    """Least-squares slope of ``ys`` per 1,000 of ``xs``, its standard error, the mean of ``ys`` and the
    slope relative to the mean (per 1,000)."""
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if len(points) < 3:
        return {"per_1000_batches": None, "stderr": None, "mean": None, "relative_per_1000": None}
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in points)
    se = (residual / (n - 2) / sxx) ** 0.5
    return {
        "per_1000_batches": round(b * 1000, 6),
        "stderr": round(se * 1000, 6),
        "mean": round(my, 4),
        "relative_per_1000": round(b * 1000 / my, 5) if my else None,
    }


# ---------------------------------------------------------------------------------------- the query
def build_spark(spark_local_dir: Path, partitions: int) -> Any:
    """A local[2] session, its UI off, Arrow on, ``spark.sql.shuffle.partitions`` = ``partitions``."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("blobstate-soak")
        .config("spark.local.dir", str(spark_local_dir))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def start_query(spark: Any, spec: dict[str, Any], local_dir: Path, on_batch: Any) -> Any:
    """The soak's query on ``spec['checkpoint']``, its working stores under ``local_dir``."""
    from pyspark.sql import functions as F

    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, ArrowRunningCount

    if spec["source"] == "rate":
        raw = spark.readStream.format("rate").option("rowsPerSecond", spec["rows"]).load()
    else:
        raw = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", spec["rows"]).load()
    events = raw.select(
        F.concat(F.lit("k"), (F.col("value") % spec["keys"]).cast("string")).alias("key"),
        F.col("value").cast("bigint").alias("value"),
    )
    return blobstate.transform_with_state(
        events,
        key="key",
        processor=ArrowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=spec["checkpoint"],
        sink=blobstate.WriterSink("noop", mode="overwrite"),
        num_partitions=spec["partitions"],
        api="arrow",
        local_dir=str(local_dir),
        on_batch=on_batch,
        trigger_interval=spec["trigger"] or None,
    )


class Batches:
    """The committed batches of the running query: how many, and the completion times and latencies
    since the sampling loop last took them (``on_batch`` runs on the driver's batch thread). Only the
    current window is kept: a list that grew with every batch would be growth the soak itself made."""

    def __init__(self) -> None:
        self.count = 0
        self.first_seconds: float | None = None
        self.state_keys = 0
        self.replayed = 0
        self.first = threading.Event()
        self.first_batch_id = -1
        self._lock = threading.Lock()
        self._done_at: list[float] = []
        self._seconds: list[float] = []

    def on_batch(self, report: Any) -> None:
        """``transform_with_state``'s callback. A batch that blobstate had committed before (a restart
        replays the batch whose Spark commit the stop cut off) is counted apart."""
        if report.skipped:
            self.replayed += 1
            return
        with self._lock:
            self._seconds.append(report.seconds)
            self._done_at.append(time.monotonic())
            self.count += 1
        self.state_keys = report.state_keys
        if not self.first.is_set():
            self.first_batch_id = report.batch_id
            self.first_seconds = report.seconds
            self.first.set()

    def take_window(self) -> tuple[list[float], list[float]]:
        """(completion times, latencies) of the batches since the last call, forgetting them."""
        with self._lock:
            window = (self._done_at, self._seconds)
            self._done_at, self._seconds = [], []
            return window

    def __len__(self) -> int:
        return self.count


def time_to_first_batch(start: Any, batches: Batches, timeout: float) -> tuple[Any, float]:
    """Start a query with ``start()`` and wait for the first batch it runs and commits (not a replay of
    one committed before): (query, seconds)."""
    batches.first.clear()
    started = time.monotonic()
    query = start()
    while not batches.first.wait(0.1):
        if not query.isActive or time.monotonic() - started > timeout:
            raise RuntimeError(f"no batch within {timeout:.0f} s of the restart: {query.exception()}")
    return query, time.monotonic() - started


def probe(spec_path: Path) -> int:
    """The cold restart, in this fresh process: a new session and an empty local directory start the
    query on the checkpoint; prints one JSON line with the time to its first committed batch."""
    spec = json.loads(spec_path.read_text())
    base = Path(tempfile.mkdtemp(prefix="soak-probe-", dir=spec["workdir"]))
    result: dict[str, Any] = {}
    try:
        started = time.monotonic()
        spark = build_spark(base / "spark", spec["partitions"])
        result["session_seconds"] = round(time.monotonic() - started, 3)
        batches = Batches()
        query, seconds = time_to_first_batch(
            lambda: start_query(spark, spec, base / "local", batches.on_batch), batches, 600
        )
        result["seconds_to_first_batch"] = round(seconds, 3)
        assert batches.first_seconds is not None  # set before time_to_first_batch returns
        result["first_batch_seconds"] = round(batches.first_seconds, 3)
        result["replayed_batches"] = batches.replayed
        # Stop once Spark has committed the batch too, so the next start does not replay it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            progress = query.lastProgress
            if progress is not None and progress["batchId"] >= batches.first_batch_id:
                break
            time.sleep(0.1)
        query.stop()
        spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result), flush=True)
    os._exit(0)  # do not wait for py4j's non-daemon threads


def cold_restart(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run :func:`probe` in a subprocess; its JSON (or the failure)."""
    spec_path = workdir / "probe.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--probe", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"probe exited {done.returncode}: {done.stderr.strip()[-1500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def compare_restarts(early: Path, end: Path, spec: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Cold restarts of fresh copies of two kept checkpoints, alternating, ``repeat`` rounds."""
    workdir = Path(tempfile.mkdtemp(prefix="blobstate-soak-compare-"))
    runs: dict[str, list[dict[str, Any]]] = {"early": [], "end": []}
    ratios: list[float] = []
    try:
        for round_ in range(repeat):
            order = [("early", early), ("end", end)]
            if round_ % 2:
                order.reverse()
            seconds: dict[str, float] = {}
            for label, source in order:
                copy = workdir / f"{label}-{round_}"
                shutil.copytree(source, copy)
                probe_result = cold_restart(
                    {**spec, "checkpoint": str(copy), "workdir": str(workdir)}, workdir
                )
                shutil.rmtree(copy, ignore_errors=True)
                probe_result["loadavg_1min"] = round(os.getloadavg()[0], 2)
                runs[label].append(probe_result)
                log(f"compare round {round_ + 1}/{repeat} {label}: {json.dumps(probe_result)}")
                if "seconds_to_first_batch" in probe_result:
                    seconds[label] = probe_result["seconds_to_first_batch"]
            if len(seconds) == 2:
                ratios.append(seconds["end"] / seconds["early"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def median(label: str) -> float | None:
        times = [r["seconds_to_first_batch"] for r in runs[label] if "seconds_to_first_batch" in r]
        return round(statistics.median(times), 3) if times else None

    early_median, end_median = median("early"), median("end")
    return {
        "early": {
            "checkpoint": str(early),
            "median_seconds_to_first_batch": early_median,
            "runs": runs["early"],
        },
        "end": {"checkpoint": str(end), "median_seconds_to_first_batch": end_median, "runs": runs["end"]},
        "ratio_of_medians": round(end_median / early_median, 3) if early_median and end_median else None,
        "median_of_paired_ratios": round(statistics.median(ratios), 3) if ratios else None,
        "paired_ratios": [round(r, 3) for r in ratios],
    }


# ---------------------------------------------------------------------------------------- the run
def start_s3() -> tuple[str, subprocess.Popen[bytes]]:
    """A moto S3 server on 127.0.0.1 in its own process and a fresh bucket: (checkpoint URL, server)."""
    import boto3

    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["BLOBSTATE_S3_ENDPOINT"] = endpoint  # before Spark starts: its workers inherit it
    bucket = f"soak-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/ckpt", server


def summarize(result: dict[str, Any], warmup: int) -> None:
    """Add each figure's slope (samples after ``warmup`` batches) and the restart ratios."""
    samples = [s for s in result["samples"] if s["batches"] >= warmup]
    xs = [float(s["batches"]) for s in samples]
    result["slopes"] = {
        "over_batches": [samples[0]["batches"], samples[-1]["batches"]] if samples else None,
        **{f: slope(xs, [s.get(f) for s in samples]) for f in FIGURES},
    }
    restarts = result["restarts"]
    if "early" in restarts and "end" in restarts:
        ratios = {}
        for kind in ("cold", "warm"):
            early = restarts["early"].get(kind, {}).get("seconds_to_first_batch")
            end = restarts["end"].get(kind, {}).get("seconds_to_first_batch")
            ratios[kind] = round(end / early, 3) if early and end else None
        result["restart_ratio_end_over_early"] = ratios


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--sample-every", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2000, help="rows per batch (rows/s with --source rate)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--trigger", default="100 milliseconds", help='"" runs batches back to back')
    parser.add_argument("--source", choices=("rate-micro-batch", "rate"), default="rate-micro-batch")
    parser.add_argument("--restart-at", type=int, default=100)
    parser.add_argument("--restart-repeat", type=int, default=3, help="cold restarts at each point (median)")
    parser.add_argument("--warmup", type=int, default=500, help="batches left out of the slopes")
    parser.add_argument("--store", choices=("local", "s3"), default="local")
    parser.add_argument("--out", type=Path, default=None, help="JSON file, rewritten at every sample")
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="kept after the run")
    parser.add_argument("--replot", type=Path, default=None, help="only draw --png from this JSON")
    parser.add_argument(
        "--resummarize",
        type=Path,
        default=None,
        help="only compute the slopes of this run's JSON again, over the samples after --warmup batches",
    )
    parser.add_argument("--probe", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-early", action="store_true", help="keep a copy of the checkpoint at the early restart"
    )
    parser.add_argument(
        "--compare-restarts",
        nargs=2,
        type=Path,
        metavar=("EARLY", "END"),
        default=None,
        help="only compare cold restarts of two kept checkpoints, side by side",
    )
    args = parser.parse_args(argv)
    if args.probe is not None:
        return probe(args.probe)
    if args.compare_restarts is not None:
        spec = {"source": args.source, "rows": args.rows, "keys": args.keys, "partitions": args.partitions,
                "trigger": args.trigger}  # fmt: skip
        early, end = args.compare_restarts
        comparison = compare_restarts(early, end, spec, args.restart_repeat)
        text = json.dumps(comparison, indent=1)
        if args.out is not None:
            args.out.write_text(text + "\n")
        print(text)
        return 0
    if args.replot is not None:
        plot(json.loads(args.replot.read_text()), args.png or args.replot.with_suffix(".png"))
        return 0
    if args.resummarize is not None:
        earlier = json.loads(args.resummarize.read_text())
        earlier["config"]["warmup"] = args.warmup
        summarize(earlier, args.warmup)
        text = json.dumps(earlier, indent=1)
        if args.out is not None:
            args.out.write_text(text)
        print(text)
        return 0

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="blobstate-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = None
    if args.store == "s3":
        checkpoint, server = start_s3()
    else:
        checkpoint = str(workdir / "checkpoint")
    local_dir = workdir / "local"
    spec = {
        "checkpoint": checkpoint,
        "source": args.source,
        "rows": args.rows,
        "keys": args.keys,
        "partitions": args.partitions,
        "trigger": args.trigger,
        "workdir": str(workdir),
    }
    result: dict[str, Any] = {
        "config": {k: v for k, v in spec.items() if k != "workdir"}
        | {
            "batches": args.batches,
            "sample_every": args.sample_every,
            "store": args.store,
            "restart_at": args.restart_at,
            "restart_repeat": args.restart_repeat,
            "warmup": args.warmup,
            "cores": os.cpu_count(),
        },
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "samples": [],
        "restarts": {},
        "complete": False,
    }

    def save() -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=1) + "\n")

    spark = build_spark(workdir / "spark-local", args.partitions)
    batches = Batches()

    def start() -> Any:
        return start_query(spark, spec, local_dir, batches.on_batch)

    def restart(query: Any, label: str) -> Any:
        query.stop()
        if label == "early" and args.keep_early and args.store == "local":
            shutil.copytree(checkpoint, workdir / "checkpoint-early", dirs_exist_ok=True)
        log(f"restart ({label}, after {len(batches)} batches): cold, {args.restart_repeat} new processes")
        probes = [cold_restart(spec, workdir) for _ in range(args.restart_repeat)]
        times = [p["seconds_to_first_batch"] for p in probes if "seconds_to_first_batch" in p]
        cold = {
            "seconds_to_first_batch": round(statistics.median(times), 3) if times else None,
            "runs": probes,
        }
        query, seconds = time_to_first_batch(start, batches, 600)
        result["restarts"][label] = {"after_batches": len(batches) - 1, "cold": cold,
                                     "warm": {"seconds_to_first_batch": round(seconds, 3)}}  # fmt: skip
        log(f"restart ({label}): {json.dumps(result['restarts'][label])}")
        return query

    started = time.monotonic()
    query = start()
    sampled, sampled_at = 0, started
    restarted_early = args.restart_at <= 0
    try:
        while True:
            time.sleep(0.2)
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            n = len(batches)
            if not restarted_early and n >= args.restart_at:
                query = restart(query, "early")
                restarted_early = True
                continue
            if n - sampled >= args.sample_every or n >= args.batches:
                done, latencies = batches.take_window()
                intervals = [b - a for a, b in itertools.pairwise(done)]
                local_bytes, local_files = disk(local_dir)
                processes = _python_workers()
                sample: dict[str, Any] = {
                    "batches": n,
                    "elapsed_seconds": round(time.monotonic() - started, 1),
                    "batch_seconds": round(statistics.median(latencies), 4) if latencies else None,
                    "interval_seconds": round(statistics.median(intervals), 4) if intervals else None,
                    **{k: round(v, 3) for k, v in memory(processes).items()},
                    "driver_threads": driver_threads(),
                    "driver_malloc_arenas": malloc_arenas(),
                    "driver_glibc_heaps": glibc_heaps(),
                    **interned_strings(),
                    "python_workers_interned_entries": workers_interned_entries(processes[1]),
                    "local_dir_mb": round(local_bytes / 2**20, 3),
                    "local_dir_files": local_files,
                    **{k: round(v, 3) for k, v in checkpoint_objects(checkpoint).items()},
                    "state_keys": batches.state_keys,
                    "loadavg_1min": round(os.getloadavg()[0], 2),
                    "batches_per_second": round((n - sampled) / (time.monotonic() - sampled_at), 3),
                }
                result["samples"].append(sample)
                sampled, sampled_at = n, time.monotonic()
                elapsed = time.monotonic() - started
                result["batches_run"] = n
                result["batches_per_second"] = round(n / elapsed, 3)
                save()
                log(" ".join(f"{k}={v}" for k, v in sample.items()))
                if n >= args.batches or (workdir / FINISH).exists():
                    break
        query = restart(query, "end")
        query.stop()
    finally:
        with contextlib.suppress(Exception):
            query.stop()
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        result["wall_seconds"] = round(time.monotonic() - started, 1)
        summarize(result, args.warmup)
        save()
        if server is not None:
            server.terminate()
            server.wait()
    result["complete"] = True
    save()
    if args.png is not None:
        plot(result, args.png)
    print(json.dumps(result, indent=1))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    spark.stop()
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    """The sampled curves against the batches run: one panel per kind of figure, a second quantity of
    the panel (dashed) on its right axis."""
    from blobstate.report.render import pyplot

    plt = pyplot()
    samples = result["samples"]
    x = [s["batches"] for s in samples]
    panels: tuple[tuple[str, dict[str, str], dict[str, str]], ...] = (
        (
            "Batch latency, median of window (s)",
            {"batch": "batch_seconds", "interval": "interval_seconds"},
            {},
        ),
        (
            "Resident memory (MB)",
            {
                "driver (Python)": "driver_rss_mb",
                "JVM": "jvm_rss_mb",
                "Python workers": "python_workers_rss_mb",
            },
            {},
        ),
        ("Local directory", {"files": "local_dir_files"}, {"MB": "local_dir_mb"}),
        ("Checkpoint, blobstate's objects", {"objects": "checkpoint_objects"}, {"MB": "checkpoint_mb"}),
        (
            "Checkpoint, Spark's _spark/",
            {"objects": "spark_checkpoint_objects"},
            {"MB": "spark_checkpoint_mb"},
        ),
        ("Machine load (1 min)", {"load average": "loadavg_1min"}, {}),
    )
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), constrained_layout=True)
    for ax, (title, left, right) in zip(axes.flat, panels, strict=True):
        handles = []
        for label, key in left.items():
            handles += ax.plot(x, [s.get(key) for s in samples], marker=".", label=label)
        if right:
            twin = ax.twinx()
            for label, key in right.items():
                values = [s.get(key) for s in samples]
                handles += twin.plot(x, values, "--", color="tab:red", label=label)
            twin.set_ylim(0, max([v for v in values if v is not None] + [0.001]) * 1.3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("batches")
        ax.set_ylim(0, max([s.get(k) or 0 for s in samples for k in left.values()] + [0.001]) * 1.3)
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=8, loc="lower right")
    cfg = result["config"]
    fig.suptitle(
        f"blobstate soak: {result.get('batches_run', 0):,} batches of {cfg['rows']:,} rows,"
        f" {cfg['keys']:,} keys, {cfg['partitions']} partitions, {cfg['store']} store"
        f" ({result.get('batches_per_second')} batches/s)",
        fontsize=11,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
