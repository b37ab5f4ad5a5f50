"""The vectorized processor API (``transform_with_state(api="arrow")``): whole batches, bulk state.

Where the pandas and row APIs call a handler once per grouping key, this one calls it once per
partition and micro-batch with every key of the batch: a :class:`KeyedBatch` holds the input rows
sorted by key with per-key offsets, and state is read and written for all of those keys at once, as
Arrow columns. The keys of the current call are the implicit keys of every state operation, as the
one grouping key is in Spark's API::

    class RunningCount(ArrowStatefulProcessor):
        def init(self, handle):
            self.state = handle.getValueState("state", "count BIGINT, total BIGINT")

        def handleInputBatch(self, batch, timerValues):
            old = self.state.get_many()  # one row per key of the batch; nulls where there is none
            new = batch.aggregate([("value", "count"), ("value", "sum")])
            count = pc.add(pc.fill_null(old["count"], 0), new["value_count"])
            total = pc.add(pc.fill_null(old["total"], 0), new["value_sum"])
            self.state.update_many({"count": count, "total": total})
            yield pa.table({"key": batch.keys["key"], "count": count, "total": total})

State variables are declared in ``init`` with the same handle methods as the other APIs
(``getValueState``, ``getListState``, ``getMapState``, ``deleteIfExists``) and are stored exactly as
they store them, so a checkpoint does not depend on the API that wrote it. Bulk operations:

* value state: ``get_many()`` (a table of the schema), ``exists_many()``, ``update_many(values,
  where=None)``, ``clear_many(where=None)``;
* list state: ``get_many()`` (a ``ListArray`` of structs), ``put_many(lists, where=None)``,
  ``append_many(lists)``, ``clear_many(where=None)``;
* timers: ``handle.registerTimers(expiry_ms)``, ``handle.deleteTimers(expiry_ms)``; due timers reach
  ``handleExpiredTimers(timers, timerValues)`` with an :class:`ExpiredTimers` batch.

``where`` is a boolean mask over the keys (None: all of them). Anything without a bulk form (map state,
``listTimers``) is used per key inside ``for i, key in batch.each():``, which makes each key the
implicit key in turn, so the per-key methods of the other APIs work there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _SparkStatefulProcessor
from pyspark.sql.types import StructType

from blobstate.encoding import codec, layout
from blobstate.encoding.values import EXPIRED, StateRow
from blobstate.errors import ArgumentTypeError
from blobstate.gcpause import gc_paused
from blobstate.processor.api import (
    ListState,
    MapState,
    PartitionSession,
    StatefulProcessorHandle,
    ValueState,
    delete_timer,
    overrides,
    warn_other_api_callback,
)
from blobstate.processor.columnar import ValueColumns, _rows_to_table
from blobstate.processor.errors import ImplicitKeyError, InvalidHandleStateError, StateVariableError
from blobstate.processor.schema import to_arrow

__all__ = [
    "ArrowHandle",
    "ArrowStatefulProcessor",
    "BulkListState",
    "BulkMapState",
    "BulkValueState",
    "ExpiredTimers",
    "KeyedBatch",
]

Columns: TypeAlias = pa.Table | pa.RecordBatch | dict[str, Any]
"""Values for many keys: a table or record batch, or a dict of column name to array (one row per key)."""


class ArrowStatefulProcessor:
    """Base class of a vectorized stateful processor (``transform_with_state(..., api="arrow")``).

    Implement ``init(handle)`` and ``handleInputBatch(batch, timerValues)``; optionally
    ``handleExpiredTimers(timers, timerValues)``, ``handleInitialState(batch, timerValues)`` and
    ``close()``. Handlers that produce output return (or yield) ``pyarrow`` tables or record batches
    whose columns are matched to the output schema by name.
    """

    def init(self, handle: ArrowHandle) -> None:
        """Declare state variables (``handle.getValueState`` ...); called before every batch."""
        raise NotImplementedError

    def handleInputBatch(self, batch: KeyedBatch, timerValues: Any) -> Iterable[pa.Table | pa.RecordBatch]:
        """Process one partition's input of a micro-batch, every key at once."""
        raise NotImplementedError

    def handleExpiredTimers(
        self, timers: ExpiredTimers, timerValues: Any
    ) -> Iterable[pa.Table | pa.RecordBatch]:
        """Handle due timers; each key appears once per call (a key with several due timers is in as
        many successive calls, in expiry order). The fired timers are deleted after the call."""
        return iter(())

    def handleInitialState(self, batch: KeyedBatch, timerValues: Any) -> None:
        """Seed state from the initial state's rows (first batch only), every key at once."""

    def close(self) -> None:
        """Called after every batch."""


