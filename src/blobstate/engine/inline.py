"""Small outputs travel with a task's metadata row: one Spark job per batch, no second read of the stage.

A task keeps its partition's output batches in memory while they total at most ``limit`` bytes (Arrow
``nbytes``). If the partition ends under the limit, the outputs go to the driver as one Arrow IPC stream
in the metadata row (``OUTPUTS_COLUMN``), inside the same task result as the metadata: the driver
cannot receive the metadata of one execution and the outputs of another. Once a partition's outputs
exceed the limit they are emitted as rows (the persisted path of ``outputs.py``) and nothing is inlined.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

OUTPUTS_COLUMN = "__blobstate_outputs"
"""Binary column of the stage: on a metadata row, the partition's outputs as an Arrow IPC stream."""


class InlineOutputs:
    """One task's outputs, held back while they are small (``limit`` bytes; 0 never holds any)."""

    def __init__(self, limit: int, schema: pa.Schema) -> None:
        """``schema``: the output columns as the stage emits them (all nullable)."""
        self._limit = limit
        self._schema = schema
        self._held: list[pa.RecordBatch] | None = [] if limit > 0 else None
        self._bytes = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """The batches to emit as rows now: none while held, everything held once over the limit."""
        batch = pa.RecordBatch.from_arrays([batch.column(f.name) for f in self._schema], schema=self._schema)
        if self._held is None:
            yield batch
            return
        self._held.append(batch)
        self._bytes += batch.nbytes
        if self._bytes > self._limit:
            held, self._held = self._held, None
            yield from held

    def payload(self) -> bytes | None:
        """The held outputs as one Arrow IPC stream, or None when they were emitted as rows."""
        if self._held is None:
            return None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self._schema) as writer:
            for batch in self._held:
                writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())


CHUNK_BYTES = 1024 * 1024
"""Inlined outputs are handed to Spark in chunks of about this size: each becomes one partition of the
sink's DataFrame (many small partitions would cost a task each; one large one would leave cores idle)."""


def read_payloads(payloads: list[bytes]) -> list[pa.RecordBatch]:
    """The outputs of one or more partitions' metadata rows, in batches of about ``CHUNK_BYTES`` (one
    empty batch if there are no rows: the sink's DataFrame has at least one partition)."""
    table = pa.concat_tables([pa.ipc.open_stream(p).read_all() for p in payloads]).combine_chunks()
    if table.num_rows == 0:
        return [pa.RecordBatch.from_arrays([pa.array([], f.type) for f in table.schema], schema=table.schema)]
    chunks = max(1, min(len(payloads), table.nbytes // CHUNK_BYTES))
    return list(table.to_batches(max_chunksize=-(-table.num_rows // chunks)))
