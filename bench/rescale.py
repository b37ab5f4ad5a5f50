"""A rescale against its alternatives, side by side in one run; prints JSON.

The state: ``--keys`` string keys (each run of ``--keys 1000000,10000000`` is one size), the running
count and sum per key (``ArrowRunningCount``, ``api="arrow"``), built by a blobstate query from an
input that holds every key once (parquet files of at most ``--rows-per-file`` rows, read one file per
micro-batch), on Spark ``local[2]``, on a checkpoint in a local directory (``--store local``) or on an
S3 server (``--store s3``: a moto server this script starts, as ``bench/soak.py`` does). For each pair
``M:N`` of ``--pairs`` it measures, each in its own fresh process (a new JVM and Python workers) and on
a fresh copy of the checkpoint:

* ``rescale``: ``blobstate.rescale.rescale_checkpoint(spark, url, N)`` on the checkpoint built with M
  partitions (one Spark job: restore each old partition, split, shuffle, build and upload each new one);
* ``cold_restore``: what a restart with no rescale costs: the query restarted on the same M-partition
  checkpoint with an empty local directory, running one batch of ``100 * M`` events on existing keys (so
  every partition has rows and restores its store); the new layout's cold restore (the first batch after
  the rescale pays it) is given too, as ``cold_restore_after``;
* ``replay``: a fresh query with N partitions fed the build's input from scratch. This is a lower bound
  of a real replay: the build's input holds each key once, where a real history has many events per key.
  The build of the N-partition checkpoint is this run, so the builds are the replays.

Figures of each run: ``op_seconds`` (the operation itself: the rescale call; a query's start to its
first batch for a cold restore, to its last for a replay), ``process_seconds`` (the whole process, the
session's start-up included), ``cpu_seconds`` and ``op_cpu_seconds`` (own user+system time of every
process of the tree: driver, JVM, Python workers, sampled from /proc every 0.25 s, as in
``bench/spark_vs_native.py``), ``blob_read_bytes`` and ``blob_written_bytes`` (every ``BlobStore.get``,
``get_file``, ``put`` and ``put_if_absent`` of the process tree's Python processes, counted by a
``sitecustomize`` on their ``PYTHONPATH``; Spark's own offsets and commits go through Hadoop and are not
counted: under ``_spark/`` for a local store, in a local directory beside for S3, as ``s3a`` is not
installed), ``store_added_bytes`` and ``store_removed_bytes`` (the checkpoint's
listing after against before, everything included), and ``python_worker_peak_rss_mb`` (the highest
``VmHWM`` of the Python worker processes, read from /proc with the CPU; PySpark reuses a worker for
several tasks, so this is the peak of the largest task a worker ran; the daemon they fork from is given
apart). ``state_keys`` is RocksDB's estimate (updates not yet compacted count twice); the rescale's
``rescale_records`` is exact. ``ratios`` gives per size, store and pair rescale over cold restore and
rescale over replay; ``rescale_worker_peak_rss_mb`` the rescale's per-task memory for each size side by
side.

    PYTHONPATH=src .venv/bin/python bench/rescale.py [--keys 1000000,10000000] [--pairs 2:4,4:2]
        [--store local,s3] [--rows-per-file 1000000] [--driver-memory 4g] [--workdir DIR (kept)]

Smoke test: ``--keys 20000 --pairs 2:3 --store local`` (a few minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_vs_native as svn

RESULT_FILE = "result.json"
IO_DIR_ENV = "BLOBSTATE_BENCH_IO_DIR"
MB = 1 << 20

SITECUSTOMIZE = '''"""Counts the blob store bytes of this Python process (written by bench/rescale.py)."""
import os

if os.environ.get("BLOBSTATE_BENCH_IO_DIR"):
    try:
        from blobstate.blobstore.base import BlobStore as _Store
    except ImportError:
        _Store = None

    def _count(op, size):
        line = f"{op} {int(size)}\\n".encode()
        path = os.path.join(os.environ["BLOBSTATE_BENCH_IO_DIR"], f"{os.getpid()}.log")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _wrap(name, measure):
        original = getattr(_Store, name)

        def counted(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            _count(name, measure(args, result))
            return result

        setattr(_Store, name, counted)

    def _put_size(args, result):
        data = args[1]
        if isinstance(data, (bytes, bytearray, memoryview)):
            return len(data)
        return os.path.getsize(data)

    if _Store is not None:
        _wrap("get", lambda args, result: len(result))
        _wrap("get_file", lambda args, result: result)
        _wrap("put", _put_size)
        _wrap("put_if_absent", lambda args, result: len(args[1]))
'''
READS = ("get", "get_file")
WRITES = ("put", "put_if_absent")


def log(text: str) -> None:
    """Progress on stderr (stdout carries only the JSON report)."""
    print(f"[rescale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- input data
def key_names(start: int, stop: int) -> Any:
    """The keys ``start`` to ``stop - 1`` as an Arrow string array."""
    import pyarrow as pa

    return pa.array([f"k{i:08d}" for i in range(start, stop)], pa.string())


def write_inputs(directory: Path, keys: int, rows_per_file: int, seed: int) -> list[str]:
    """Every key once, with a random value, in files of at most ``rows_per_file`` rows (mtimes one
    second apart, in order); the file names."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    starts = range(0, keys, rows_per_file)
    base = time.time() - 10 * len(starts) - 3600
    for i, start in enumerate(starts):
        stop = min(start + rows_per_file, keys)
        table = pa.table(
            {"key": key_names(start, stop), "value": rng.integers(0, 1000, stop - start, dtype=np.int64)}
        )
        name = f"part-{i:05d}.parquet"
        pq.write_table(table, directory / name)
        os.utime(directory / name, (base + i, base + i))
        names.append(name)
    return names


