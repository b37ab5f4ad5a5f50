"""Benchmark of RocksStateStore against raw rocksdict, and of state value encoding; prints one JSON object.

    .venv/bin/python bench/state_store.py [--keys 1000000] [--rounds 2]
        [--section all|store|values] [--value-keys 50000] [--value-rounds 3]

Puts and gets (16-byte random keys, 32-byte values) through ``RocksStateStore`` and through a raw
rocksdict column family (raw bytes mode, the store's column family options, WAL off like the store), in
alternating rounds, each on a fresh database. Rates are reported against wall time and against the
calling thread's CPU time (steadier on a shared machine), with store/raw ratios. Then the replay rate of
``apply()`` on the changelog of a full round next to a bare loop of rocksdict write batches of the same
records, and the time of ``checkpoint()`` and of reopening the checkpoint.

The ``values`` section times the processor API's state operations, which encode and decode values with
the state variable's schema: ValueState ``update``/``get``, MapState ``updateValue``/``getValue`` and
ListState ``appendValue``/``get`` of ``--value-keys`` grouping keys, for three schemas: ``count BIGINT,
total BIGINT``, ``name STRING, score DOUBLE`` and a wide one with a date, timestamp, decimal and array.
Each runs on an in-memory dict store (the API and value encoding alone; ValueState and MapState) and on
RocksStateStore (all three), best CPU time of ``--value-rounds`` rounds, in nanoseconds per operation.
It uses only the public processor API, so the same script measures another version of blobstate
(``PYTHONPATH=<its src>``) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import gc
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Rdict, WriteBatch, WriteOptions

from blobstate.encoding import codec
from blobstate.encoding.codec import Key
from blobstate.lineage.changelog import Changelog
from blobstate.processor.api import PartitionSession, StatefulProcessorHandle
from blobstate.state import store as store_module
from blobstate.state.interface import KeyValueStore
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


Rates = dict[str, dict[str, float]]
"""``{"puts": rates(...), "gets": rates(...)}``."""


def rates(n: int, t: Timer) -> dict[str, float]:
    return {"wall_per_s": round(n / t.wall), "cpu_per_s": round(n / t.cpu)}


def bench_raw(path: Path, keys: list[bytes], values: list[bytes], lookups: list[bytes], wal: bool) -> Rates:
    db = Rdict(str(path), store_module._db_options(True))
    cf = db.create_column_family("s:bench", store_module._cf_options())
    if not wal:
        write_opt = WriteOptions()
        # rocksdict's stub declares disable_wal a method; the extension makes it a settable property
        write_opt.disable_wal = True  # type: ignore[method-assign,assignment]
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
) -> tuple[Rates, RocksStateStore]:
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


def bench_raw_batches(path: Path, records: Changelog) -> dict[str, float]:
    """The same records written by a bare loop of rocksdict write batches of ``APPLY_BATCH`` puts."""
    db = Rdict(str(path), store_module._db_options(True))
    db.create_column_family("s:bench", store_module._cf_options())
    handle = db.get_column_family_handle("s:bench")
    write_opt = WriteOptions()
    # rocksdict's stub declares disable_wal a method; the extension makes it a settable property
    write_opt.disable_wal = True  # type: ignore[method-assign,assignment]
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


def ratio(store: Rates, raw: Rates, op: str, clock: str) -> float:
    return round(store[op][clock] / raw[op][clock], 3)


VALUE_SCHEMAS: dict[str, Callable[[int], tuple[Any, ...]]] = {
    "count BIGINT, total BIGINT": lambda i: (i, i * 7),
    "name STRING, score DOUBLE": lambda i: (f"sensor-{i}", i * 0.5),
    "n INT, day DATE, at TIMESTAMP, price DECIMAL(10,2), tags ARRAY<STRING>": lambda i: (
        i,
        datetime.date(2024, 1, 1) + datetime.timedelta(days=i % 365),
        datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i),
        decimal.Decimal(i) / 100,
        ["a", f"t{i % 10}"],
    ),
}


class DictStore:
    """A KeyValueStore on dicts: the state API and value encoding alone."""

    def __init__(self) -> None:
        self.cfs: dict[str, dict[bytes, bytes]] = {}

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self.cfs.get(cf, {}).get(key)

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.get(cf, key) for key in keys]

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.cfs.setdefault(cf, {})[key] = value

    def put_many(self, cf: str, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        self.cfs.setdefault(cf, {}).update(pairs)

    def put_columns(self, cf: str, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        self.put_many(cf, zip(keys, values, strict=True))

    def delete(self, cf: str, key: bytes) -> None:
        self.cfs.get(cf, {}).pop(key, None)

    def clear(self, cf: str) -> None:
        self.cfs.pop(cf, None)

    def items(self, cf: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted((k, v) for k, v in self.cfs.get(cf, {}).items() if k.startswith(prefix)))

    def column_families(self) -> list[str]:
        return sorted(self.cfs)


def time_ops(session: PartitionSession, keys: list[tuple[Key, bytes]], op: Callable[[int], object]) -> float:
    """CPU seconds of ``op(i)`` for every key i, with that key set as the implicit grouping key."""
    with Timer() as t:
        for i, (key, kb) in enumerate(keys):
            session.key = key
            session.key_bytes = kb
            op(i)
    return t.cpu


def bench_value_ops(
    store: KeyValueStore,
    schema: str,
    rows: list[tuple[Any, ...]],
    keys: list[tuple[Key, bytes]],
    with_list: bool,
) -> dict[str, int]:
    """ns per operation of each state operation on ``store``, for one schema."""
    session = PartitionSession(store, "None", None, None)
    handle = StatefulProcessorHandle(session)
    value = handle.getValueState("v", schema)
    mapped = handle.getMapState("m", "k STRING", schema)
    user_key = ("k",)
    ops: dict[str, Callable[[int], object]] = {
        "value_update": lambda i: value.update(rows[i]),
        "value_get": lambda i: value.get(),
        "map_update": lambda i: mapped.updateValue(user_key, rows[i]),
        "map_get": lambda i: mapped.getValue(user_key),
    }
    if with_list:
        listed = handle.getListState("l", schema)
        ops["list_append"] = lambda i: listed.appendValue(rows[i])
        ops["list_get"] = lambda i: next(listed.get())
    out = {name: round(time_ops(session, keys, op) / len(keys) * 1e9) for name, op in ops.items()}
    session.key, session.key_bytes = keys[-1]
    assert value.get() == tuple(rows[-1])
    return out


def bench_values(n: int, rounds: int, root: Path) -> dict[str, Any]:
    """The ``values`` section: best of ``rounds`` per store, schema and operation."""
    keys = [((i,), codec.encode_key((i,))) for i in range(n)]
    out: dict[str, Any] = {"keys": n, "rounds": rounds, "ns_per_op_cpu": {}}
    for schema, make in VALUE_SCHEMAS.items():
        rows = [make(i) for i in range(n)]
        best: dict[str, dict[str, int]] = {"dict_store": {}, "rocks_store": {}}
        for r in range(rounds):
            gc.collect()
            result = bench_value_ops(DictStore(), schema, rows, keys, with_list=False)
            for k, v in result.items():
                best["dict_store"][k] = min(v, best["dict_store"].get(k, v))
            with RocksStateStore.open(root / f"values-{r}-{len(out['ns_per_op_cpu'])}") as store:
                result = bench_value_ops(store, schema, rows, keys, with_list=True)
            for k, v in result.items():
                best["rocks_store"][k] = min(v, best["rocks_store"].get(k, v))
        out["ns_per_op_cpu"][schema] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--section", choices=("all", "store", "values"), default="all")
    parser.add_argument("--value-keys", type=int, default=50_000)
    parser.add_argument("--value-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.section == "values":
        root = Path(tempfile.mkdtemp(prefix="bench-state-values-"))
        try:
            print(json.dumps({"values": bench_values(args.value_keys, args.value_rounds, root)}, indent=2))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    n = args.keys
    rng = random.Random(42)
    keys = [rng.randbytes(16) for _ in range(n)]
    values = [rng.randbytes(32) for _ in range(n)]
    lookups = keys[:]
    rng.shuffle(lookups)

    out: dict[str, Any] = {"keys": n, "key_bytes": 16, "value_bytes": 32, "rounds": []}
    root = Path(tempfile.mkdtemp(prefix="bench-state-store-"))
    try:
        records = Changelog()
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
        if args.section == "all":
            out["values"] = bench_values(args.value_keys, args.value_rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