def is_arrow_processor(processor: Any) -> bool:
    """Whether ``processor`` is written for the vectorized API (has ``handleInputBatch``)."""
    return callable(getattr(processor, "handleInputBatch", None))


class _Keys:
    """The implicit keys of a bulk call: encoded, and (lazily) as tuples for messages."""

    __slots__ = ("_table", "_tuples", "encoded")

    def __init__(self, table: pa.Table, encoded: list[bytes]) -> None:
        self._table = table
        self.encoded = encoded
        self._tuples: list[StateRow] | None = None

    def tuples(self) -> list[StateRow]:
        if self._tuples is None:
            columns = [c.to_pylist() for c in self._table.columns]
            self._tuples = list(zip(*columns, strict=True))
        return self._tuples


class _KeyedCall:
    """What :class:`KeyedBatch` and :class:`ExpiredTimers` share: the keys, and per-key iteration."""

    def __init__(self, session: PartitionSession, keys: pa.Table, encoded: list[bytes]) -> None:
        self._session = session
        self._keys = _Keys(keys, encoded)
        self.keys = keys
        """One row per key, with the grouping columns."""

    @property
    def num_keys(self) -> int:
        """How many keys this call holds."""
        return int(self.keys.num_rows)

    def __len__(self) -> int:
        return int(self.keys.num_rows)

    def each(self) -> Iterator[tuple[int, StateRow]]:
        """``(i, key)`` for every key in order, with ``key`` the implicit key of state and timer calls
        while the loop body runs: the per-key methods of the other APIs work inside it."""
        session = self._session
        saved = session.bulk
        session.bulk = None
        try:
            for i, (key, kb) in enumerate(zip(self._keys.tuples(), self._keys.encoded, strict=True)):
                session.set_key(key, kb)
                yield i, key
        finally:
            session.set_key(None, None)
            session.bulk = saved


class KeyedBatch(_KeyedCall):
    """One partition's input of a micro-batch, grouped by key.

    ``keys`` has one row per grouping key (ascending, nulls first, as Spark orders its input);
    ``rows`` every input row, sorted by key, so the rows of key ``i`` are
    ``rows.slice(offsets[i], offsets[i + 1] - offsets[i])``.
    """

    def __init__(
        self,
        session: PartitionSession,
        keys: pa.Table,
        encoded: list[bytes],
        rows: pa.Table,
        offsets: np.ndarray,
    ) -> None:
        super().__init__(session, keys, encoded)
        self.rows = rows
        """Every input row (all input columns), sorted by key."""
        self.offsets = offsets
        """int64 array of ``num_keys + 1`` row offsets into ``rows``."""
        self._key_index: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        """How many input rows the batch holds."""
        return int(self.rows.num_rows)

    @property
    def sizes(self) -> np.ndarray:
        """How many rows each key has (int64 array, one per key)."""
        return np.diff(self.offsets)

    @property
    def key_index(self) -> np.ndarray:
        """For every row of ``rows``, the index of its key in ``keys``."""
        if self._key_index is None:
            self._key_index = np.repeat(np.arange(self.num_keys, dtype=np.int64), self.sizes)
        return self._key_index

    def aggregate(self, aggregations: Sequence[tuple[str, str]]) -> pa.Table:
        """Per-key aggregates of ``rows``, one row per key in ``keys`` order: ``[("value", "sum"),
        ("value", "count")]`` gives columns ``value_sum`` and ``value_count`` (pyarrow's hash aggregate
        functions and naming: sum, count, min, max, mean, first, last, list, ...)."""
        group = "__blobstate_key_index"
        columns = {group: pa.array(self.key_index)}
        for column, _ in aggregations:
            columns[column] = self.rows.column(column)
        result = pa.table(columns).group_by(group, use_threads=False).aggregate(list(aggregations))
        order = result.column(f"{group}").to_numpy()
        if not (order == np.arange(len(order))).all():
            result = result.take(np.argsort(order, kind="stable"))
        return result.drop_columns([group])


