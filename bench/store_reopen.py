"""What reopening a partition's working store costs each batch; prints one JSON object.

    .venv/bin/python bench/store_reopen.py [--keys 100000,1000000] [--batches 20] [--rounds 20] [--dir DIR]

A processing task opens its partition's working store and closes it at commit, so every batch pays one
RocksDB open and one close. For each size, a store is built the way a running query builds it: the
keys (16-byte random keys, 16-byte values) in one bulk write, then ``--batches`` rounds that each
update 1% of the keys and close the store (one flush per batch, so several sorted runs as under
universal compaction). Then, ``--rounds`` times: ``RocksStateStore.open``, 100 point reads, ``close``;
the median and the maximum of each step, wall and thread-CPU milliseconds, and the number of files in
the directory. The process's shared block cache stays warm across rounds, as in a reused Python worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from blobstate.state.store import RocksStateStore

CF = "count"


class Timer:
    """Wall and thread-CPU milliseconds of a block."""

    def __enter__(self) -> Timer:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = (time.perf_counter() - self._wall) * 1000
        self.cpu = (time.thread_time() - self._cpu) * 1000


def build(path: Path, n: int, batches: int, rng: random.Random) -> list[bytes]:
    keys = [rng.randbytes(16) for _ in range(n)]
    with RocksStateStore.open(path) as store:
        store.put_columns(CF, keys, [rng.randbytes(16) for _ in range(n)])
    for _ in range(batches):
        with RocksStateStore.open(path) as store:
            picked = rng.sample(keys, max(1, n // 100))
            store.put_columns(CF, picked, [rng.randbytes(16) for _ in picked])
    return keys


def summary(samples: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(samples), 3), "max": round(max(samples), 3)}


def measure(path: Path, keys: list[bytes], rounds: int, rng: random.Random) -> dict[str, Any]:
    steps: dict[str, dict[str, list[float]]] = {
        s: {"wall_ms": [], "cpu_ms": []} for s in ("open", "reads_100", "close")
    }
    for _ in range(rounds):
        lookups = rng.sample(keys, 100)
        with Timer() as t_open:
            store = RocksStateStore.open(path)
        with Timer() as t_reads:
            assert all(v is not None for v in store.multi_get(CF, lookups))
        with Timer() as t_close:
            store.close()
        for name, t in (("open", t_open), ("reads_100", t_reads), ("close", t_close)):
            steps[name]["wall_ms"].append(t.wall)
            steps[name]["cpu_ms"].append(t.cpu)
    out: dict[str, Any] = {name: {k: summary(v) for k, v in s.items()} for name, s in steps.items()}
    out["files"] = len(os.listdir(path))
    out["sst_files"] = sum(1 for f in os.listdir(path) if f.endswith(".sst"))
    out["bytes"] = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--keys", default="100000,1000000")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dir", default=None, help="where to build the stores (default: the temp dir)")
    args = parser.parse_args()
    rng = random.Random(7)
    root = Path(tempfile.mkdtemp(prefix="blobstate-reopen-", dir=args.dir))
    results: dict[str, Any] = {
        "dir": str(root.parent),
        "batches": args.batches,
        "rounds": args.rounds,
        "sizes": {},
    }
    try:
        for n in (int(k) for k in args.keys.split(",")):
            path = root / f"store-{n}"
            keys = build(path, n, args.batches, rng)
            results["sizes"][str(n)] = measure(path, keys, args.rounds, rng)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