def write_restart_file(directory: Path, events: int) -> None:
    """One more input file, newer than every other: ``events`` events on the first keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = directory / "part-99999-restart.parquet"
    if path.exists():
        return
    table = pa.table({"key": key_names(0, events), "value": np.ones(events, np.int64)})
    pq.write_table(table, path)
    now = time.time()
    os.utime(path, (now, now))


def link_files(source: Path, target: Path, names: list[str]) -> None:
    """Hard links (same mtimes) of ``names`` of ``source`` in ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        if not (target / name).exists():
            os.link(source / name, target / name)


# ---------------------------------------------------------------------------------------- stores
class Stores:
    """Where checkpoints live for one ``--store``: a local directory or a bucket on a moto server."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.workdir = workdir
        self.server: subprocess.Popen[bytes] | None = None
        self.base = str(workdir / "checkpoints")
        if kind == "s3":
            from soak import start_s3

            url, self.server = start_s3()
            self.base = url.rsplit("/", 1)[0]

    def url(self, name: str) -> str:
        """The checkpoint URL of ``name``."""
        return f"{self.base}/{name}"

    def spark_checkpoint(self, url: str) -> str | None:
        """Where Spark's own checkpoint of the query at ``url`` goes: beside blobstate's objects (None)
        for a local directory; for S3 a local directory (Spark reaches S3 through Hadoop's ``s3a``,
        whose jars are not installed here)."""
        if self.kind == "local":
            return None
        return str(self.workdir / "spark-checkpoints" / url.rsplit("/", 1)[1])

    def sizes(self, url: str) -> dict[str, int]:
        """Every object of the checkpoint and its size."""
        from blobstate.blobstore import open_blob_store

        if self.kind == "local" and not Path(url).exists():
            return {}
        with open_blob_store(url) as store:
            return store.list_sizes("")

    def copy(self, source: str, target: str) -> None:
        """A copy of the checkpoint ``source`` at ``target`` (objects, pending marks and Spark's files)."""
        if self.kind == "local":
            shutil.copytree(source, target)
            return
        spark_source, spark_target = self.spark_checkpoint(source), self.spark_checkpoint(target)
        assert spark_source is not None and spark_target is not None
        if Path(spark_source).exists():
            shutil.copytree(spark_source, spark_target)
        import boto3

        client = boto3.client("s3", endpoint_url=os.environ["BLOBSTATE_S3_ENDPOINT"], region_name="us-east-1")
        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        target_prefix = target.removeprefix("s3://").partition("/")[2]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for item in page.get("Contents", []):
                key = item["Key"]
                client.copy_object(
                    Bucket=bucket,
                    Key=target_prefix + key[len(prefix) :],
                    CopySource={"Bucket": bucket, "Key": key},
                )

    def remove(self, url: str) -> None:
        """Delete a checkpoint (to keep the disk and the server small between runs)."""
        if self.kind == "local":
            shutil.rmtree(url, ignore_errors=True)
            return
        from blobstate.blobstore import open_blob_store

        shutil.rmtree(str(self.spark_checkpoint(url)), ignore_errors=True)
        with open_blob_store(url) as store:
            for name in store.list(""):
                store.delete_if_exists(name)

    def close(self) -> None:
        """Stop the server, if any."""
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=30)