class ExpiredTimers(_KeyedCall):
    """Timers due in this batch, one per key: ``keys`` and the ``expiry_ms`` of each key's timer."""

    def __init__(
        self, session: PartitionSession, keys: pa.Table, encoded: list[bytes], expiry_ms: pa.Array
    ) -> None:
        super().__init__(session, keys, encoded)
        self.expiry_ms = expiry_ms
        """int64 array: the expiry (ms) of the timer that fired, per key."""


# -- bulk state ------------------------------------------------------------------------------------


def _bulk_keys(session: PartitionSession, what: str, operation: str) -> _Keys:
    """The implicit keys of the current bulk call; ``what`` (e.g. "state variable 'x'") names the target."""
    keys: _Keys | None = session.bulk
    if keys is None:
        raise ImplicitKeyError(
            f"Cannot {operation} {what} in bulk here: bulk operations work on the keys of"
            " handleInputBatch, handleInitialState or handleExpiredTimers (inside batch.each(), use the"
            " per-key methods)"
        )
    return keys


def _as_table(values: Columns, what: str) -> pa.Table:
    if isinstance(values, pa.Table):
        return values
    if isinstance(values, pa.RecordBatch):
        return pa.Table.from_batches([values])
    if isinstance(values, dict):
        return pa.table(
            {k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v) for k, v in values.items()}
        )
    raise StateVariableError(
        f"{what} must be a pyarrow Table, RecordBatch or a dict of columns, not {type(values).__name__}"
    )


def _mask(where: Any, n: int, what: str) -> np.ndarray | None:
    if where is None:
        return None
    if isinstance(where, (pa.Array, pa.ChunkedArray)):
        where = where.fill_null(False).to_numpy(zero_copy_only=False)
    mask = np.asarray(where, dtype=bool)
    if mask.shape != (n,):
        raise StateVariableError(f"where of {what} must be a boolean mask of {n} values (one per key)")
    return mask


def _select(keys: list[bytes], mask: np.ndarray | None) -> list[bytes]:
    if mask is None:
        return keys
    return [k for k, m in zip(keys, mask.tolist(), strict=True) if m]


class _BulkState:
    """What the bulk state variables share: naming, the selected keys, and clearing by key prefix."""

    __slots__ = ()
    _s: PartitionSession
    _name: str

    def _what(self) -> str:
        return f"state variable {self._name!r}"

    def _selected(self, operation: str, where: Any) -> list[bytes]:
        """The current keys (encoded) that ``where`` selects (all without it)."""
        keys = _bulk_keys(self._s, self._what(), operation).encoded
        return _select(keys, _mask(where, len(keys), f"{operation}_many on {self._name!r}"))

    def _clear_prefixes(self, where: Any) -> None:
        for kb in self._selected("clear", where):
            self._clear_prefix(kb)  # type: ignore[attr-defined]


