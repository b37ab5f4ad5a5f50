"""Benchmark of RocksStateStore against raw rocksdict in the same run; prints one JSON object.

    .venv/bin/python bench/state_store.py [--keys 1000000] [--rounds 2]

Puts and gets (16-byte random keys, 32-byte values) through ``RocksStateStore`` and through a raw
rocksdict column family (raw bytes mode, the store's column family options, WAL off like the store), in
alternating rounds, each on a fresh database. Rates are reported against wall time and against the
calling thread's CPU time (steadier on a shared machine), with store/raw ratios. Then the replay rate of
``apply()`` on the changelog of a full round next to a bare loop of rocksdict write batches of the same
records, and the time of ``checkpoint()`` and of reopening the checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rocksdict import Rdict, WriteBatch, WriteOptions

from blobstate.state import store as store_module
from blobstate.state.store import RocksStateStore


class Timer:
    """Wall and thread-CPU time of a block."""

    def __enter__(self) -> Timer:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.thread_time() - self._cpu


def rates(n: int, t: Timer) -> dict[str, float]:
    return {"wall_per_s": round(n / t.wall), "cpu_per_s": round(n / t.cpu)}


def bench_raw(path: Path, keys: list[bytes], values: list[bytes], lookups: list[bytes], wal: bool) -> dict:
    db = Rdict(str(path), store_module._db_options(True))
    cf = db.create_column_family("s:bench", store_module._cf_options())
    if not wal:
        write_opt = WriteOptions()
        write_opt.disable_wal = True
        cf.set_write_options(write_opt)
    put = cf.put
    get = cf.get
    with Timer() as tp:
        for key, value in zip(keys, values, strict=True):
            put(key, value)
    with Timer() as tg:
        for key in lookups:
            get(key)
    assert get(keys[0]) == values[0]
    del put, get, cf
    db.close()
    return {"puts": rates(len(keys), tp), "gets": rates(len(lookups), tg)}


def bench_store(
    path: Path, keys: list[bytes], values: list[bytes], lookups: list[bytes]
) -> tuple[dict, RocksStateStore]:
    store = RocksStateStore.open(path)
    put = store.put
    get = store.get
    with Timer() as tp:
        for key, value in zip(keys, values, strict=True):
            put("bench", key, value)
        store._sync()  # the last overlay entries into RocksDB, so both sides did the same work
    with Timer() as tg:
        for key in lookups:
            get("bench", key)
    assert get("bench", keys[0]) == values[0]
    return {"puts": rates(len(keys), tp), "gets": rates(len(lookups), tg)}, store


def bench_raw_batches(path: Path, records: list) -> dict[str, float]:
    """The same records written by a bare loop of rocksdict write batches of ``APPLY_BATCH`` puts."""
    db = Rdict(str(path), store_module._db_options(True))
    db.create_column_family("s:bench", store_module._cf_options())
    handle = db.get_column_family_handle("s:bench")
    write_opt = WriteOptions()
    write_opt.disable_wal = True
    with Timer() as t:
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(handle)
        for _op, _cf, key, value in records:
            batch.put(key, value)
            if len(batch) >= store_module.APPLY_BATCH:
                db.write(batch, write_opt)
                batch = WriteBatch(raw_mode=True)
                batch.set_default_column_family(handle)
        db.write(batch, write_opt)
    del handle
    db.close()
    return rates(len(records), t)


def ratio(store: dict, raw: dict, op: str, clock: str) -> float:
    return round(store[op][clock] / raw[op][clock], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.keys
    rng = random.Random(42)
    keys = [rng.randbytes(16) for _ in range(n)]
    values = [rng.randbytes(32) for _ in range(n)]
    lookups = keys[:]
    rng.shuffle(lookups)

    out: dict = {"keys": n, "key_bytes": 16, "value_bytes": 32, "rounds": []}
    root = Path(tempfile.mkdtemp(prefix="bench-state-store-"))
    try:
        records: list = []
        for r in range(args.rounds):
            # alternate which side goes first, so drift in the machine's load hits both sides
            if r % 2 == 0:
                raw = bench_raw(root / f"raw{r}", keys, values, lookups, wal=False)
                gc.collect()
                store_result, store = bench_store(root / f"store{r}", keys, values, lookups)
            else:
                store_result, store = bench_store(root / f"store{r}", keys, values, lookups)
                gc.collect()
                raw = bench_raw(root / f"raw{r}", keys, values, lookups, wal=False)
            records = store.take_changelog()
            if r == args.rounds - 1:
                with Timer() as tc:
                    store.checkpoint(root / "checkpoint")
                store.put("bench", b"after-checkpoint", b"x")
                with Timer() as tc2:
                    store.checkpoint(root / "checkpoint2")
                with Timer() as to:
                    reopened = RocksStateStore.open(root / "checkpoint", create=False)
                assert reopened.get("bench", keys[-1]) == values[-1]
                assert reopened.get("bench", b"after-checkpoint") is None
                reopened.close()
                checkpoint_s, checkpoint_flushed_s, reopen_s = tc.wall, tc2.wall, to.wall
            store.close()
            gc.collect()
            out["rounds"].append(
                {
                    "raw": raw,
                    "store": store_result,
                    "ratio_puts_wall": ratio(store_result, raw, "puts", "wall_per_s"),
                    "ratio_gets_wall": ratio(store_result, raw, "gets", "wall_per_s"),
                    "ratio_puts_cpu": ratio(store_result, raw, "puts", "cpu_per_s"),
                    "ratio_gets_cpu": ratio(store_result, raw, "gets", "cpu_per_s"),
                }
            )
        for key in ("ratio_puts_wall", "ratio_gets_wall", "ratio_puts_cpu", "ratio_gets_cpu"):
            out[key + "_median"] = round(statistics.median(rnd[key] for rnd in out["rounds"]), 3)

        raw_wal = bench_raw(root / "raw-wal", keys, values, lookups, wal=True)
        out["raw_with_wal_puts"] = raw_wal["puts"]

        raw_batch = bench_raw_batches(root / "raw-batches", records)
        with RocksStateStore.open(root / "replay") as target:
            with Timer() as ta:
                target.apply(records)
            with Timer() as tf:
                target.flush()
            assert target.get("bench", keys[-1]) == values[-1]
        out["apply"] = {
            "records": len(records),
            "store_apply": rates(len(records), ta),
            "raw_write_batches": raw_batch,
            "ratio_wall": round((len(records) / ta.wall) / raw_batch["wall_per_s"], 3),
            "ratio_cpu": round((len(records) / ta.cpu) / raw_batch["cpu_per_s"], 3),
            "flush_after_apply_s": round(tf.wall, 3),
        }

        out["checkpoint"] = {
            "first_checkpoint_s_incl_memtable_flush": round(checkpoint_s, 4),
            "checkpoint_s_small_memtable": round(checkpoint_flushed_s, 4),
            "reopen_checkpoint_s": round(reopen_s, 4),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