# ---------------------------------------------------------------------------------------- worker side
def build_spark(spec: dict[str, Any]) -> Any:
    """A local[2] session, UI off, ``spark.sql.shuffle.partitions`` = the run's partitions."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName(f"bench-rescale-{spec['phase']}")
        .config("spark.driver.memory", spec["driver_memory"])
        .config("spark.local.dir", spec["spark_local_dir"])
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_query(spark: Any, spec: dict[str, Any], result: dict[str, Any]) -> None:
    """The running count on ``spec['checkpoint']`` until every input file is processed."""
    import blobstate
    from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, ArrowRunningCount

    reports: list[dict[str, Any]] = []

    def on_batch(report: Any) -> None:
        reports.append(
            {
                "batch_id": report.batch_id,
                "version": report.version,
                "skipped": report.skipped,
                "input_rows": report.input_rows,
                "state_keys": report.state_keys,
                "seconds": round(report.seconds, 3),
                "max_load_seconds": round(report.max_load_seconds, 3),
                "restore_bytes": report.restore_bytes,
                "bytes_uploaded": report.bytes_uploaded,
                "done_at": time.monotonic(),
            }
        )

    events = spark.readStream.schema("key STRING, value BIGINT").option("maxFilesPerTrigger", 1)
    result["op_started_at"] = time.monotonic()
    query = blobstate.transform_with_state(
        events.parquet(spec["input"]),
        key="key",
        processor=ArrowRunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        checkpoint=spec["checkpoint"],
        sink=blobstate.WriterSink("noop", mode="overwrite"),
        num_partitions=spec["partitions"],
        api="arrow",
        local_dir=spec["blobstate_local_dir"],
        on_batch=on_batch,
        **({"spark_checkpoint": spec["spark_checkpoint"]} if spec.get("spark_checkpoint") else {}),
    )
    query.processAllAvailable()
    query.stop()
    ran = [r for r in reports if not r["skipped"]]
    if len(ran) != spec["expected_batches"]:
        raise RuntimeError(f"{len(ran)} batches ran, {spec['expected_batches']} expected: {reports}")
    result["op_ended_at"] = ran[0]["done_at"] if spec["phase"] == "cold_restore" else ran[-1]["done_at"]
    result["batches"] = reports
    result["state_keys"] = ran[-1]["state_keys"]


def run_rescale(spark: Any, spec: dict[str, Any], result: dict[str, Any]) -> None:
    """``rescale_checkpoint`` of ``spec['checkpoint']`` to ``spec['partitions']``."""
    from blobstate.rescale import rescale_checkpoint

    result["op_started_at"] = time.monotonic()
    done = rescale_checkpoint(spark, spec["checkpoint"], spec["partitions"])
    result["op_ended_at"] = time.monotonic()
    result["rescale"] = done.to_json()


def worker(spec_path: Path) -> None:
    """One measured run in this fresh process; writes result.json beside the spec."""
    spec = json.loads(spec_path.read_text())
    result: dict[str, Any] = {"phase": spec["phase"]}
    try:
        started = time.monotonic()
        spark = build_spark(spec)
        result["session_seconds"] = round(time.monotonic() - started, 3)
        if spec["phase"] == "rescale":
            run_rescale(spark, spec, result)
        else:
            run_query(spark, spec, result)
        spark.stop()
        result["status"] = "ok"
    except BaseException as error:  # the parent records the failure in its JSON
        result["status"] = "failed"
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()[-4000:]
    spec_path.with_name(RESULT_FILE).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0 if result["status"] == "ok" else 1)  # do not wait for py4j's non-daemon threads


# ---------------------------------------------------------------------------------------- parent side
class TreeSampler(svn.TreeCpuSampler):
    """CPU of the process tree (see ``spark_vs_native``) but for the ``exclude`` pids (the S3 server,
    a long-lived child of this process), and the peak resident memory (``VmHWM``) of each Python
    process in it, with its role: ``driver`` (the worker subprocess), ``daemon`` (PySpark's daemon, whose
    parent is the JVM) or ``worker`` (a Python worker the daemon forked)."""

    def __init__(self, exclude: set[int], interval: float = 0.25) -> None:
        super().__init__(interval)
        self.exclude = exclude
        self.peak_kb: dict[tuple[int, int], int] = {}
        self.roles: dict[tuple[int, int], str] = {}

    def sample(self) -> None:
        found = {k: v for k, v in svn.descendants().items() if k[0] not in self.exclude}
        self.kinds.update(svn.descendant_kinds(found))
        self.seen.update(found)
        self.series.append((time.monotonic(), sum(self.seen.values())))
        for key in found:
            pid = key[0]
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if not f.read().startswith("python"):
                        continue
                with open(f"/proc/{pid}/status") as f:
                    status = f.read()
                with open(f"/proc/{pid}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb[key] = max(self.peak_kb.get(key, 0), int(line.split()[1]))
            if key not in self.roles:
                self.roles[key] = "driver" if self.kinds.get(key) == "driver_python" else self._role(parent)

    @staticmethod
    def _role(parent: int) -> str:
        try:
            with open(f"/proc/{parent}/comm") as f:
                return "daemon" if f.read().strip() == "java" else "worker"
        except OSError:
            return "worker"

    def memory(self) -> dict[str, Any]:
        """Peak RSS in MB by role: the highest and each worker's."""
        by_role: dict[str, list[int]] = {}
        for key, kb in self.peak_kb.items():
            by_role.setdefault(self.roles.get(key, "worker"), []).append(kb)
        workers = sorted(by_role.get("worker", []), reverse=True)
        return {
            "python_worker_peak_rss_mb": round(workers[0] / 1024, 1) if workers else None,
            "python_workers_peak_rss_mb": [round(kb / 1024, 1) for kb in workers],
            "pyspark_daemon_peak_rss_mb": round(max(by_role["daemon"]) / 1024, 1)
            if by_role.get("daemon")
            else None,
            "driver_peak_rss_mb": round(max(by_role["driver"]) / 1024, 1) if by_role.get("driver") else None,
        }


