"""The handler calls of the vectorized API (``api="arrow"``) for one partition and micro-batch.

:func:`blobstate.processor.runner.run_partition` runs the lifecycle (``init``, the initial state,
the input, due timers, the TTL sweep, ``close``) for every API; for this one it calls the functions
here: each phase is one handler call over many keys instead of one call per key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from blobstate import defaults
from blobstate.encoding import codec, layout
from blobstate.processor.api import PartitionSession, TimerValues, delete_timer
from blobstate.processor.arrow_api import ArrowStatefulProcessor, ExpiredTimers, KeyedBatch
from blobstate.processor.columnar import conform_columns, decode_keys, encode_keys
from blobstate.processor.errors import OutputSchemaError, StatefulProcessorError
from blobstate.processor.grouping import key_runs

if TYPE_CHECKING:
    from blobstate.processor.runner import RunStats

DEFAULT_FLUSH_ROWS = defaults.FLUSH_ROWS


class ArrowOutputCollector:
    """Takes the tables and record batches handlers yield and emits record batches of the output schema.

    Columns are matched by name and cast to the output types (a column that is missing, a value that does
    not fit, or a null in a NOT NULL column raises :class:`OutputSchemaError` naming the handler).
    """

    items = "pyarrow Tables or RecordBatches"
    """What handlers must yield, for error messages."""

    def __init__(
        self, arrow_schema: pa.Schema, *, not_null: Sequence[str] = (), flush_rows: int = DEFAULT_FLUSH_ROWS
    ):
        self.arrow_schema = arrow_schema
        self.flush_rows = flush_rows
        self._not_null = list(not_null)
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0
        self.total_rows = 0

    def add(self, frame: Any, source: str) -> None:
        """Keep one yielded table or record batch; ``source`` (the handler) is named in errors."""
        if isinstance(frame, pa.RecordBatch):
            table = pa.Table.from_batches([frame])
        elif isinstance(frame, pa.Table):
            table = frame
        else:
            raise OutputSchemaError(
                f"{source} yielded a {type(frame).__name__}; with api='arrow' it must yield {self.items}"
                f" with the output columns {self.arrow_schema.names}"
            )
        if not table.num_rows:
            return
        out = conform_columns(
            table,
            self.arrow_schema,
            missing=lambda columns: OutputSchemaError(
                f"{source} yielded a table without output column(s) {columns}; it has {table.column_names}"
            ),
            unfit=lambda field, found, error: OutputSchemaError(
                f"{source} yielded column {field.name!r} of type {found}, which does not fit the output"
                f" type {field.type}: {error}"
            ),
        )
        nulls = [name for name in self._not_null if out.column(name).null_count]
        if nulls:
            raise OutputSchemaError(f"{source} yielded nulls in output column(s) {nulls}, which are NOT NULL")
        self._pending.extend(out.to_batches())
        self._rows += out.num_rows

    @property
    def ready(self) -> bool:
        """Whether enough rows are pending to emit a batch."""
        return self._rows >= self.flush_rows

    def flush(self) -> pa.RecordBatch | None:
        """The pending rows as one record batch (None if there are none)."""
        if not self._pending:
            return None
        batch = pa.Table.from_batches(self._pending, schema=self.arrow_schema).combine_chunks().to_batches()
        self._pending = []
        self.total_rows += self._rows
        self._rows = 0
        if not batch:
            return None
        return batch[0] if len(batch) == 1 else pa.concat_batches(batch)


def collect(result: Any, collector: ArrowOutputCollector, source: str) -> Iterator[pa.RecordBatch]:
    """Consume a handler's result into ``collector``, emitting record batches as they fill."""
    if result is None:
        return
    if isinstance(result, (pa.Table, pa.RecordBatch)):
        result = (result,)
    elif isinstance(result, (str, bytes)) or not hasattr(result, "__iter__"):
        raise StatefulProcessorError(
            f"{source} returned a {type(result).__name__}; it must return or yield {collector.items}"
        )
    try:
        for frame in result:
            collector.add(frame, source)
            if collector.ready:
                batch = collector.flush()
                if batch is not None:
                    yield batch
    except OutputSchemaError:
        raise
    except Exception as e:  # raised while the handler runs (it runs as it yields)
        e.add_note(f"(in {source}, api='arrow')")
        raise


