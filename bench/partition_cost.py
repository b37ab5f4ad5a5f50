"""A partition's fixed cost per batch in a task, without Spark: open, a few writes, commit, close.

Runs what a processing task does to its partition's state (``open_partition`` at the committed
version, ``rows`` puts, ``commit`` under a fresh uid, close) for ``partitions`` partitions and ``batches``
batches on a local-directory blob store, as one executor process would at Spark's default 200
partitions, and prints JSON: CPU and wall milliseconds per partition-batch (process CPU time, so RocksDB's
own threads count), and with ``--profile`` the functions that take the most cumulative time. Run by hand:

    .venv/bin/python bench/partition_cost.py [--partitions 200] [--batches 5] [--rows 10] [--profile]

``--compare REV[,REV...]`` measures source trees side by side: each git revision's ``src/`` (extracted
with ``git archive``) and this working tree's, each run in a fresh process, ``--repeat`` rounds with the
order rotated every round (the machine's load drifts); it prints the median, minimum and maximum CPU and
wall milliseconds of each tree, and ``--out FILE`` writes the same JSON to a file:

    .venv/bin/python bench/partition_cost.py --compare HEAD~3 --out bench/results-partition-cost.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

CF = "default"
QUERY_ID = "0123456789abcdef"
WORKTREE = "worktree"
"""The label of this working tree's ``src/`` in ``--compare``."""


def run(partitions: int, batches: int, rows: int, root: Path) -> tuple[float, float]:
    """Run ``batches`` batches over ``partitions`` partitions; CPU and wall seconds of all but the first."""
    from blobstate.blobstore.local import LocalBlobStore
    from blobstate.ids import CheckpointId, new_uid
    from blobstate.state.partition import open_partition

    store = LocalBlobStore(str(root / "blobs"))
    local_dir = root / "local"
    committed: dict[int, CheckpointId | None] = dict.fromkeys(range(partitions))
    cpu = wall = 0.0
    for batch in range(batches):
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        for p in range(partitions):
            state = open_partition(store, local_dir, QUERY_ID, "op", p, committed[p])
            try:
                for r in range(rows):
                    key = f"k{batch}-{r}".encode()
                    state.store.get(CF, key)
                    state.store.put(CF, key, b"v" * 16)
                result = state.commit(new_uid())
            finally:
                state.close()
            committed[p] = result.checkpoint_id
        if batch > 0:  # the first batch creates every store
            cpu += time.process_time() - cpu_started
            wall += time.perf_counter() - wall_started
    return cpu, wall


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process: the JSON object ``main`` prints."""
    with tempfile.TemporaryDirectory(prefix="partition-cost-") as tmp:
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        if profiler is not None:
            profiler.enable()
        cpu, wall = run(args.partitions, args.batches, args.rows, Path(tmp))
        if profiler is not None:
            profiler.disable()
    import blobstate

    measured = args.partitions * (args.batches - 1)
    out: dict[str, Any] = {
        "benchmark": "partition_cost",
        "source": str(Path(blobstate.__file__).parent.parent),
        "partitions": args.partitions,
        "batches": args.batches,
        "rows": args.rows,
        "cpu_ms_per_partition_batch": round(1000 * cpu / measured, 3),
        "wall_ms_per_partition_batch": round(1000 * wall / measured, 3),
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        out["profile"] = text.getvalue().splitlines()
    return out


def _extract(rev: str, into: Path) -> Path:
    """``rev``'s ``src/`` extracted under ``into``; returns the directory to put on ``PYTHONPATH``."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", rev, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _spread(samples: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(samples), 3),
        "min": round(min(samples), 3),
        "max": round(max(samples), 3),
        "samples": samples,
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run each tree of ``args.compare`` (and this working tree) ``args.repeat`` times, rotated."""
    revs = [r for r in args.compare.split(",") if r]
    runs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="partition-cost-trees-") as tmp:
        trees: dict[str, Path] = {}
        for i, rev in enumerate(revs):
            commit = subprocess.run(
                ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", rev],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            label = commit if rev.startswith(commit) or commit.startswith(rev) else f"{rev} ({commit})"
            trees[label] = _extract(rev, Path(tmp) / str(i))
        trees[WORKTREE] = Path(__file__).resolve().parent.parent / "src"
        labels = list(trees)
        command = [sys.executable, str(Path(__file__).resolve()), "--partitions", str(args.partitions)]
        command += ["--batches", str(args.batches), "--rows", str(args.rows)]
        for round_ in range(args.repeat):
            for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
                env = {**os.environ, "PYTHONPATH": str(trees[label])}
                done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
                result = json.loads(done.stdout)
                if Path(result["source"]) != trees[label]:
                    raise RuntimeError(f"{label}: the run imported blobstate from {result['source']}")
                samples = runs.setdefault(label, {"cpu": [], "wall": []})
                samples["cpu"].append(result["cpu_ms_per_partition_batch"])
                samples["wall"].append(result["wall_ms_per_partition_batch"])
    return {
        "benchmark": "partition_cost",
        "command": " ".join(["bench/partition_cost.py", *sys.argv[1:]]),
        "partitions": args.partitions,
        "batches": args.batches,
        "rows": args.rows,
        "repeat": args.repeat,
        "load_average_end": list(os.getloadavg()),
        "cpu_ms_per_partition_batch": {label: _spread(s["cpu"]) for label, s in runs.items()},
        "wall_ms_per_partition_batch": {label: _spread(s["wall"]) for label, s in runs.items()},
    }


def main() -> int:
    """Parse arguments, run (or compare trees), print JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    parser.add_argument("--compare", metavar="REV[,REV...]", help="git revisions to measure beside this tree")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of --compare")
    parser.add_argument("--out", type=Path, help="also write --compare's JSON to this file")
    args = parser.parse_args()
    if args.compare:
        if args.profile:
            parser.error("--profile measures one tree: leave out --compare")
        out = compare(args)
        text = json.dumps(out, indent=2)
        if args.out is not None:
            args.out.write_text(text + "\n")
    else:
        text = json.dumps(measure(args), indent=2)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
