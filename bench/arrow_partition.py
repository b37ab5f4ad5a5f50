"""One partition's micro-batch of the vectorized running count, in-process, against its bare parts; JSON.

What a blobstate task does for ``api="arrow"`` besides Spark's own work, measured without Spark: a
partition holding ``--keys`` keys (all loaded by the first batch), batches of ``--events`` events with
uniformly random keys, on a real RocksStateStore and a local-directory blob store. Per steady batch, in
CPU seconds of this process (RocksDB's background threads included):

* ``blobstate``: ``run_partition`` with :class:`~blobstate.demo.running_count.ArrowRunningCount`
  (group by key, read, add, write, emit), then ``commit()`` (delta encoded and stored, local checkpoint;
  a background snapshot every 10 versions, as in the engine); ``process`` and ``commit`` are its parts;
* ``floor``: what the benchmark's stateless floor computes in its Arrow stage: the batch's count and sum
  per key with pyarrow's ``group_by``;
* ``bare_rocksdb``: the RocksDB calls no RocksDB-backed state can avoid for the same keys, with the
  values already encoded: one rocksdict ``get`` per distinct key, one write batch of one ``put`` per key,
  and one memtable flush (a version must be on disk before it is committed);

and the ratio of blobstate to floor + bare_rocksdb: how much of blobstate's Python cost is above what the
per-key RocksDB calls through rocksdict cost by themselves.

``--row`` adds the row API (``api="row"``, one handler call per key with ``pyspark.sql.Row`` objects in
and out, as Spark's ``transformWithState``) on the same batches:

* ``blobstate_row``: the same path with :class:`~blobstate.demo.running_count.RowRunningCount`;
* ``row_api_only``: ``run_partition`` with the same processor whose state variable is a stand-in that
  holds nothing (``get`` finds no value, ``update`` keeps none): what the row API's contract costs
  before any state.

    .venv/bin/python bench/arrow_partition.py [--keys 500000] [--events 100000] [--batches 8] [--row]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle
from rocksdict import WriteBatch

from blobstate.blobstore import open_blob_store
from blobstate.demo.running_count import ArrowRunningCount, RowRunningCount
from blobstate.processor import RunSpec, run_partition
from blobstate.state.partition import open_partition
from blobstate.state.store import RocksStateStore

QUERY_ID = "0123456789abcdef"
OUTPUT = "key STRING, count BIGINT, total BIGINT"


def cpu_seconds() -> float:
    """User + system CPU of this process, every thread (RocksDB's background work included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def batch(rng: np.random.Generator, vocabulary: pa.Array, events: int | None) -> pa.Table:
    """``events`` random events (None: every key once, to load the state)."""
    n = len(vocabulary)
    idx = np.arange(n) if events is None else rng.integers(0, n, events)
    values = rng.integers(0, 1000, len(idx), dtype=np.int64)
    return pa.table({"key": vocabulary.take(pa.array(idx)), "value": values})


class NoState:
    """A value state that holds nothing: ``get`` finds no value, ``update`` keeps none."""

    def get(self) -> None:
        """No value."""
        return None

    def update(self, value: tuple[int, int]) -> None:
        """Keep nothing."""


class RowsOnly(RowRunningCount):
    """The row running count's own handler with its state calls doing nothing: the row API's own
    per-key cost."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the same state variable, then use a stand-in that reads and writes nothing."""
        super().init(handle)
        self.state = NoState()  # type: ignore[assignment]


def run_blobstate(
    root: Path, tables: list[pa.Table], processor: type[Any] = ArrowRunningCount, api: str = "arrow"
) -> list[dict[str, float]]:
    """The full path per batch: run_partition (``processor``, ``api``) and commit, in a checkpoint and
    local directory of the processor's own."""
    name = processor.__name__
    blob_store = open_blob_store(f"file://{root}/blob-{name}")
    committed = None
    phases = []
    for table in tables:
        state = open_partition(
            blob_store, root / f"local-{name}", QUERY_ID, "0", 0, committed, snapshot_upload="background"
        )
        started = cpu_seconds()
        outputs = run_partition(
            processor(),
            state.store,
            table,
            RunSpec(key_columns=("key",), output_schema=OUTPUT, api=api),
        )
        rows = sum(out.num_rows for out in outputs)
        processed = cpu_seconds()
        committed = state.commit().checkpoint_id
        done = cpu_seconds()
        state.close()
        phases.append({"process": processed - started, "commit": done - processed, "output_rows": rows})
    return phases


def run_floor(tables: list[pa.Table]) -> list[float]:
    """The floor's Arrow stage: count and sum per key of the batch."""
    seconds = []
    for table in tables:
        started = cpu_seconds()
        table.group_by("key").aggregate([("value", "count"), ("value", "sum")])
        seconds.append(cpu_seconds() - started)
    return seconds


def run_bare(root: Path, tables: list[pa.Table]) -> list[float]:
    """One get per distinct key, one write batch of a put per key, one flush: nothing else."""
    store = RocksStateStore.open(root / "bare")
    family = store._family("agg")  # the store's own column family options and handles
    db = store._open_db()
    value = bytes(18)
    seconds = []
    for table in tables:
        # before the clock; in key order, as blobstate reads and writes them
        keys = sorted(k.encode() for k in table.column("key").unique().to_pylist())
        started = cpu_seconds()
        list(map(family.view.get, keys))
        writes = WriteBatch(raw_mode=True)
        writes.set_default_column_family(family.handle)
        put = writes.put
        for key in keys:
            put(key, value)
        db.write(writes, store._write_opt)
        store.flush()
        seconds.append(cpu_seconds() - started)
    store.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements on the same batches and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=8, help="steady batches, after the loading one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--row", action="store_true", help="also the row API (blobstate_row, row_api_only)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    vocabulary = pa.array([f"k{i:07d}" for i in range(args.keys)], pa.string())
    tables = [batch(rng, vocabulary, None)] + [
        batch(rng, vocabulary, args.events) for _ in range(args.batches)
    ]
    with tempfile.TemporaryDirectory(prefix="arrow_partition-") as tmp:
        root = Path(tmp)
        wall = time.monotonic()
        phases = run_blobstate(root, tables)[1:]
        bare = run_bare(root, tables)[1:]
        floor = run_floor(tables[1:])
        rows = run_blobstate(root, tables, RowRunningCount, "row")[1:] if args.row else []
        rows_only = run_blobstate(root, tables, RowsOnly, "row")[1:] if args.row else []
        wall = time.monotonic() - wall

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    blobstate = median([p["process"] + p["commit"] for p in phases])
    result: dict[str, Any] = {
        "keys": args.keys,
        "events_per_batch": args.events,
        "steady_batches": args.batches,
        "distinct_keys_per_batch": median([float(p["output_rows"]) for p in phases]),
        "cpu_seconds_per_batch": {
            "blobstate": blobstate,
            "blobstate_process": median([p["process"] for p in phases]),
            "blobstate_commit": median([p["commit"] for p in phases]),
            "floor": median(floor),
            "bare_rocksdb": median(bare),
        },
        "blobstate_over_floor_plus_bare_rocksdb": round(blobstate / (median(floor) + median(bare)), 2),
        "wall_seconds": round(wall, 1),
    }
    if args.row:
        result["cpu_seconds_per_batch"].update(
            {
                "blobstate_row": median([p["process"] + p["commit"] for p in rows]),
                "blobstate_row_process": median([p["process"] for p in rows]),
                "row_api_only_process": median([p["process"] for p in rows_only]),
            }
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
