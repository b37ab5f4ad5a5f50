"""Run a stateful processor over one partition's input for one micro-batch, engine-independently.

The order is Spark's ``transformWithStateInPandas``: ``init(handle)``; in the first batch only,
``handleInitialState`` for every key of the initial state; ``handleInputRows`` once per key of
the input (keys in ascending order, nulls first); then ``handleExpiredTimer`` for every timer due
(processing time: expiry <= batch timestamp; event time: expiry <= watermark), in (expiry, key)
order, deleting each timer after its handler ran; then expired TTL state is swept; then
``close()``. With time mode EventTime, input rows whose event time is at or before the
late-events watermark are dropped first, as Spark drops late data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _SparkStatefulProcessor

from blobstate import defaults
from blobstate.batch.contracts import RunSpec
from blobstate.encoding import codec, layout
from blobstate.encoding.codec import Key
from blobstate.processor import arrow_runner, grouping
from blobstate.processor import rows as row_api
from blobstate.processor.api import (
    ExpiredTimerInfo,
    PartitionSession,
    StatefulProcessorHandle,
    StatefulProcessorHandleState,
    delete_timer,
    normalize_time_mode,
)
from blobstate.processor.arrow_api import (
    ArrowHandle,
    ArrowStatefulProcessor,
    check_api,
)
from blobstate.processor.errors import InvalidTimeModeError, OutputSchemaError, StatefulProcessorError
from blobstate.processor.output import OutputCollector
from blobstate.processor.schema import to_arrow, to_struct_type
from blobstate.state.interface import KeyValueStore

InputData: TypeAlias = pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch] | None

OUTPUT_MODES = {m.lower(): m for m in defaults.OUTPUT_MODES}

APIS = defaults.APIS


@dataclass
class RunStats:
    """What one :func:`run_partition` call did; pass an instance in to have it filled."""

    input_rows: int = 0
    late_rows_dropped: int = 0
    keys: int = 0
    initial_state_keys: int = 0
    timers_fired: int = 0
    ttl_values_removed: int = 0
    output_rows: int = 0
    max_event_time_ms: int | None = None
    seconds: float = 0.0


def _normalize_output_mode(output_mode: str) -> str:
    mode = output_mode.lower() if isinstance(output_mode, str) else None
    if mode == "complete":
        raise StatefulProcessorError(
            "Complete output mode is not supported by transformWithState; use 'Append' or 'Update'"
        )
    if mode not in OUTPUT_MODES:
        raise StatefulProcessorError(f"Invalid output mode {output_mode!r}: use 'Append' or 'Update'")
    return OUTPUT_MODES[mode]


def _processor_instance(processor: Any, api: str = "pandas") -> Any:
    if not isinstance(processor, (_SparkStatefulProcessor, ArrowStatefulProcessor)) and callable(processor):
        processor = processor()
    check_api(processor, api)
    if api == "arrow":
        return processor
    for method in ("init", "handleInputRows"):
        if not callable(getattr(processor, method, None)):
            raise TypeError(
                f"processor must be a StatefulProcessor (with init and handleInputRows), not"
                f" {type(processor).__name__}"
            )
    return processor


def _check_mode_unchanged(store: KeyValueStore, key: bytes, value: str, what: str) -> None:
    old = store.get(layout.META_CF, key)
    if old is None:
        store.put(layout.META_CF, key, value.encode())
    elif old.decode() != value:
        raise StatefulProcessorError(
            f"The {what} of this state changed from {old.decode()} to {value} between query restarts;"
            f" restart with {what} {old.decode()} or from a new checkpoint"
        )


@dataclass(frozen=True)
class RunInputs:
    """What a :func:`run_partition` call reads besides the batch's rows: ``initial_state`` (first batch
    only) holds rows for ``handleInitialState``, keyed by ``RunSpec.initial_state_key_columns``;
    ``adjuncts`` are the read-only adjunct stores by name (``handle.getAdjunct``), already at this
    batch's version."""

    initial_state: InputData = None
    adjuncts: Mapping[str, Any] = field(default_factory=dict)


