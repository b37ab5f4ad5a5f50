"""Main rows held back while a bootstrap adjunct loads its backlog, kept in the partition's own state.

While a rate-limited side stream still has backlog at a new query's start, no main row may be processed
(a bootstrap store is loaded before any main input). The rows of such batches are written to the
``$adjunct-deferred`` column family of the partition's store as Arrow IPC streams (data only: read back
with Arrow, never unpickled), so they are checkpointed with the state and replayed batches hold them the
same way. The batch that finds the backlog loaded processes them first, in batch order, with its own
rows.
"""

from __future__ import annotations

import pyarrow as pa

from blobstate.errors import CorruptionError
from blobstate.state.interface import KeyValueStore

DEFERRED_CF = "$adjunct-deferred"


class DeferredRowsError(CorruptionError, ValueError):
    """Held-back rows that cannot be read back (corrupt, or of another schema than the input)."""


def defer(store: KeyValueStore, version: int, batches: list[pa.RecordBatch]) -> int:
    """Hold ``batches`` (one batch's main rows) under ``version``; returns how many rows."""
    rows: int = sum(b.num_rows for b in batches)
    if not rows:
        return 0
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    store.put(DEFERRED_CF, version.to_bytes(8, "big"), sink.getvalue().to_pybytes())
    return rows


def _read(version: int, data: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as error:
        raise DeferredRowsError(
            f"main rows held back by the batch of version {version} cannot be read: {error}"
        ) from None


def held_rows(store: KeyValueStore) -> list[tuple[int, int]]:
    """``(version, rows)`` of every held-back batch, in batch order, left in the store."""
    if DEFERRED_CF not in store.column_families():
        return []
    return [
        (version, _read(version, bytes(data)).num_rows)
        for version, data in (
            (int.from_bytes(bytes(key), "big"), data) for key, data in store.items(DEFERRED_CF)
        )
    ]


def take_deferred(store: KeyValueStore, schema: pa.Schema | None) -> list[pa.RecordBatch]:
    """Every held-back batch's rows in batch order, removed from the store. ``schema`` is the input's
    (None: take it from the held rows); held rows of another schema are an error naming their batch."""
    out: list[pa.RecordBatch] = []
    keys = []
    for key, data in store.items(DEFERRED_CF):
        version = int.from_bytes(bytes(key), "big")
        table = _read(version, bytes(data))
        if schema is not None and not table.schema.equals(schema):
            raise DeferredRowsError(
                f"main rows held back by the batch of version {version} have schema {table.schema};"
                f" the input has {schema}"
            )
        out += table.to_batches()
        keys.append(bytes(key))
    for key in keys:
        store.delete(DEFERRED_CF, key)
    return out
