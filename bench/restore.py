"""Snapshot backup/restore benchmark on a real RocksDB store and the local-directory blob store; prints JSON.

Builds a RocksDB database of about ``--gb`` GiB (random, incompressible values, written in batches
without WAL, then compacted), checkpoints it, and measures against the local-directory store:

- full backup (MB/s);
- full restore into an empty directory vs ``cp -r`` of the same checkpoint, each run ``--rounds`` times,
  alternating; throughput of both and their ratio (target: restore >= 0.7x ``cp -r``), plus the CPU
  seconds each used (the wall-clock ratio swings with whatever else the machine runs; CPU time less so);
- restore into a directory that already holds every file: bytes moved (must be 0) and seconds, with the
  in-process checksum cache warm and cold (cold re-reads every local file);
- incremental backup after ``--change-fraction`` of the keys were overwritten: bytes uploaded vs the
  store's size.

Usage: .venv/bin/python bench/restore.py [--gb 1.0] [--workdir DIR] [--rounds 2] [--keep]
Takes a few minutes for 1 GiB. Needs about 4x ``--gb`` free disk space in the work directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rocksdict import Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from blobstate.blobstore import open_blob_store
from blobstate.snapshot import (
    BackupResult,
    ChecksumCache,
    RestoreStats,
    backup_directory,
    post_commit_cleanup,
    restore_directory,
)
from blobstate.snapshot.checksum import CRC32_IMPLEMENTATION

MB = 1 << 20
KEY_SIZE = 16


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_db(path: Path, records: int, value_size: int, seed: int) -> None:
    """Write ``records`` random key/values in batches without WAL, flush, and compact to a stable shape."""
    db = Rdict(str(path), Options(raw_mode=True))
    wo = WriteOptions()
    # rocksdict's stub declares disable_wal a method; the extension makes it a settable property
    wo.disable_wal = True  # type: ignore[method-assign,assignment]
    rng = random.Random(seed)
    batch_size = 10_000
    for start in range(0, records, batch_size):
        wb = WriteBatch(raw_mode=True)
        for i in range(start, min(start + batch_size, records)):
            wb.put(b"%016d" % i, rng.randbytes(value_size))
        db.write(wb, wo)
    db.flush()
    db.compact_range(None, None)
    db.close()


def change_keys(path: Path, records: int, fraction: float, value_size: int, seed: int) -> int:
    """Overwrite ``fraction`` of the keys with new random values and flush; returns how many."""
    db = Rdict(str(path), Options(raw_mode=True))
    wo = WriteOptions()
    # rocksdict's stub declares disable_wal a method; the extension makes it a settable property
    wo.disable_wal = True  # type: ignore[method-assign,assignment]
    rng = random.Random(seed)
    n = max(1, int(records * fraction))
    wb = WriteBatch(raw_mode=True)
    for i in rng.sample(range(records), n):
        wb.put(b"%016d" % i, rng.randbytes(value_size))
    db.write(wb, wo)
    db.flush()
    db.close()
    return n


def checkpoint(db_path: Path, dest: Path) -> None:
    db = Rdict(str(db_path), Options(raw_mode=True))
    Checkpoint(db).create_checkpoint(str(dest))
    db.close()


def sync() -> None:
    # Flush dirty pages of the previous run so each timed run starts from the same state; drops no cache.
    os.sync()


def timed(fn: Callable[[], object]) -> float:
    return timed_cpu(fn)[0]


def _cpu_seconds() -> float:
    # This process (all threads) plus waited-for children (cp).
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``fn()``; CPU time is what the work costs whatever else runs."""
    sync()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, _cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gb", type=float, default=1.0, help="approximate store size in GiB (default 1.0)")
    parser.add_argument("--value-size", type=int, default=1000, help="bytes per random value (default 1000)")
    parser.add_argument(
        "--workdir", default=None, help="where to put the temporary directory (default: $TMPDIR)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="restore / cp -r runs each, alternating")
    parser.add_argument(
        "--change-fraction", type=float, default=0.01, help="keys changed before the incremental"
    )
    parser.add_argument("--io-threads", type=int, default=8, help="blob store I/O threads (default 8)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    records = int(args.gb * (1 << 30) / (args.value_size + KEY_SIZE))
    base = Path(args.workdir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < 4 * args.gb * (1 << 30):
        sys.exit(f"not enough free space in {base}: {free / (1 << 30):.1f} GiB, need {4 * args.gb:.1f}")
    work = Path(tempfile.mkdtemp(prefix="blobstate-bench-restore-", dir=base))
    out: dict[str, object] = {
        "gb": args.gb,
        "records": records,
        "value_size": args.value_size,
        "crc32_implementation": CRC32_IMPLEMENTATION,
        "cpus": os.cpu_count(),
        "io_threads": args.io_threads,
        "workdir": str(work),
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    try:
        db_path, cp1 = work / "db", work / "cp1"
        t = time.perf_counter()
        build_db(db_path, records, args.value_size, seed=1)
        checkpoint(db_path, cp1)
        out["build_seconds"] = round(time.perf_counter() - t, 1)
        size = dir_size(cp1)
        out["store_bytes"] = size
        out["store_files"] = len(os.listdir(cp1))

        store = open_blob_store(str(work / "blobstore"), io_threads=args.io_threads)
        cache = ChecksumCache()
        holder: dict[str, BackupResult] = {}

        def full_backup() -> None:
            holder["b1"] = backup_directory(
                store,
                cp1,
                index_name="1_00000001.snapshot",
                blob_prefix="blobs/",
                previous=None,
                previous_name=None,
                checkpoint_id="1_00000001",
                checksum_cache=cache,
            )

        seconds = timed(full_backup)
        b1 = holder["b1"]
        post_commit_cleanup(store, b1.index_name, b1.index)
        out["full_backup"] = {"seconds": round(seconds, 2), "mb_per_s": round(size / MB / seconds, 1)}

        target, cp_target = work / "restore", work / "cp"
        restore_runs, cp_runs, restore_cpu, cp_cpu = [], [], [], []
        for _ in range(args.rounds):
            shutil.rmtree(target, ignore_errors=True)
            # A fresh cache: nothing is known about the target, every byte is verified.
            wall, cpu = timed_cpu(
                lambda: restore_directory(store, b1.index, target, checksum_cache=ChecksumCache())
            )
            restore_runs.append(wall)
            restore_cpu.append(cpu)
            shutil.rmtree(cp_target, ignore_errors=True)
            wall, cpu = timed_cpu(lambda: subprocess.run(["cp", "-r", str(cp1), str(cp_target)], check=True))
            cp_runs.append(wall)
            cp_cpu.append(cpu)
        assert {p.name: p.read_bytes() == (cp1 / p.name).read_bytes() for p in target.iterdir()} == {
            n: True for n in os.listdir(cp1)
        }, "restored files differ from the checkpoint"
        restore_mbs = [round(size / MB / s, 1) for s in restore_runs]
        cp_mbs = [round(size / MB / s, 1) for s in cp_runs]
        out["full_restore"] = {
            "restore_seconds": [round(s, 2) for s in restore_runs],
            "restore_mb_per_s": restore_mbs,
            "cp_r_seconds": [round(s, 2) for s in cp_runs],
            "cp_r_mb_per_s": cp_mbs,
            "ratio_best": round(max(restore_mbs) / max(cp_mbs), 2),
            "ratio_mean": round(sum(cp_runs) / sum(restore_runs), 2),
            "restore_cpu_seconds": [round(c, 2) for c in restore_cpu],
            "cp_r_cpu_seconds": [round(c, 2) for c in cp_cpu],
            "cpu_ratio": round(sum(cp_cpu) / sum(restore_cpu), 2),
        }

        # Target already holds every file.
        warm = ChecksumCache()
        restore_directory(store, b1.index, target, checksum_cache=warm)  # fills the cache
        results = {}
        for label, c in (("warm_cache", warm), ("cold_cache", ChecksumCache())):
            stats_holder: dict[str, RestoreStats] = {}

            def restore_present(c: ChecksumCache = c, h: dict[str, RestoreStats] = stats_holder) -> None:
                h["s"] = restore_directory(store, b1.index, target, checksum_cache=c)

            seconds = timed(restore_present)
            stats = stats_holder["s"]
            results[label] = {
                "seconds": round(seconds, 3),
                "bytes_downloaded": stats.bytes_downloaded,
                "files_reused": stats.files_reused,
            }
        out["restore_when_present"] = results

        # Incremental backup after a fraction of the keys changed.
        changed = change_keys(db_path, records, args.change_fraction, args.value_size, seed=2)
        cp2 = work / "cp2"
        checkpoint(db_path, cp2)
        size2 = dir_size(cp2)

        def incremental() -> None:
            holder["b2"] = backup_directory(
                store,
                cp2,
                index_name="2_00000002.snapshot",
                blob_prefix="blobs/",
                previous=b1.index,
                previous_name=b1.index_name,
                checkpoint_id="2_00000002",
                checksum_cache=cache,
            )

        seconds = timed(incremental)
        s2 = holder["b2"].stats
        out["incremental_backup"] = {
            "keys_changed": changed,
            "store_bytes": size2,
            "bytes_uploaded": s2.bytes_uploaded,
            "uploaded_fraction": round(s2.bytes_uploaded / size2, 4),
            "files_uploaded": s2.files_uploaded,
            "files_retained": s2.files_retained,
            "seconds": round(seconds, 2),
        }
        store.close()
        out["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