def own_cpu_seconds(pid: int) -> float:
    """User + system seconds of one process so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / svn.CLOCK_TICKS


def kill_tree(exclude: set[int]) -> None:
    """SIGKILL every live descendant of this process but ``exclude``."""
    for pid, _started in svn.descendants():
        if pid not in exclude:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def reap(exclude: set[int], grace: float = 30.0) -> None:
    """Wait for the run's re-parented descendants to exit (SIGKILL after ``grace`` seconds), reaping
    them; ``exclude`` (the S3 server) lives on."""
    deadline = time.monotonic() + grace
    killed = False
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not [pid for pid, _ in svn.descendants() if pid not in exclude]:
            return
        if time.monotonic() > deadline:
            if killed:
                return
            kill_tree(exclude)
            killed = True
            deadline = time.monotonic() + 10
        time.sleep(0.1)


def blob_io(directory: Path) -> dict[str, int]:
    """The byte counts the ``sitecustomize`` of every Python process of the run wrote."""
    totals = {"blob_read_bytes": 0, "blob_written_bytes": 0, "blob_reads": 0, "blob_writes": 0}
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            op, _, size = line.partition(" ")
            kind = "read" if op in READS else "written" if op in WRITES else None
            if kind is None:
                continue
            totals[f"blob_{kind}_bytes"] += int(size)
            totals["blob_reads" if kind == "read" else "blob_writes"] += 1
    return totals


def listing_change(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Bytes and objects the checkpoint gained and lost."""
    added = {n: s for n, s in after.items() if before.get(n) != s}
    removed = {n: s for n, s in before.items() if n not in after}
    return {
        "store_added_bytes": sum(added.values()),
        "store_added_objects": len(added),
        "store_removed_bytes": sum(removed.values()),
        "store_removed_objects": len(removed),
    }


