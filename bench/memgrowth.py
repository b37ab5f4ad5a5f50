"""What grows in memory while the soak's query runs: tracemalloc in the driver and in the Python workers.

Runs ``bench/soak.py``'s query (its ``build_spark``, ``start_query`` and ``Batches``) in this process for
``--batches`` batches. The driver traces its Python allocations (``tracemalloc``) from the start; at each
batch count of ``--snap`` it takes a snapshot, and so does every Python worker: a ``sitecustomize``
put on the workers' ``PYTHONPATH`` only (the driver's interpreter has started already) starts
``tracemalloc`` in Spark's worker daemon and, in every worker it forks, a thread that answers the
driver's snapshot requests (files in the work directory). At each snapshot both sides also record:
resident memory, the traced Python heap, Arrow's allocated bytes, RocksDB's block cache usage and the
counts of live objects by type (``gc.get_objects``). The report (stdout, JSON) compares the last
snapshot with the first: per side, the growth of each figure per batch, the largest tracemalloc
differences by line and the object types whose counts grew, and the resident memory sampled every 50
batches (with the driver's traced heap: resident minus traced is native memory and tracemalloc's own).

Tracing slows a process several times; ``--worker-frames 0`` (or ``--no-workers``) keeps the workers'
figures without tracing them, ``--frames 1`` makes the driver's cheap and ``--frames 0`` turns it off
(the resident memory and glibc's heap figures, sampled every 50 batches, remain). Each 50-batch sample
also names the driver's memory mappings whose resident size changed since the one before (smaps). The
driver keeps the last 1,000 batch reports, which hide other growth in a short run: ``--recent-reports 10``
keeps fewer.

    PYTHONPATH=src .venv/bin/python bench/memgrowth.py [--batches 600] [--snap 150,600] [--frames 8]
        [--worker-frames 8 | --no-workers] [--recent-reports N] [--trigger ""] [--rows 2000]
        [--keys 10000] [--partitions 2] [--top 25]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import (
    Batches,
    build_spark,
    driver_threads,
    glibc_heaps,
    interned_strings,
    log,
    malloc_arenas,
    memory,
    start_query,
)

HOOK_ENV = "BLOBSTATE_MEMGROWTH_DIR"
FRAMES_ENV = "BLOBSTATE_MEMGROWTH_FRAMES"

# The workers' sitecustomize: only in a process Spark's worker factory started (it sets the secret).
WORKER_HOOK = """
import os
if os.environ.get("BLOBSTATE_MEMGROWTH_DIR") and os.environ.get("PYTHON_WORKER_FACTORY_SECRET"):
    import tracemalloc
    if int(os.environ.get("BLOBSTATE_MEMGROWTH_FRAMES", "8")):
        tracemalloc.start(int(os.environ.get("BLOBSTATE_MEMGROWTH_FRAMES", "8")))

    def _serve():
        import gc, json, pathlib, pickle, sys, threading, time
        from collections import Counter
        root = pathlib.Path(os.environ["BLOBSTATE_MEMGROWTH_DIR"])
        answered = set()

        def figures():
            out = {"pid": os.getpid()}
            out["rss_bytes"] = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            out["traced_bytes"] = tracemalloc.get_traced_memory()[0]
            if "pyarrow" in sys.modules:
                pa = sys.modules["pyarrow"]
                out["arrow_allocated_bytes"] = pa.total_allocated_bytes()
                out["arrow_pool"] = pa.default_memory_pool().backend_name
            store = sys.modules.get("blobstate.state.store")
            cache = getattr(store, "_block_cache", None) if store else None
            if cache is not None:
                out["block_cache_usage"] = cache.get_usage()
                out["block_cache_pinned"] = cache.get_pinned_usage()
            out["types"] = dict(Counter(type(o).__qualname__ for o in gc.get_objects()).most_common(200))
            tasks = sys.modules.get("blobstate.engine.task")
            out["tasks_seen"] = getattr(tasks, "_MEMGROWTH_TASKS", None)
            return out

        def loop():
            while True:
                time.sleep(0.5)
                for req in sorted(root.glob("request-*")):
                    label = req.name[len("request-"):]
                    if label in answered:
                        continue
                    answered.add(label)
                    if tracemalloc.is_tracing():
                        snap = tracemalloc.take_snapshot()
                        snap.dump(str(root / f"worker-{os.getpid()}-{label}.snap"))
                    (root / f"worker-{os.getpid()}-{label}.json").write_text(json.dumps(figures()))

        threading.Thread(target=loop, name="memgrowth", daemon=True).start()

    os.register_at_fork(after_in_child=_serve)