def keyed_batch(session: PartitionSession, table: pa.Table, key_columns: list[str]) -> KeyedBatch:
    """``table``'s rows grouped by ``key_columns`` as the handlers see them."""
    rows, starts, _ends = key_runs(table, key_columns)
    offsets = np.append(starts, rows.num_rows)
    keys = rows.select(key_columns).take(pa.array(starts))
    return KeyedBatch(session, keys, encode_keys(keys), rows, offsets)


def _bulk(session: PartitionSession, call: KeyedBatch | ExpiredTimers) -> None:
    session.bulk = call._keys


def initial_state(
    proc: ArrowStatefulProcessor,
    session: PartitionSession,
    table: pa.Table,
    key_columns: list[str],
    timer_values: TimerValues,
    stats: RunStats,
) -> None:
    """``handleInitialState`` over every key of the initial state."""
    batch = keyed_batch(session, table, key_columns)
    _bulk(session, batch)
    try:
        proc.handleInitialState(batch, timer_values)
    except Exception as e:
        e.add_note("(in handleInitialState, api='arrow')")
        raise
    finally:
        session.bulk = None
    stats.initial_state_keys = batch.num_keys


def input_batch(
    proc: ArrowStatefulProcessor,
    session: PartitionSession,
    table: pa.Table,
    key_columns: list[str],
    timer_values: TimerValues,
    collector: ArrowOutputCollector,
    stats: RunStats,
) -> Iterator[pa.RecordBatch]:
    """``handleInputBatch`` over every key of the input; yields the output batches."""
    batch = keyed_batch(session, table, key_columns)
    stats.keys = batch.num_keys
    _bulk(session, batch)
    try:
        yield from collect(proc.handleInputBatch(batch, timer_values), collector, "handleInputBatch")
    finally:
        session.bulk = None


def expired_timers(
    proc: ArrowStatefulProcessor,
    session: PartitionSession,
    due: list[tuple[int, bytes]],
    key_schema: pa.Schema,
    timer_values: TimerValues,
    collector: ArrowOutputCollector,
    stats: RunStats,
) -> Iterator[pa.RecordBatch]:
    """``handleExpiredTimers`` over the due timers ``(expiry, key bytes)``, each key once per call (a key
    with several due timers is in as many successive calls), deleting each call's timers after it."""
    store = session.store
    waves: list[list[tuple[int, bytes]]] = []
    seen: dict[bytes, int] = {}
    for ts, kb in due:
        n = seen.get(kb, 0)
        seen[kb] = n + 1
        if n == len(waves):
            waves.append([])
        waves[n].append((ts, kb))
    for wave in waves:
        # a timer deleted by an earlier call of this batch does not fire
        present = store.multi_get(layout.TIMERS_BY_KEY_CF, [kb + codec.encode_ts(ts) for ts, kb in wave])
        wave = [t for t, p in zip(wave, present, strict=True) if p is not None]
        if not wave:
            continue
        encoded = [kb for _, kb in wave]
        expiry = pa.array([ts for ts, _ in wave], pa.int64())
        timers = ExpiredTimers(session, decode_keys(encoded, key_schema), encoded, expiry)
        _bulk(session, timers)
        try:
            yield from collect(
                proc.handleExpiredTimers(timers, timer_values), collector, "handleExpiredTimers"
            )
        finally:
            session.bulk = None
        for ts, kb in wave:
            delete_timer(store, kb, codec.encode_ts(ts))
        stats.timers_fired += len(wave)