class BulkValueState(_BulkState, ValueState):
    """A value state variable with bulk operations over the current keys (and the per-key ones)."""

    __slots__ = ("_columns",)
    _columns: ValueColumns

    def _value_columns(self) -> ValueColumns:
        try:
            return self._columns
        except AttributeError:
            self._columns = ValueColumns(self._codec, self._schema, to_arrow(self._schema))
            return self._columns

    def get_many(self) -> pa.Table:
        """The value of every current key: a table of the schema, a row of nulls where a key has none."""
        keys = _bulk_keys(self._s, self._what(), "read").encoded
        with gc_paused():
            data = self._s.store.multi_get(self._cf, keys)
            return self._value_columns().decode(data, self._now(), keys)

    def exists_many(self) -> np.ndarray:
        """Whether each current key has a value (that has not expired): a boolean array."""
        keys = _bulk_keys(self._s, self._what(), "read").encoded
        data = self._s.store.multi_get(self._cf, keys)
        if self._ttl is None:
            return np.fromiter((d is not None for d in data), dtype=bool, count=len(data))
        now = self._now()
        expiry = self._codec.expiry
        return np.fromiter(
            (
                d is not None and ((e := expiry(d, k)) is None or now < e)
                for d, k in zip(data, keys, strict=True)
            ),
            dtype=bool,
            count=len(data),
        )

    def update_many(self, values: Columns, where: Any = None) -> None:
        """Set the value of every current key (or of those ``where`` is true) from ``values``: a table or
        dict of columns named as the schema's fields, one row per current key."""
        keys = _bulk_keys(self._s, self._what(), "update")
        table = _as_table(values, f"values for state variable {self._name!r}")
        n = len(keys.encoded)
        if table.num_rows != n:
            raise StateVariableError(
                f"update_many on state variable {self._name!r} got {table.num_rows} rows for {n} keys"
            )
        mask = _mask(where, n, f"update_many on {self._name!r}")
        encoded = keys.encoded
        if mask is not None:
            table = table.filter(pa.array(mask))
            encoded = _select(encoded, mask)
        expiry = self._expiry()
        names = _Lazy(keys, mask)
        with gc_paused():
            data = self._value_columns().encode(table, expiry, names)
        store = self._s.store
        store.put_columns(self._cf, encoded, data)
        if expiry is not None:
            ts8 = codec.encode_ts(expiry)
            store.put_many(self._ttl_cf, [(ts8 + kb, b"") for kb in encoded])

    def clear_many(self, where: Any = None) -> None:
        """Remove the value of every current key (or of those ``where`` is true)."""
        store, cf = self._s.store, self._cf
        for kb in self._selected("clear", where):
            store.delete(cf, kb)


class _Lazy(Sequence[Any]):
    """The grouping keys (as tuples) of the selected rows, built only when an error names one."""

    def __init__(self, keys: _Keys, mask: np.ndarray | None) -> None:
        self._keys = keys
        self._mask = mask

    def _list(self) -> list[StateRow]:
        tuples = self._keys.tuples()
        return tuples if self._mask is None else [t for t, m in zip(tuples, self._mask, strict=True) if m]

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __len__(self) -> int:
        return len(self._list())