"""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def malloc_figures(*, trim: bool = True) -> dict[str, int]:
    """glibc's view of the driver's heap (``mallinfo2``: bytes in use and free in its arenas, summed over
    them), then (``trim``) what ``malloc_trim(0)`` gives back to the system: resident memory after the
    trim. Free but unreturned memory (fragmented arenas) shows as ``malloc_free_bytes`` and comes back in
    the trim; a leak stays in ``malloc_in_use_bytes``. Empty when the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        if trim:
            libc.malloc_trim(0)
    except (OSError, AttributeError):
        return {}
    figures = {
        "malloc_arena_bytes": int(info.arena),
        "malloc_in_use_bytes": int(info.uordblks),
        "malloc_free_bytes": int(info.fordblks),
        "malloc_mmapped_bytes": int(info.hblkhd),
    }
    if trim:
        figures["rss_after_trim_bytes"] = int(memory()["driver_rss_mb"] * 2**20)
    return figures


def obmalloc_figures() -> dict[str, int]:
    """CPython's small-object allocator (``sys._debugmallocstats``, which writes to the C stderr): its
    arenas (1 MiB each) now and at most, and the bytes in them. Arenas that stay allocated while the
    objects in them are few are fragmentation tracemalloc does not see."""
    import re
    import sys as _sys

    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            _sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode("ascii", "replace")
    figures: dict[str, int] = {"allocated_blocks": _sys.getallocatedblocks()}
    for label, key in (
        ("arenas allocated current", "obmalloc_arenas"),
        ("arenas highwater mark", "obmalloc_arenas_highwater"),
        ("bytes in allocated blocks", "obmalloc_used_bytes"),
        ("bytes in available blocks", "obmalloc_free_bytes"),
        ("unused pools", "obmalloc_unused_pools"),
    ):
        found = re.search(r"# " + label + r"\s*=\s*([\d,]+)", text)
        if found:
            figures[key] = int(found.group(1).replace(",", ""))
    return figures


def smaps_rss() -> dict[str, int]:
    """The driver's resident kilobytes per memory mapping (``/proc/self/smaps``), keyed by address range,
    size and name, for the mappings with any resident pages."""
    out: dict[str, int] = {}
    key = ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=5)
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                name = head[5].strip() if len(head) > 5 else "[anon]"
                key = f"{head[0]} {(end - start) // 1024}kB {name}"
            elif head[0] == "Rss:" and int(head[1]):
                out[key] = int(head[1])
    return out


def smaps_changes(before: dict[str, int], after: dict[str, int], floor_kb: int = 128) -> dict[str, int]:
    """Mappings whose resident kilobytes changed by at least ``floor_kb`` (new ones and gone ones too)."""
    changed = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return dict(sorted(((k, d) for k, d in changed.items() if abs(d) >= floor_kb), key=lambda x: -abs(x[1])))


def driver_figures() -> dict[str, Any]:
    """The driver's side of one snapshot (without the tracemalloc snapshot itself)."""
    import pyarrow as pa

    out: dict[str, Any] = {
        "rss_bytes": int(memory()["driver_rss_mb"] * 2**20),
        **malloc_figures(),
        "traced_bytes": tracemalloc.get_traced_memory()[0],
        "arrow_allocated_bytes": pa.total_allocated_bytes(),
        "types": dict(Counter(type(o).__qualname__ for o in gc.get_objects()).most_common(300)),
        "gc_objects": len(gc.get_objects()),
    }
    return out


def compare(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, top: int, key: str) -> list[str]:
    """The ``top`` largest growths between two snapshots, grouped by ``key``, as lines."""
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    stats = last.filter_traces(ignore).compare_to(first.filter_traces(ignore), key)
    lines = []
    for stat in stats[:top]:
        where = stat.traceback.format(limit=6 if key == "traceback" else 1)
        lines.append(
            f"{stat.size_diff:+,d} B ({stat.count_diff:+,d} blocks), now {stat.size:,d} B: "
            + " | ".join(w.strip() for w in where)
        )
    return lines


def type_growth(first: dict[str, int], last: dict[str, int], top: int) -> dict[str, int]:
    """Object types whose live count grew most."""
    grown = {t: last.get(t, 0) - first.get(t, 0) for t in set(first) | set(last)}
    return dict(sorted(((t, d) for t, d in grown.items() if d > 0), key=lambda x: -x[1])[:top])


def per_batch(first: dict[str, Any], last: dict[str, Any], batches: int) -> dict[str, float]:
    """Growth of each byte figure per batch between two snapshots."""
    return {
        k: round((last[k] - first[k]) / batches, 1)
        for k in first
        if k.endswith("_bytes") or k.endswith("_usage")
        if isinstance(first[k], int) and isinstance(last.get(k), int)
    }


