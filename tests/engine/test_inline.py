"""A task's small outputs held back for its metadata row, and read back on the driver (``inline.py``)."""

from __future__ import annotations

import pyarrow as pa

from blobstate.engine import inline
from blobstate.engine.inline import InlineOutputs, read_payloads

SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("n", pa.int64())])


def _batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([f"k{i}" for i in range(first, first + rows)]), pa.array(range(rows))], SCHEMA
    )


def test_outputs_under_the_limit_are_held_and_read_back_in_order() -> None:
    held = InlineOutputs(10_000, SCHEMA)
    assert [list(held.add(_batch(i * 10, 10))) for i in range(3)] == [[], [], []]
    payload = held.payload()
    assert payload is not None
    (batch,) = read_payloads([payload])
    assert batch.to_pylist() == pa.Table.from_batches([_batch(i * 10, 10) for i in range(3)]).to_pylist()


def test_outputs_over_the_limit_are_all_emitted_as_rows_once_and_nothing_is_inlined() -> None:
    held = InlineOutputs(_batch(0, 10).nbytes + _batch(10, 10).nbytes, SCHEMA)  # two batches fit
    emitted = [list(held.add(_batch(i * 10, 10))) for i in range(4)]
    assert [len(e) for e in emitted] == [0, 0, 3, 1]  # the third batch goes over: all three, then each
    rows = [r for e in emitted for b in e for r in b.to_pylist()]
    assert rows == pa.Table.from_batches([_batch(i * 10, 10) for i in range(4)]).to_pylist()
    assert held.payload() is None


def test_a_limit_of_zero_never_holds_and_no_output_is_an_empty_payload() -> None:
    never = InlineOutputs(0, SCHEMA)
    assert [b.num_rows for b in never.add(_batch(0, 5))] == [5]
    assert never.payload() is None
    empty = InlineOutputs(100, SCHEMA).payload()
    assert empty is not None
    (batch,) = read_payloads([empty, empty])
    assert batch.num_rows == 0 and batch.schema == SCHEMA


def test_payloads_are_read_in_chunks_of_about_a_megabyte_at_most_one_per_payload(monkeypatch) -> None:
    payloads = []
    for p in range(3):
        held = InlineOutputs(10**9, SCHEMA)
        list(held.add(_batch(p * 1000, 1000)))
        payloads.append(held.payload())
    assert len(read_payloads(payloads)) == 1  # small: one partition of the sink's DataFrame
    monkeypatch.setattr(inline, "CHUNK_BYTES", 1)
    chunks = read_payloads(payloads)
    assert [b.num_rows for b in chunks] == [1000, 1000, 1000]
    assert pa.Table.from_batches(chunks).column("key").to_pylist()[::1000] == ["k0", "k1000", "k2000"]