def run_partition(
    processor: Any,
    store: KeyValueStore,
    data: InputData,
    run: RunSpec,
    inputs: RunInputs | None = None,
    stats: RunStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run ``processor`` over one partition's rows for one micro-batch; yield its output batches.

    ``processor`` is a StatefulProcessor instance (or a zero-argument factory of one); ``store``
    the partition's open :class:`~blobstate.state.store.RocksStateStore`; ``data`` this batch's
    rows of the partition (a Table, a RecordBatch or an iterable of RecordBatches, all rows of a
    key together in this call). ``run`` says how (:class:`~blobstate.batch.contracts.RunSpec`: key
    columns, output schema, time and output modes as in Spark, ``api``, the batch's timestamp and
    watermarks); ``inputs`` the initial state and the adjunct stores (:class:`RunInputs`); ``stats``
    receives the run's counters (among them the input's largest event time). ``api`` is ``pandas``
    (handlers get and yield pandas DataFrames, as ``transformWithStateInPandas``), ``row``
    (``pyspark.sql.Row`` objects, as the row-based ``transformWithState``; see
    :mod:`blobstate.processor.rows`) or ``arrow`` (:mod:`blobstate.processor.arrow_api`).

    Arguments are checked at once; the work happens while the returned iterator is consumed, and
    the store holds this batch's complete state changes only once it is exhausted.
    """
    api = run.api
    if api not in APIS:
        raise ValueError(
            f"api must be one of {APIS} (pandas: transformWithStateInPandas; row:"
            f" transformWithState; arrow: vectorized), not {api!r}"
        )
    proc = _processor_instance(processor, api)
    mode = normalize_time_mode(run.time_mode)
    out_mode = _normalize_output_mode(run.output_mode)
    keys = run.key_columns
    if not keys:
        raise ValueError("key_columns must name at least one grouping column")
    init_keys = keys if run.initial_state_key_columns is None else run.initial_state_key_columns
    if len(init_keys) != len(keys):
        raise ValueError(
            f"initial_state_key_columns {list(init_keys)} must have as many columns as key_columns"
            f" {list(keys)}"
        )
    if mode == "ProcessingTime" and run.batch_timestamp_ms is None:
        raise InvalidTimeModeError("time mode ProcessingTime needs batch_timestamp_ms")
    if mode == "EventTime" and run.watermark_ms is None:
        raise InvalidTimeModeError(
            "time mode EventTime needs watermark_ms (the query must define a watermark; Spark starts at 0)"
        )
    output_schema, timezone, flush_rows = run.output_schema, run.timezone, run.flush_rows
    schema = to_struct_type(output_schema, what="output_schema")
    arrow_schema = output_schema if isinstance(output_schema, pa.Schema) else to_arrow(schema, timezone)
    collector: OutputCollector | row_api.RowOutputCollector | arrow_runner.ArrowOutputCollector
    if api == "arrow":
        not_null = [f.name for f in schema.fields if not f.nullable]
        collector = arrow_runner.ArrowOutputCollector(arrow_schema, not_null=not_null, flush_rows=flush_rows)
    elif api == "row":
        collector = row_api.RowOutputCollector(arrow_schema, schema=schema, flush_rows=flush_rows)
    else:
        collector = OutputCollector(schema, arrow_schema, timezone=timezone, flush_rows=flush_rows)
    checked = replace(
        run,
        time_mode=mode,
        output_mode=out_mode,
        initial_state_key_columns=init_keys,
        late_watermark_ms=run.watermark_ms if run.late_watermark_ms is None else run.late_watermark_ms,
    )
    return _run(proc, store, data, checked, inputs or RunInputs(), _Sinks(collector, stats or RunStats()))


@dataclass(frozen=True)
class _Sinks:
    """Where a run's outputs and counters go."""

    collector: Any
    stats: RunStats