def run_measured(
    spec: dict[str, Any], directory: Path, stores: Stores, timeout: float, site_dir: Path
) -> dict[str, Any]:
    """Run one worker subprocess under a timeout: its result and every figure of the module docstring."""
    if directory.exists():
        shutil.rmtree(directory)
    io_dir = directory / "blob-io"
    io_dir.mkdir(parents=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    before = stores.sizes(spec["checkpoint"])
    busy_before = svn.machine_busy_seconds()
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(site_dir), os.environ.get("PYTHONPATH", "")) if p),
        **{IO_DIR_ENV: str(io_dir)},
    )
    exclude = {stores.server.pid} if stores.server is not None else set()
    server_cpu = sum(own_cpu_seconds(pid) for pid in exclude)
    timed_out = False
    started = time.monotonic()
    with (
        open(directory / "stdout.log", "w") as out,
        open(directory / "stderr.log", "w") as err,
        TreeSampler(exclude) as sampler,
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
            kill_tree(exclude)
            proc.wait()
        wall = time.monotonic() - started
        reap(exclude)
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
    figures: dict[str, Any] = {
        "process_seconds": round(wall, 2),
        "cpu_seconds": round(sampler.total(), 2),
        "session_seconds": result.get("session_seconds"),
    }
    if "op_started_at" in result and "op_ended_at" in result:
        figures["op_seconds"] = round(result["op_ended_at"] - result["op_started_at"], 2)
        figures["op_cpu_seconds"] = round(
            sampler.at(result["op_ended_at"]) - sampler.at(result["op_started_at"]), 2
        )
    if exclude:
        figures["store_server_cpu_seconds"] = round(sum(own_cpu_seconds(p) for p in exclude) - server_cpu, 2)
    figures.update(blob_io(io_dir))
    figures.update(listing_change(before, stores.sizes(spec["checkpoint"])))
    figures.update(sampler.memory())
    figures["others_cpu_seconds"] = round(
        max(svn.machine_busy_seconds() - busy_before - sampler.total(), 0), 2
    )
    figures["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["figures"] = figures
    for noisy in ("op_started_at", "op_ended_at"):
        result.pop(noisy, None)
    for batch in result.get("batches") or []:
        batch.pop("done_at", None)
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded, None when either is missing or zero."""
    if not a or not b:
        return None
    return round(a / b, 3)


RATIO_FIGURES = ("op_seconds", "process_seconds", "op_cpu_seconds", "cpu_seconds", "blob_read_bytes")
RATIO_FIGURES_WRITTEN = ("blob_written_bytes", "store_added_bytes", "python_worker_peak_rss_mb")


def pair_ratios(rescale: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """Each figure of the rescale over the other run's."""
    mine, theirs = rescale.get("figures") or {}, other.get("figures") or {}
    return {f: ratio(mine.get(f), theirs.get(f)) for f in RATIO_FIGURES + RATIO_FIGURES_WRITTEN}


def one_store_size(
    kind: str, keys: int, pairs: list[tuple[int, int]], args: argparse.Namespace, workdir: Path, site: Path
) -> dict[str, Any]:
    """Builds (the replays), cold restores and rescales of one size on one store."""
    base = workdir / f"keys-{keys}" / kind
    base.mkdir(parents=True, exist_ok=True)
    source = workdir / f"keys-{keys}" / "input"
    if not source.exists():
        started = time.monotonic()
        write_inputs(source, keys, args.rows_per_file, args.seed)
        log(f"{keys} keys: input written in {time.monotonic() - started:.1f} s")
    names = sorted(p.name for p in source.glob("part-*.parquet"))
    input_dir = base / "input"
    link_files(source, input_dir, names)
    stores = Stores(kind, base)
    timeout = args.timeout
    runs: dict[str, Any] = {"replay": {}, "cold_restore": {}, "rescale": {}}
    try:

        def spec(phase: str, checkpoint: str, partitions: int, run: str, **extra: Any) -> dict[str, Any]:
            return {
                "phase": phase,
                "checkpoint": checkpoint,
                "partitions": partitions,
                "driver_memory": args.driver_memory,
                "spark_local_dir": str(base / run / "local" / "spark"),
                "blobstate_local_dir": str(base / run / "local" / "blobstate"),
                "spark_checkpoint": stores.spark_checkpoint(checkpoint),
                **extra,
            }

        def measure(label: str, run: str, phase: str, checkpoint: str, partitions: int, **extra: Any) -> Any:
            log(f"{kind} {keys} keys: {label}")
            entry = run_measured(
                spec(phase, checkpoint, partitions, run, **extra), base / run, stores, timeout, site
            )
            log(f"{kind} {keys} keys: {label}: {entry['status']} {entry.get('error') or entry['figures']}")
            return entry

        counts = sorted({p for pair in pairs for p in pair})
        for p in counts:
            runs["replay"][str(p)] = measure(
                f"build (= replay) on {p} partitions, {len(names)} batch(es)",
                f"build-{p}",
                "replay",
                stores.url(f"build-{p}"),
                p,
                input=str(input_dir),
                expected_batches=len(names),
            )
        for p in counts:
            sizes = stores.sizes(stores.url(f"build-{p}"))
            runs["replay"][str(p)]["checkpoint_bytes"] = sum(
                size for name, size in sizes.items() if not name.startswith("_spark/")
            )
        # Every build has read its input: the restarts' one more file can join it now.
        write_restart_file(input_dir, 100 * max(counts))
        for p in counts:
            if runs["replay"][str(p)]["status"] != "ok":
                continue
            copy = stores.url(f"restore-{p}")
            stores.copy(stores.url(f"build-{p}"), copy)
            runs["cold_restore"][str(p)] = measure(
                f"cold restore of {p} partitions",
                f"restore-{p}",
                "cold_restore",
                copy,
                p,
                input=str(input_dir),
                expected_batches=1,
            )
            stores.remove(copy)
        for m, n in pairs:
            name = f"{m}:{n}"
            if runs["replay"][str(m)]["status"] != "ok":
                runs["rescale"][name] = {"status": "skipped", "error": f"the build on {m} partitions failed"}
                continue
            copy = stores.url(f"rescale-{m}-{n}")
            stores.copy(stores.url(f"build-{m}"), copy)
            runs["rescale"][name] = measure(f"rescale {m} -> {n}", f"rescale-{m}-{n}", "rescale", copy, n)
            stores.remove(copy)
        for p in counts:
            stores.remove(stores.url(f"build-{p}"))
    finally:
        stores.close()
    return runs


def brief(entry: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One run's status, error if any, figures and ``extra``."""
    out: dict[str, Any] = {"status": entry.get("status"), **extra}
    if entry.get("error"):
        out["error"] = entry["error"]
    if "state_keys" in entry:
        out["state_keys"] = entry["state_keys"]
    rescaled = {k: v for k, v in (entry.get("rescale") or {}).items() if k != "url"}
    return {**out, **(entry.get("figures") or {}), **{f"rescale_{k}": v for k, v in rescaled.items()}}


def summarize(runs: dict[str, Any], pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """Per pair: the three runs' figures side by side and the ratios."""
    out: dict[str, Any] = {}
    for m, n in pairs:
        rescale = runs["rescale"].get(f"{m}:{n}", {})
        restore = runs["cold_restore"].get(str(m), {})
        replay = runs["replay"].get(str(n), {})
        out[f"{m}:{n}"] = {
            "rescale": brief(rescale),
            "cold_restore": brief(
                restore, partitions=m, checkpoint_bytes=runs["replay"].get(str(m), {}).get("checkpoint_bytes")
            ),
            "cold_restore_after": brief(runs["cold_restore"].get(str(n), {}), partitions=n),
            "replay": brief(replay, partitions=n, checkpoint_bytes=replay.get("checkpoint_bytes")),
            "ratios": {
                "rescale_over_cold_restore": pair_ratios(rescale, restore),
                "rescale_over_replay": pair_ratios(rescale, replay),
            },
        }
    return out


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """``"2:4,4:2"`` as ``[(2, 4), (4, 2)]``."""
    pairs = []
    for item in text.split(","):
        m, _, n = item.partition(":")
        if not (m.isdigit() and n.isdigit()) or int(m) < 1 or int(n) < 1 or m == n:
            raise argparse.ArgumentTypeError(
                f"a pair is M:N with two different positive counts, not {item!r}"
            )
        pairs.append((int(m), int(n)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    """Measure every size, store and pair; print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000000", help="comma-separated sizes (default 1000000)")
    parser.add_argument("--pairs", type=parse_pairs, default=parse_pairs("2:4,4:2"), help="M:N,... (2:4,4:2)")
    parser.add_argument("--store", default="local", help="comma-separated: local, s3 (default local)")
    parser.add_argument("--rows-per-file", type=int, default=1_000_000, help="rows per input file (batch)")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per measured process")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--workdir", type=Path, default=None, help="kept when given")
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.keys.split(",")]
    kinds = args.store.split(",")
    if any(k not in ("local", "s3") for k in kinds):
        parser.error("--store takes local, s3 or both")
    subreaper = svn.become_subreaper()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-rescale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    site = workdir / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    started = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "rescale",
        "config": {
            "keys": sizes,
            "pairs": [f"{m}:{n}" for m, n in args.pairs],
            "stores": kinds,
            "rows_per_file": args.rows_per_file,
            "driver_memory": args.driver_memory,
            "master": "local[2]",
            "cpu_measure": "own user+system time of every process of the tree (but the S3 server), sampled"
            " from /proc every 0.25 s" + ("" if subreaper else "; not a subreaper: orphans may be missed"),
        },
        "machine": {"cores": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    results: dict[str, Any] = {}
    details: dict[str, Any] = {}
    ok = True
    for keys in sizes:
        for kind in kinds:
            runs = one_store_size(kind, keys, args.pairs, args, workdir, site)
            details.setdefault(str(keys), {})[kind] = runs
            results.setdefault(str(keys), {})[kind] = summarize(runs, args.pairs)
            ok = ok and all(e.get("status") == "ok" for group in runs.values() for e in group.values())
    report["results"] = results
    report["rescale_worker_peak_rss_mb"] = {
        kind: {
            f"{m}:{n}": {
                str(keys): (results[str(keys)][kind][f"{m}:{n}"]["rescale"].get("python_worker_peak_rss_mb"))
                for keys in sizes
            }
            for m, n in args.pairs
        }
        for kind in kinds
    }
    report["runs"] = details
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = round(time.monotonic() - started, 1)
    keep = args.workdir is not None or not ok  # failures keep their logs
    report["workdir"] = str(workdir) if keep else None
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]))
    sys.exit(main())