class BulkListState(_BulkState, ListState):
    """A list state variable with bulk operations over the current keys (and the per-key ones)."""

    __slots__ = ("_arrow",)
    _arrow: pa.StructType

    def _struct(self) -> pa.StructType:
        try:
            return self._arrow
        except AttributeError:
            self._arrow = pa.struct(list(to_arrow(self._schema)))
            return self._arrow

    def get_many(self) -> pa.ListArray:
        """Every current key's list: a ``ListArray`` of structs of the schema (empty where none)."""
        keys = _bulk_keys(self._s, self._what(), "read").encoded
        now = self._now()
        rows: list[StateRow] = []
        offsets = [0]
        decode = self._codec.decode_live_list
        for kb in keys:
            for _, data in self._live_chunks(kb):
                chunk = decode(data, now, kb)
                if chunk is not EXPIRED:
                    rows.extend(chunk)
            offsets.append(len(rows))
        struct = self._struct()
        table = _rows_to_table(rows, pa.schema(list(struct)))
        values = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(struct))
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)

    def _lists(self, lists: Any, n: int, operation: str) -> list[list[StateRow] | None]:
        if isinstance(lists, pa.ChunkedArray):
            lists = lists.combine_chunks()
        if not isinstance(lists, pa.Array):
            lists = pa.array(lists, type=pa.list_(self._struct()))
        if len(lists) != n:
            raise StateVariableError(
                f"{operation} on list state variable {self._name!r} got {len(lists)} lists for {n} keys"
            )
        names = self._schema.names
        out: list[list[StateRow] | None] = []
        for value in lists.to_pylist():
            if value is None:
                out.append(None)
            else:
                out.append([tuple(e[f] for f in names) if isinstance(e, dict) else tuple(e) for e in value])
        return out

    def put_many(self, lists: Any, where: Any = None) -> None:
        """Replace the list of every current key (or of those ``where`` is true) with ``lists`` (a
        ``ListArray`` of structs, or Python lists of tuples, one per key); an empty or null list clears it."""
        keys = _bulk_keys(self._s, self._what(), "put")
        n = len(keys.encoded)
        mask = _mask(where, n, f"put_many on {self._name!r}")
        for i, (kb, rows) in enumerate(zip(keys.encoded, self._lists(lists, n, "put_many"), strict=True)):
            if mask is not None and not mask[i]:
                continue
            self._clear_prefix(kb)
            if rows:
                self._write_rows(kb, rows, 0, keys, i)

    def append_many(self, lists: Any, where: Any = None) -> None:
        """Append ``lists`` (one per current key; empty or null: nothing) to the current keys' lists."""
        keys = _bulk_keys(self._s, self._what(), "append to")
        n = len(keys.encoded)
        mask = _mask(where, n, f"append_many on {self._name!r}")
        store = self._s.store
        for i, (kb, rows) in enumerate(zip(keys.encoded, self._lists(lists, n, "append_many"), strict=True)):
            if not rows or (mask is not None and not mask[i]):
                continue
            head = store.get(self._cf, kb)
            self._write_rows(kb, rows, 0 if head is None else int.from_bytes(head, "big"), keys, i)

    def _write_rows(self, kb: bytes, rows: list[StateRow], chunk_no: int, keys: _Keys, i: int) -> None:
        try:
            checked = self._rows(rows, "write")
            self._write_chunk(kb, checked, chunk_no)
        except StateVariableError as e:
            e.add_note(f"(the list for grouping key {keys.tuples()[i]!r})")
            raise

    def clear_many(self, where: Any = None) -> None:
        """Remove the list of every current key (or of those ``where`` is true)."""
        self._clear_prefixes(where)


class BulkMapState(_BulkState, MapState):
    """A map state variable; per key inside ``batch.each()``, plus ``clear_many``."""

    __slots__ = ()

    def clear_many(self, where: Any = None) -> None:
        """Remove the whole map of every current key (or of those ``where`` is true)."""
        self._clear_prefixes(where)