def _collect(result: Any, collector: Any, source: str, key: Any = None) -> None:
    what = collector.items
    if result is None:
        raise StatefulProcessorError(
            f"{source} returned None; it must return an iterator of {what} (use `yield`, or"
            " `return iter([])` for no output)"
        )
    if (
        isinstance(result, (str, bytes, tuple))
        or not hasattr(result, "__iter__")
        or hasattr(result, "columns")
    ):
        raise StatefulProcessorError(
            f"{source} returned a {type(result).__name__}; it must return an iterator of {what}"
            f" (yield each of them)"
        )
    try:
        for frame in result:
            collector.add(frame, source, key)
    except OutputSchemaError:  # its message names the handler and the key
        raise
    except Exception as e:  # raised while the handler runs (it runs as it yields)
        e.add_note(f"(in {source} for grouping key {key!r})")
        raise


def _call(method: Callable[..., Any], name: str, key: Any, *args: Any) -> Any:
    try:
        return method(key, *args)
    except Exception as e:
        e.add_note(f"(in {name} for grouping key {key!r})")
        raise


def _run(
    proc: Any, store: KeyValueStore, data: InputData, run: RunSpec, inputs: RunInputs, sinks: _Sinks
) -> Iterator[pa.RecordBatch]:
    keys, init_keys = list(run.key_columns), list(run.initial_state_key_columns or run.key_columns)
    time_mode, output_mode, api, timezone = run.time_mode, run.output_mode, run.api, run.timezone
    batch_timestamp_ms, watermark_ms = run.batch_timestamp_ms, run.watermark_ms
    late_watermark_ms, event_time_column = run.late_watermark_ms, run.event_time_column
    max_rows, collector, stats = run.max_rows_per_frame, sinks.collector, sinks.stats
    started = time.perf_counter()
    table = grouping.to_table(data)
    if table is not None:
        grouping.check_columns(table, keys, "key")
        stats.input_rows = table.num_rows
        if event_time_column is not None:
            grouping.check_columns(table, [event_time_column], "event time")
            micros = grouping.event_time_micros(table.column(event_time_column), event_time_column)
            stats.max_event_time_ms = grouping.max_event_time_ms(micros)
            if time_mode == "EventTime" and late_watermark_ms is not None:
                table, stats.late_rows_dropped = grouping.drop_late_rows(table, micros, late_watermark_ms)

    session = PartitionSession(store, time_mode, batch_timestamp_ms, watermark_ms)
    session.adjuncts = dict(inputs.adjuncts)
    _check_mode_unchanged(store, layout.TIME_MODE_KEY, time_mode, "time mode")
    _check_mode_unchanged(store, b"outputMode", output_mode, "output mode")
    handle = ArrowHandle(session) if api == "arrow" else StatefulProcessorHandle(session)
    proc.init(handle)
    session.phase = StatefulProcessorHandleState.INITIALIZED
    timer_values = session.timer_values()

    init_table = grouping.to_table(inputs.initial_state)
    if init_table is not None:
        grouping.check_columns(init_table, init_keys, "initial state key")
    if init_table is not None and api == "arrow":
        arrow_runner.initial_state(proc, session, init_table, init_keys, timer_values, stats)
    elif init_table is not None:
        handler = proc.handleInitialState
        init_groups = _group(init_table, init_keys, api, timezone, max_rows)
        for i, key in enumerate(init_groups.keys):
            session.set_key(key, init_groups.key_bytes[i])
            # pandas: one call per frame of the key's rows; row: one call per row (as Spark's workers)
            for initial in init_groups.rows(i):
                _call(handler, "handleInitialState", key, initial, timer_values)
        stats.initial_state_keys = len(init_groups)

    if table is not None and table.num_rows and api == "arrow":
        yield from arrow_runner.input_batch(proc, session, table, keys, timer_values, collector, stats)
    elif table is not None and table.num_rows:
        groups = _group(table, keys, api, timezone, max_rows)
        handler = proc.handleInputRows
        key_bytes, rows_of = groups.key_bytes, groups.rows
        for i, key in enumerate(groups.keys):
            session.key = key
            session.key_bytes = key_bytes[i]
            result = _call(handler, "handleInputRows", key, rows_of(i), timer_values)
            _collect(result, collector, "handleInputRows", key)
            if collector.ready:
                yield _flushed(collector)
        stats.keys = len(groups)
    session.set_key(None, None)

    session.phase = StatefulProcessorHandleState.DATA_PROCESSED
    threshold = batch_timestamp_ms if time_mode == "ProcessingTime" else watermark_ms
    if time_mode != "None" and api == "arrow":
        due = _due_timers(store, threshold)  # type: ignore[arg-type]
        if due:
            key_schema = table.select(keys).schema if table is not None else keys
            yield from arrow_runner.expired_timers(
                proc, session, due, key_schema, timer_values, collector, stats
            )
    elif time_mode != "None":
        arity = len(keys)
        for ts, kb in _due_timers(store, threshold):  # type: ignore[arg-type]
            ts8 = codec.encode_ts(ts)
            if store.get(layout.TIMERS_BY_KEY_CF, kb + ts8) is None:
                continue  # deleted by an earlier handler in this batch
            key = _handler_key(codec.decode_key(kb, arity)[0], run.instant_keys, api, timezone)
            session.set_key(key, kb)
            info = ExpiredTimerInfo(ts)
            result = _call(proc.handleExpiredTimer, "handleExpiredTimer", key, timer_values, info)
            _collect(result, collector, "handleExpiredTimer", key)
            delete_timer(store, kb, ts8)
            stats.timers_fired += 1
            if collector.ready:
                yield _flushed(collector)
        session.set_key(None, None)
    session.phase = StatefulProcessorHandleState.TIMER_PROCESSED

    if session.ttl_vars:
        stats.ttl_values_removed = _sweep_ttl(session)
    proc.close()
    session.phase = StatefulProcessorHandleState.CLOSED
    last = collector.flush()
    if last is not None:
        yield last
    stats.output_rows = collector.total_rows
    stats.seconds = time.perf_counter() - started