def main(argv: list[str] | None = None) -> int:
    """Run the query, snapshot, compare; print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--snap", default="150,600", help="batch counts to snapshot at (first, ..., last)")
    parser.add_argument(
        "--frames", type=int, default=8, help="tracemalloc frames kept per allocation (0: no tracing)"
    )
    parser.add_argument(
        "--worker-frames", type=int, default=8, help="the same in the workers (0: no tracemalloc there)"
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--trigger", default="", help='"" runs batches back to back')
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--recent-reports",
        type=int,
        default=None,
        help="batch reports the driver keeps (default blobstate's 1,000): fewer shows other growth early",
    )
    parser.add_argument(
        "--no-workers", action="store_true", help="no tracemalloc in the workers (--worker-frames 0)"
    )
    args = parser.parse_args(argv)
    points = [int(x) for x in args.snap.split(",")]

    if args.frames > 0:
        tracemalloc.start(args.frames)
    workdir = Path(tempfile.mkdtemp(prefix="blobstate-memgrowth-"))
    hooks = workdir / "hook"
    hooks.mkdir()
    if args.no_workers:
        args.worker_frames = 0
    (hooks / "sitecustomize.py").write_text(WORKER_HOOK)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ[HOOK_ENV] = str(workdir)
    os.environ[FRAMES_ENV] = str(args.worker_frames)
    spec = {
        "checkpoint": str(workdir / "checkpoint"),
        "source": "rate-micro-batch",
        "rows": args.rows,
        "keys": args.keys,
        "partitions": args.partitions,
        "trigger": args.trigger,
    }
    spark = build_spark(workdir / "spark-local", args.partitions)
    batches = Batches()
    if args.recent_reports is not None:
        from blobstate.engine import driver as engine_driver

        engine_driver.RECENT_REPORTS = args.recent_reports
    query = start_query(spark, spec, workdir / "local", batches.on_batch)
    driver: dict[int, tuple[tracemalloc.Snapshot | None, dict[str, Any]]] = {}
    rss: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        todo = list(points)
        next_rss = 0
        previous_smaps: dict[str, int] = {}
        while todo:
            time.sleep(0.2)
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            n = len(batches)
            batches.take_window()  # the soak's per-batch figures are not this report's
            if n >= next_rss:
                traced_mb = tracemalloc.get_traced_memory()[0] / 2**20
                rss.append({"batches": n, **{k: round(v, 2) for k, v in memory().items()}})
                rss[-1]["driver_traced_mb"] = round(traced_mb, 3)
                rss[-1].update(
                    {k: round(v / 2**20, 2) for k, v in malloc_figures(trim=False).items()}
                )  # in MB, like the rest of the line
                rss[-1].update(obmalloc_figures())
                rss[-1]["threads"] = driver_threads()
                rss[-1]["malloc_arenas"] = malloc_arenas()
                rss[-1]["glibc_heaps"] = glibc_heaps()
                rss[-1].update(interned_strings())
                mapped = smaps_rss()
                if previous_smaps:
                    rss[-1]["smaps_changes_kb"] = smaps_changes(previous_smaps, mapped)
                previous_smaps = mapped
                log(json.dumps(rss[-1]))
                next_rss = n + 50
            if n >= todo[0]:
                label = str(todo.pop(0))
                gc.collect()
                snapshot = tracemalloc.take_snapshot() if args.frames > 0 else None
                driver[int(label)] = (snapshot, {"batches": n, **driver_figures()})
                (workdir / f"request-{label}").touch()
                log(f"snapshot {label} at {n} batches")
    finally:
        time.sleep(3)  # the workers answer the last request
        query.stop()
    first_n, last_n = points[0], points[-1]
    (s0, f0), (s1, f1) = driver[first_n], driver[last_n]
    span = f1["batches"] - f0["batches"]
    report: dict[str, Any] = {
        "config": vars(args),
        "seconds": round(time.monotonic() - started, 1),
        "batches_between": span,
        "rss": rss,
        "driver": {
            "per_batch": per_batch(f0, f1, span),
            "gc_objects_per_batch": round((f1["gc_objects"] - f0["gc_objects"]) / span, 2),
            "types_grown": type_growth(f0["types"], f1["types"], args.top),
            "by_line": compare(s0, s1, args.top, "lineno") if s0 and s1 else [],
            "by_traceback": compare(s0, s1, 8, "traceback") if s0 and s1 and args.frames > 1 else [],
        },
        "workers": {},
    }
    for first in sorted(workdir.glob(f"worker-*-{first_n}.json")):
        pid = first.name.split("-")[1]
        last = workdir / f"worker-{pid}-{last_n}.json"
        if not last.exists():
            continue
        w0, w1 = json.loads(first.read_text()), json.loads(last.read_text())
        report["workers"][pid] = {
            "first": {k: v for k, v in w0.items() if k != "types"},
            "last": {k: v for k, v in w1.items() if k != "types"},
            "per_batch": per_batch(w0, w1, span),
            "types_grown": type_growth(w0["types"], w1["types"], args.top),
        }
        snaps = [workdir / f"worker-{pid}-{n}.snap" for n in (first_n, last_n)]
        if all(p.exists() for p in snaps):
            t0, t1 = (tracemalloc.Snapshot.load(str(p)) for p in snaps)
            report["workers"][pid]["by_line"] = compare(t0, t1, args.top, "lineno")
            if args.worker_frames > 1:
                report["workers"][pid]["by_traceback"] = compare(t0, t1, 8, "traceback")
    print(json.dumps(report, indent=1))
    spark.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