class ArrowHandle(StatefulProcessorHandle):
    """The handle of the vectorized API: declares state (as the other APIs), bulk timers."""

    _value_state = BulkValueState
    _list_state = BulkListState
    _map_state = BulkMapState

    # The variables are made by the classes above: these only tell the type checker so.
    def getValueState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> BulkValueState:
        """Create (or reopen) a value state variable with bulk operations; call only in ``init``."""
        return cast(BulkValueState, super().getValueState(stateName, schema, ttlDurationMs))

    def getListState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> BulkListState:
        """Create (or reopen) a list state variable with bulk operations; call only in ``init``."""
        return cast(BulkListState, super().getListState(stateName, schema, ttlDurationMs))

    def getMapState(
        self,
        stateName: str,
        userKeySchema: StructType | str,
        valueSchema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> BulkMapState:
        """Create (or reopen) a map state variable with bulk operations; call only in ``init``."""
        return cast(BulkMapState, super().getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs))

    def _bulk_timer_keys(self, operation: str) -> list[bytes]:
        s = self._s
        if s.bulk is None and s.key_bytes is not None:
            raise InvalidHandleStateError(
                f"Cannot perform {operation} inside batch.each(): use registerTimer/deleteTimer there"
            )
        self._check_timers(operation)
        return _bulk_keys(s, "timers", operation).encoded

    def _timestamps(self, expiry_ms: Any, n: int, operation: str) -> list[int | None]:
        if isinstance(expiry_ms, (int, np.integer)):
            return [int(expiry_ms)] * n
        if isinstance(expiry_ms, pa.ChunkedArray):
            expiry_ms = expiry_ms.combine_chunks()
        values = (
            expiry_ms.to_pylist() if isinstance(expiry_ms, pa.Array) else list(np.asarray(expiry_ms).tolist())
        )
        if len(values) != n:
            raise StateVariableError(f"{operation} got {len(values)} timestamps for {n} keys")
        for v in values:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise StateVariableError(f"{operation} needs int timestamps in milliseconds, not {v!r}")
        return values

    def registerTimers(self, expiryTimestampsMs: Any, where: Any = None) -> None:
        """Register a timer for every current key (or those ``where`` is true) at its expiry in
        ``expiryTimestampsMs`` (an int for all, or one per key; null: none); existing ones are kept."""
        keys = self._bulk_timer_keys("registerTimers")
        stamps = self._timestamps(expiryTimestampsMs, len(keys), "registerTimers")
        mask = _mask(where, len(keys), "registerTimers")
        wanted = [
            (kb, codec.encode_ts(ts))
            for i, (kb, ts) in enumerate(zip(keys, stamps, strict=True))
            if ts is not None and (mask is None or mask[i])
        ]
        store = self._s.store
        present = store.multi_get(layout.TIMERS_BY_KEY_CF, [kb + ts8 for kb, ts8 in wanted])
        new = [(kb, ts8) for (kb, ts8), p in zip(wanted, present, strict=True) if p is None]
        store.put_many(layout.TIMERS_BY_KEY_CF, [(kb + ts8, b"") for kb, ts8 in new])
        store.put_many(layout.TIMERS_CF, [(ts8 + kb, b"") for kb, ts8 in new])

    def deleteTimers(self, expiryTimestampsMs: Any, where: Any = None) -> None:
        """Delete each current key's timer at its expiry in ``expiryTimestampsMs`` (null: none)."""
        keys = self._bulk_timer_keys("deleteTimers")
        stamps = self._timestamps(expiryTimestampsMs, len(keys), "deleteTimers")
        mask = _mask(where, len(keys), "deleteTimers")
        store = self._s.store
        for i, (kb, ts) in enumerate(zip(keys, stamps, strict=True)):
            if ts is not None and (mask is None or mask[i]):
                delete_timer(store, kb, codec.encode_ts(ts))


def check_api(processor: Any, api: str) -> None:
    """Refuse a processor written for another API than ``api`` (``arrow``, or a per-key one), and warn
    (:class:`~blobstate.processor.api.CallbackNameWarning`) about a timer callback under the other
    API's name. Runs when a query starts and before a partition's ``init``."""
    if api == "arrow":
        check_arrow_processor(processor)
        if overrides(processor, "handleExpiredTimer", object) and not overrides(
            processor, "handleExpiredTimers", ArrowStatefulProcessor
        ):
            warn_other_api_callback(processor, "handleExpiredTimer", "handleExpiredTimers")
        return
    if is_arrow_processor(processor) and not callable(getattr(processor, "handleInputRows", None)):
        raise ArgumentTypeError(
            f"{type(processor).__name__} is a vectorized processor (handleInputBatch):"
            " run it with api='arrow'"
        )
    # A per-key processor (api='pandas' or 'row') whose timer callback has the vectorized API's name.
    if overrides(processor, "handleExpiredTimers", ArrowStatefulProcessor) and not overrides(
        processor, "handleExpiredTimer", _SparkStatefulProcessor
    ):
        warn_other_api_callback(processor, "handleExpiredTimers", "handleExpiredTimer")


def check_arrow_processor(processor: Any) -> None:
    """Refuse a processor that the vectorized API cannot run, naming what it lacks."""
    for method in ("init", "handleInputBatch"):
        if not callable(getattr(processor, method, None)):
            raise ArgumentTypeError(
                f"api='arrow' needs an ArrowStatefulProcessor (with init and handleInputBatch), not"
                f" {type(processor).__name__}"
            )