def _handler_key(key: Key, instant_keys: tuple[int, ...], api: str, timezone: str) -> Key:
    """A decoded grouping key as handlers get it from the input: each TIMESTAMP (an instant, stored by its
    UTC reading) as a naive time of ``timezone`` (pandas, as Spark's worker hands it) or an aware one
    (rows, as Arrow's ``as_py`` gives it)."""
    if not instant_keys:
        return key
    out = list(key)
    for i in instant_keys:
        value = out[i]
        if value is None or isinstance(value, tuple):  # a struct holding a TIMESTAMP: kept as stored
            continue
        ts = pd.Timestamp(value)
        local = (ts.tz_localize("UTC") if ts.tz is None else ts).tz_convert(timezone)
        out[i] = local.to_pydatetime() if api == "row" else local.tz_localize(None)
    return tuple(out)


def _group(
    table: pa.Table, key_columns: list[str], api: str, timezone: str, max_rows: int
) -> grouping.Groups | row_api.RowGroups:
    """``table``'s rows grouped by key in the form ``api`` hands them to handlers (``.rows(i)``)."""
    if api == "row":
        return row_api.group_rows_by_key(table, key_columns)
    return grouping.group_by_key(table, key_columns, timezone, max_rows)


def _flushed(collector: Any) -> pa.RecordBatch:
    batch = collector.flush()
    assert batch is not None
    return batch


def _due_timers(store: KeyValueStore, threshold: int) -> list[tuple[int, bytes]]:
    """All registered timers with expiry <= ``threshold``, in (expiry, key) order, read before firing."""
    due = []
    for k, _ in store.items(layout.TIMERS_CF):
        ts = codec.decode_ts(k)
        if ts > threshold:
            break
        due.append((ts, bytes(k[8:])))
    return due


def _sweep_ttl(session: PartitionSession) -> int:
    """Remove every value whose TTL expired by the batch timestamp; returns how many."""
    store = session.store
    now = session.batch_timestamp_ms
    assert now is not None
    removed = 0
    for state in session.ttl_vars:
        due = []
        for k, _ in store.items(state._ttl_cf):
            if codec.decode_ts(k) > now:
                break
            due.append(k)
        for k in due:
            removed += state.expire(bytes(k[8:]), now)
            store.delete(state._ttl_cf, k)
    return removed
