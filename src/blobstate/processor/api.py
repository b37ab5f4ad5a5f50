"""PySpark's ``transformWithStateInPandas`` processor API, backed by a local RocksDB store.

Same class, method and argument names as ``pyspark.sql.streaming.stateful_processor`` (4.3.0), so
a processor written for Spark runs here with only its import changed. The lifecycle rules are
Spark's: state variables are declared (and deleted) only in ``init``; state is read and written
only for the current grouping key (in ``handleInputRows``, ``handleInitialState`` and
``handleExpiredTimer``); timers need time mode ``ProcessingTime`` or ``EventTime``; TTL needs
``ProcessingTime`` and is measured against the batch timestamp.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any, cast

from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _SparkStatefulProcessor
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorHandleState
from pyspark.sql.types import Row, StructType

from blobstate import defaults
from blobstate.encoding import codec, layout
from blobstate.encoding.codec import Key
from blobstate.encoding.values import EXPIRED, StateCodec, StateRow, storage_signature
from blobstate.processor.errors import (
    ImplicitKeyError,
    InvalidHandleStateError,
    InvalidTimeModeError,
    StatefulProcessorError,
    StateVariableError,
)
from blobstate.processor.schema import to_struct_type
from blobstate.state.interface import KeyValueStore
from blobstate.stored_schema import parse_declaration

__all__ = [
    "CallbackNameWarning",
    "ExpiredTimerInfo",
    "ListState",
    "MapState",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "StatefulProcessorHandleState",
    "TimerValues",
    "ValueState",
]

TIME_MODES = {m.lower(): m for m in defaults.TIME_MODES}

log = logging.getLogger(__name__)


class CallbackNameWarning(UserWarning):
    """A processor defines a callback under the other processor API's name, which its API never calls."""


# Keyed by the class's module and qualified name, not the class object: a Python worker unpickles a
# class defined in the driver's __main__ anew for every task, so one class reaches a worker as many objects.
_LOGGED: set[tuple[str, str, str]] = set()
_LOGGED_LOCK = threading.Lock()


def overrides(processor: Any, name: str, base: type) -> bool:
    """Whether ``processor``'s class defines ``name`` itself rather than taking ``base``'s default."""
    attr = getattr(type(processor), name, None)
    return callable(attr) and attr is not getattr(base, name, None)


def warn_other_api_callback(processor: Any, defined: str, called: str) -> None:
    """Warn (``warnings.warn`` and a log line, once per class and process) that ``processor`` defines
    ``defined``, the other API's name, while its API calls ``called``, which it does not define."""
    cls = type(processor)
    with _LOGGED_LOCK:
        if (cls.__module__, cls.__qualname__, defined) in _LOGGED:
            return
        _LOGGED.add((cls.__module__, cls.__qualname__, defined))
    message = (
        f"{cls.__qualname__} defines {defined}, which this processor API never calls: its timers call "
        f"{called}, which {cls.__qualname__} does not define, so they fire and are deleted without running "
        f"its code; rename {defined} to {called}"
    )
    warnings.warn(message, CallbackNameWarning, stacklevel=3)
    log.warning("%s", message)


def normalize_time_mode(time_mode: str) -> str:
    """Spark's spelling (``None``, ``ProcessingTime``, ``EventTime``) of a case-insensitive time mode."""
    if not isinstance(time_mode, str) or time_mode.lower() not in TIME_MODES:
        raise InvalidTimeModeError(
            f"Unsupported time mode {time_mode!r}: use 'None', 'ProcessingTime' or 'EventTime'"
        )
    return TIME_MODES[time_mode.lower()]


class StatefulProcessor(_SparkStatefulProcessor):
    """Base class of a user's stateful logic; the same abstract class as PySpark's.

    Implement ``init(handle)`` and ``handleInputRows(key, rows, timerValues)``; optionally
    ``handleExpiredTimer(key, timerValues, expiredTimerInfo)``, ``handleInitialState(key,
    initialState, timerValues)`` and ``close()``. ``key`` is a tuple of the grouping column values,
    ``rows`` an iterator of pandas DataFrames, and the handlers return (or yield) pandas
    DataFrames whose columns match the output schema. Processors that subclass PySpark's own
    ``StatefulProcessor`` are accepted too.
    """


class PartitionSession:
    """What the handle and its state variables share for one partition and one batch: the store, the time
    mode and clocks, the current grouping key and the declared variables. The runners make one per
    partition and batch; a processor never sees it."""

    __slots__ = (
        "adjuncts",
        "batch_timestamp_ms",
        "bulk",
        "declared",
        "key",
        "key_bytes",
        "phase",
        "store",
        "time_mode",
        "timers_enabled",
        "ttl_vars",
        "watermark_ms",
    )

    def __init__(
        self, store: KeyValueStore, time_mode: str, batch_timestamp_ms: int | None, watermark_ms: int | None
    ) -> None:
        self.store = store
        self.time_mode = normalize_time_mode(time_mode)
        self.timers_enabled = self.time_mode != "None"
        self.batch_timestamp_ms = batch_timestamp_ms
        self.watermark_ms = watermark_ms
        self.phase = StatefulProcessorHandleState.CREATED
        self.key: Key | None = None
        self.key_bytes: bytes | None = None
        self.declared: dict[str, _StateBase] = {}
        self.ttl_vars: list[_StateBase] = []
        self.adjuncts: dict[str, Any] = {}
        """The adjunct stores of the query by name (read-only views at the batch's version)."""
        self.bulk: Any = None
        """The implicit keys of a bulk (``api="arrow"``) handler call, or None."""

    def timer_values(self) -> TimerValues:
        """The TimerValues Spark passes to handlers: -1 for both in time mode None."""
        if self.time_mode == "None":
            return TimerValues(-1, -1)
        batch = -1 if self.batch_timestamp_ms is None else self.batch_timestamp_ms
        watermark = -1 if self.watermark_ms is None else self.watermark_ms
        return TimerValues(batch, watermark)

    def set_key(self, key: Key | None, key_bytes: bytes | None) -> None:
        """Make ``key`` the implicit grouping key of state operations (None: no key)."""
        self.key = key
        self.key_bytes = key_bytes


def _missing_key(state_name: str, operation: str) -> ImplicitKeyError:
    return ImplicitKeyError(
        f"Cannot {operation} state variable {state_name!r}: no grouping key is set. State can only be"
        " used inside handleInputRows, handleInitialState or handleExpiredTimer, not in init or close."
    )


def _as_row(value: Any, schema: StructType, state_name: str, what: str) -> StateRow:
    """One value (tuple, list, Row or dict) as a tuple of ``schema``'s arity (the codec checks types)."""
    if value is None:
        raise StateVariableError(f"Cannot write a null {what} to state variable {state_name!r}")
    if isinstance(value, dict):
        missing = [n for n in schema.names if n not in value]
        if missing:
            raise StateVariableError(
                f"{what} for state variable {state_name!r} lacks field(s) {missing}; schema is"
                f" {schema.simpleString()}"
            )
        value = tuple(value[n] for n in schema.names)
    elif not isinstance(value, (tuple, list)):
        raise StateVariableError(
            f"{what} for state variable {state_name!r} must be a tuple matching {schema.simpleString()},"
            f" not {type(value).__name__} ({value!r}); e.g. write (x,) for a single field"
        )
    if len(value) != len(schema.fields):
        raise StateVariableError(
            f"{what} {tuple(value)!r} for state variable {state_name!r} has {len(value)} field(s) but the"
            f" schema {schema.simpleString()} has {len(schema.fields)}"
        )
    return tuple(value)


class _StateBase:
    """Shared plumbing of the three state variable kinds."""

    __slots__ = ("_cf", "_codec", "_name", "_s", "_ttl", "_ttl_cf")
    kind = ""

    def __init__(self, session: PartitionSession, state_name: str, ttl_duration_ms: int | None) -> None:
        self._s = session
        self._name = state_name
        self._cf = layout.state_cf(state_name)
        self._ttl = ttl_duration_ms
        self._ttl_cf = layout.ttl_cf(state_name)

    def _kb(self, operation: str) -> bytes:
        kb = self._s.key_bytes
        if kb is None:
            raise _missing_key(self._name, operation)
        return kb

    def _expiry(self) -> int | None:
        if self._ttl is None:
            return None
        return self._s.batch_timestamp_ms + self._ttl  # type: ignore[operator]

    def _now(self) -> int:
        ts = self._s.batch_timestamp_ms
        return -1 if ts is None else ts

    def _index_ttl(self, expiry: int | None, target: bytes) -> None:
        if expiry is not None:
            self._s.store.put(self._ttl_cf, codec.encode_ts(expiry) + target, b"")

    def _clear_prefix(self, prefix: bytes) -> None:
        store = self._s.store
        cf = self._cf
        for k in [k for k, _ in store.items(cf, prefix)]:
            store.delete(cf, k)

    def expire(self, target: bytes, now: int) -> int:
        """Remove what expired at ``target`` (a key from the TTL index); returns values removed."""
        raise NotImplementedError


class ValueState(_StateBase):
    """A single value (a tuple) per grouping key."""

    __slots__ = ("_schema",)
    kind = "value"

    def __init__(
        self, session: PartitionSession, state_name: str, schema: StructType, ttl_duration_ms: int | None
    ) -> None:
        super().__init__(session, state_name, ttl_duration_ms)
        self._schema = schema
        self._codec = StateCodec(state_name, schema)

    def exists(self) -> bool:
        """Whether state exists (and has not expired) for the current grouping key."""
        data = self._s.store.get(self._cf, self._kb("read"))
        if data is None:
            return False
        expiry = self._codec.expiry(data, self._s.key)
        return expiry is None or self._now() < expiry

    def get(self) -> StateRow | None:
        """The value for the current grouping key, or None if there is none (or it expired)."""
        data = self._s.store.get(self._cf, self._kb("read"))
        if data is None:
            return None
        value: StateRow = self._codec.decode_live(data, self._now(), self._s.key)
        if value is EXPIRED:
            return None
        return value

    def update(self, newValue: StateRow) -> None:
        """Set the value for the current grouping key (restarting its TTL)."""
        kb = self._kb("update")
        row = _as_row(newValue, self._schema, self._name, "value")
        expiry = self._expiry()
        self._s.store.put(self._cf, kb, self._codec.encode(row, expiry))
        self._index_ttl(expiry, kb)

    def clear(self) -> None:
        """Remove the value of the current grouping key."""
        self._s.store.delete(self._cf, self._kb("clear"))

    def expire(self, target: bytes, now: int) -> int:
        """Delete the value at ``target`` if it has expired."""
        store = self._s.store
        data = store.get(self._cf, target)
        if data is not None:
            expiry = self._codec.expiry(data, target)
            if expiry is not None and now >= expiry:
                store.delete(self._cf, target)
                return 1
        return 0


_HEAD_START = (0).to_bytes(8, "big")


class ListState(_StateBase):
    """A list of values (tuples) per grouping key.

    Stored as a head entry (``kb`` -> next chunk number) plus one chunk per write call
    (``kb + be64(n)`` -> the values written by that call), so appends never rewrite the list.
    """

    __slots__ = ("_schema",)
    kind = "list"

    def __init__(
        self, session: PartitionSession, state_name: str, schema: StructType, ttl_duration_ms: int | None
    ) -> None:
        super().__init__(session, state_name, ttl_duration_ms)
        self._schema = schema
        self._codec = StateCodec(state_name, schema)

    def _rows(self, values: Any, operation: str) -> list[StateRow]:
        if values is None:
            raise StateVariableError(f"Cannot {operation} a null list to state variable {self._name!r}")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise StateVariableError(
                f"{operation} on list state variable {self._name!r} needs a list of tuples, not"
                f" {type(values).__name__}"
            )
        rows = [_as_row(v, self._schema, self._name, "list element") for v in values]
        if not rows:
            raise StateVariableError(
                f"Cannot {operation} an empty list to state variable {self._name!r} (Spark rejects empty"
                " lists; use clear() to remove the state)"
            )
        return rows

    def _live_chunks(self, kb: bytes) -> Iterator[tuple[bytes, bytes]]:
        n = len(kb)
        for k, v in self._s.store.items(self._cf, kb):
            if len(k) != n:
                yield k, v

    def exists(self) -> bool:
        """Whether the list of the current grouping key has (unexpired) values."""
        kb = self._kb("read")
        if self._ttl is None:
            return self._s.store.get(self._cf, kb) is not None
        return next(self.get(), None) is not None

    def get(self) -> Iterator[StateRow]:
        """An iterator over the values of the current grouping key (empty if none)."""
        kb = self._kb("read")
        now = self._now()
        out: list[StateRow] = []
        key = self._s.key
        for _, data in self._live_chunks(kb):
            chunk = self._codec.decode_live_list(data, now, key)
            if chunk is not EXPIRED:
                out.extend(chunk)
        return iter(out)

    def _write_chunk(self, kb: bytes, rows: list[StateRow], chunk_no: int) -> None:
        expiry = self._expiry()
        store = self._s.store
        store.put(self._cf, kb + chunk_no.to_bytes(8, "big"), self._codec.encode_list(rows, expiry))
        store.put(self._cf, kb, (chunk_no + 1).to_bytes(8, "big"))
        self._index_ttl(expiry, kb)

    def put(self, newState: list[StateRow]) -> None:
        """Replace the list of the current grouping key."""
        kb = self._kb("put")
        rows = self._rows(newState, "put")
        self._clear_prefix(kb)
        self._write_chunk(kb, rows, 0)

    def appendValue(self, newState: StateRow) -> None:
        """Append one value to the list of the current grouping key."""
        kb = self._kb("append to")
        row = _as_row(newState, self._schema, self._name, "list element")
        head = self._s.store.get(self._cf, kb)
        self._write_chunk(kb, [row], 0 if head is None else int.from_bytes(head, "big"))

    def appendList(self, newState: list[StateRow]) -> None:
        """Append several values to the list of the current grouping key."""
        kb = self._kb("append to")
        rows = self._rows(newState, "append")
        head = self._s.store.get(self._cf, kb)
        self._write_chunk(kb, rows, 0 if head is None else int.from_bytes(head, "big"))

    def clear(self) -> None:
        """Remove the list of the current grouping key."""
        self._clear_prefix(self._kb("clear"))

    def expire(self, target: bytes, now: int) -> int:
        """Drop the expired chunks of the list at ``target``; drop the list when none remain."""
        store = self._s.store
        removed = 0
        live = 0
        for k, data in list(self._live_chunks(target)):
            expiry = self._codec.expiry(data, k)
            if expiry is not None and now >= expiry:
                removed += self._codec.list_length(data, k)
                store.delete(self._cf, k)
            else:
                live += 1
        if removed and not live:
            store.delete(self._cf, target)
        return removed


class MapState(_StateBase):
    """A map from user keys (tuples) to values (tuples) per grouping key."""

    __slots__ = ("_key_arity", "_key_codec", "_key_schema", "_row_type", "_value_schema")
    kind = "map"

    def __init__(
        self,
        session: PartitionSession,
        state_name: str,
        user_key_schema: StructType,
        value_schema: StructType,
        ttl_duration_ms: int | None,
    ) -> None:
        super().__init__(session, state_name, ttl_duration_ms)
        self._key_schema = user_key_schema
        self._value_schema = value_schema
        self._key_arity = len(user_key_schema.fields)
        self._row_type = Row(*value_schema.names)
        self._codec = StateCodec(state_name, value_schema)
        self._key_codec = StateCodec(state_name, user_key_schema)

    def _ukb(self, key: Any) -> bytes:
        row = _as_row(key, self._key_schema, self._name, "user key")
        return codec.encode_key(self._key_codec.coerce(row, "user key"))

    def _entries(self, kb: bytes) -> Iterator[tuple[bytes, Any]]:
        now = self._now()
        n = len(kb)
        key = self._s.key
        decode_live = self._codec.decode_live
        for k, data in list(self._s.store.items(self._cf, kb)):
            value = decode_live(data, now, key)
            if value is not EXPIRED:
                yield k[n:], value

    def exists(self) -> bool:
        """Whether the map of the current grouping key has any (unexpired) entry."""
        now = self._now()
        key = self._s.key
        for _, data in self._s.store.items(self._cf, self._kb("read")):
            expiry = self._codec.expiry(data, key)
            if expiry is None or now < expiry:
                return True
        return False

    def getValue(self, key: StateRow) -> StateRow | None:
        """The value of ``key`` in the current grouping key's map (a Row, as Spark returns), or None."""
        kb = self._kb("read")
        data = self._s.store.get(self._cf, kb + self._ukb(key))
        if data is None:
            return None
        value = self._codec.decode_live(data, self._now(), self._s.key)
        if value is EXPIRED:
            return None
        return self._row_type(*value)

    def containsKey(self, key: StateRow) -> bool:
        """Whether ``key`` is in the current grouping key's map (and has not expired)."""
        kb = self._kb("read")
        data = self._s.store.get(self._cf, kb + self._ukb(key))
        if data is None:
            return False
        expiry = self._codec.expiry(data, self._s.key)
        return expiry is None or self._now() < expiry

    def updateValue(self, key: StateRow, value: StateRow) -> None:
        """Set the value of ``key`` in the current grouping key's map (restarting its TTL)."""
        kb = self._kb("update")
        target = kb + self._ukb(key)
        row = _as_row(value, self._value_schema, self._name, "value")
        expiry = self._expiry()
        self._s.store.put(self._cf, target, self._codec.encode(row, expiry))
        self._index_ttl(expiry, target)

    def iterator(self) -> Iterator[tuple[StateRow, StateRow]]:
        """Iterate ``(user key, value)`` pairs of the current grouping key's map, in key order."""
        arity = self._key_arity
        return iter(
            [(codec.decode_key(ukb, arity)[0], tuple(v)) for ukb, v in self._entries(self._kb("read"))]
        )

    def keys(self) -> Iterator[StateRow]:
        """Iterate the user keys of the current grouping key's map."""
        arity = self._key_arity
        return iter([codec.decode_key(ukb, arity)[0] for ukb, _ in self._entries(self._kb("read"))])

    def values(self) -> Iterator[StateRow]:
        """Iterate the values of the current grouping key's map."""
        return iter([tuple(v) for _, v in self._entries(self._kb("read"))])

    def removeKey(self, key: StateRow) -> None:
        """Remove ``key`` from the current grouping key's map."""
        kb = self._kb("remove from")
        self._s.store.delete(self._cf, kb + self._ukb(key))

    def clear(self) -> None:
        """Remove the whole map of the current grouping key."""
        self._clear_prefix(self._kb("clear"))

    def expire(self, target: bytes, now: int) -> int:
        """Delete the map entry at ``target`` (grouping key + user key) if it has expired."""
        store = self._s.store
        data = store.get(self._cf, target)
        if data is not None:
            expiry = self._codec.expiry(data, target)
            if expiry is not None and now >= expiry:
                store.delete(self._cf, target)
                return 1
        return 0


_RESERVED_NAMES = {"default"}


def _check_state_name(state_name: Any) -> str:
    if not isinstance(state_name, str):
        raise StateVariableError(f"stateName must be a string, not {type(state_name).__name__}")
    if not state_name or state_name.strip() != state_name:
        raise StateVariableError(
            f"Invalid state variable name {state_name!r}: it must be non-empty, without leading or"
            " trailing whitespace"
        )
    if state_name[0] in "_$" or state_name.lower() in _RESERVED_NAMES:
        raise StateVariableError(
            f"Invalid state variable name {state_name!r}: names starting with '_' or '$' and the name"
            " 'default' are reserved"
        )
    return state_name


class StatefulProcessorHandle:
    """The handle passed to ``StatefulProcessor.init``: declares state variables and manages timers."""

    _value_state: type[ValueState] = ValueState
    _list_state: type[ListState] = ListState
    _map_state: type[MapState] = MapState

    def __init__(self, session: PartitionSession) -> None:
        self._s = session

    # -- state variables -------------------------------------------------------------------------

    def _check_declare(self, operation: str, state_name: Any, ttl_duration_ms: Any) -> tuple[str, int | None]:
        phase = self._s.phase
        if phase != StatefulProcessorHandleState.CREATED:
            raise InvalidHandleStateError(
                f"Cannot perform {operation} in handle state {phase.name}: state variables can only be"
                " created in init()"
            )
        name = _check_state_name(state_name)
        if name in self._s.declared:
            raise StateVariableError(f"State variable {name!r} is already defined in this processor")
        if ttl_duration_ms is None:
            return name, None
        if self._s.time_mode != "ProcessingTime":
            raise InvalidTimeModeError(
                f"Cannot provide a TTL for state variable {name!r} with time mode {self._s.time_mode}:"
                " TTL needs time mode ProcessingTime"
            )
        if isinstance(ttl_duration_ms, bool) or not isinstance(ttl_duration_ms, int):
            try:
                import numpy as np

                if isinstance(ttl_duration_ms, np.integer):
                    ttl_duration_ms = int(ttl_duration_ms)
            except ImportError:  # pragma: no cover
                pass
        if isinstance(ttl_duration_ms, bool) or not isinstance(ttl_duration_ms, int):
            raise StateVariableError(
                f"ttlDurationMs of state variable {name!r} must be an int of milliseconds, not"
                f" {type(ttl_duration_ms).__name__}"
            )
        if ttl_duration_ms <= 0:
            raise StateVariableError(
                f"ttlDurationMs of state variable {name!r} must be positive, got {ttl_duration_ms}"
            )
        if self._s.batch_timestamp_ms is None:
            raise InvalidTimeModeError(
                f"State variable {name!r} has a TTL but the batch has no processing timestamp"
            )
        return name, ttl_duration_ms

    def _register(self, state: _StateBase, declaration: dict[str, Any]) -> None:
        store = self._s.store
        key = layout.meta_key(state._name)
        old = store.get(layout.META_CF, key)
        encoded = json.dumps(declaration, sort_keys=True).encode()
        if old is not None:
            # The stored declaration is data from the checkpoint: parsed by blobstate's own schema parser
            where = f"state variable {state._name!r} in $meta of the partition's committed state"
            stored = parse_declaration(old, where=where)
            if stored.kind != state.kind:
                raise StateVariableError(
                    f"Cannot change state variable {state._name!r} from {stored.kind} state to"
                    f" {state.kind} state between query restarts: declare it as {stored.kind}"
                    " state, delete it with deleteIfExists in init, or start from a new checkpoint"
                )
            self._reconcile_schema(state, stored.to_json(), declaration)
        if old != encoded:
            # What is written must read back: the same allow-list and bounds as any stored schema
            parse_declaration(encoded, where=f"state variable {state._name!r} as declared")
            store.put(layout.META_CF, key, encoded)
        self._s.declared[state._name] = state
        if state._ttl is not None:
            self._s.ttl_vars.append(state)

    def _reconcile_schema(
        self, state: _StateBase, previous: dict[str, Any], declaration: dict[str, Any]
    ) -> None:
        """Stored values are encoded for the schema they were written with: evolve them when the new
        schema only appends nullable fields, refuse any other layout (:mod:`evolution`)."""
        from blobstate.processor import evolution

        store = self._s.store
        if next(iter(store.items(state._cf)), None) is None:
            return
        if "userKeySchema" in declaration and storage_signature(previous.get("userKeySchema")) != (
            storage_signature(declaration["userKeySchema"])
        ):
            raise evolution.refuse(
                state._name, "user key schema", previous.get("userKeySchema"), declaration["userKeySchema"]
            )
        before, now = previous.get("schema"), declaration["schema"]
        if evolution.same_fields(before, now):
            return
        schema = (
            state._value_schema
            if isinstance(state, MapState)
            else cast(ValueState | ListState, state)._schema
        )
        added = evolution.appended_nullable(before, schema)
        if added is None:
            raise evolution.refuse(state._name, "schema", before, now)
        evolution.migrate(store, state._cf, state._name, state.kind, schema, len(schema.fields) - added)

    def getValueState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> ValueState:
        """Create (or reopen) a value state variable; call only in ``init``."""
        name, ttl = self._check_declare("getValueState", stateName, ttlDurationMs)
        struct = to_struct_type(schema, what=f"schema of state variable {name!r}")
        state = self._value_state(self._s, name, struct, ttl)
        self._register(state, {"kind": "value", "schema": struct.jsonValue(), "ttl": ttl is not None})
        return state

    def getListState(
        self, stateName: str, schema: StructType | str, ttlDurationMs: int | None = None
    ) -> ListState:
        """Create (or reopen) a list state variable; call only in ``init``."""
        name, ttl = self._check_declare("getListState", stateName, ttlDurationMs)
        struct = to_struct_type(schema, what=f"schema of state variable {name!r}")
        state = self._list_state(self._s, name, struct, ttl)
        self._register(state, {"kind": "list", "schema": struct.jsonValue(), "ttl": ttl is not None})
        return state

    def getMapState(
        self,
        stateName: str,
        userKeySchema: StructType | str,
        valueSchema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> MapState:
        """Create (or reopen) a map state variable; call only in ``init``."""
        name, ttl = self._check_declare("getMapState", stateName, ttlDurationMs)
        key_struct = to_struct_type(userKeySchema, what=f"user key schema of state variable {name!r}")
        value_struct = to_struct_type(valueSchema, what=f"value schema of state variable {name!r}")
        state = self._map_state(self._s, name, key_struct, value_struct, ttl)
        self._register(
            state,
            {
                "kind": "map",
                "userKeySchema": key_struct.jsonValue(),
                "schema": value_struct.jsonValue(),
                "ttl": ttl is not None,
            },
        )
        return state

    def deleteIfExists(self, stateName: str) -> None:
        """Delete a state variable and all its values, if it exists; call only in ``init``."""
        phase = self._s.phase
        if phase != StatefulProcessorHandleState.CREATED:
            raise InvalidHandleStateError(
                f"Cannot perform deleteIfExists in handle state {phase.name}: state variables can only be"
                " deleted in init()"
            )
        name = _check_state_name(stateName)
        store = self._s.store
        existing = set(store.column_families())
        for cf in (layout.state_cf(name), layout.ttl_cf(name)):
            # init runs every batch: only write (and log) a clear when there is something to clear.
            if cf in existing and next(iter(store.items(cf)), None) is not None:
                store.clear(cf)
        if name not in self._s.declared and store.get(layout.META_CF, layout.meta_key(name)) is not None:
            store.delete(layout.META_CF, layout.meta_key(name))

    # -- adjunct stores --------------------------------------------------------------------------

    def getAdjunct(self, name: str) -> Any:
        """The read-only store a side stream keeps (``transform_with_state(adjuncts=[...])``): an
        :class:`~blobstate.adjunct.view.AdjunctView` with ``get``, ``get_many``, ``contains``, ``items``
        and ``schema``. Every task of a batch sees it at the same version."""
        view = self._s.adjuncts.get(name)
        if view is None:
            known = sorted(self._s.adjuncts)
            raise StatefulProcessorError(
                f"no adjunct store named {name!r}; the query declares {known or 'none'}"
                " (transform_with_state(adjuncts=[Adjunct(name, ...)]))"
            )
        return view

    # -- timers ----------------------------------------------------------------------------------

    def _timer_key(self, operation: str) -> bytes:
        self._check_timers(operation)
        kb = self._s.key_bytes
        if kb is None:
            raise ImplicitKeyError(f"Cannot perform {operation}: no grouping key is set")
        return kb

    def _check_timers(self, operation: str) -> None:
        """Refuse a timer operation in time mode None or outside the handlers."""
        s = self._s
        if not s.timers_enabled:
            raise InvalidTimeModeError(
                f"Cannot perform {operation} with time mode None: timers need time mode ProcessingTime or"
                " EventTime"
            )
        phase = s.phase
        if phase.value < StatefulProcessorHandleState.INITIALIZED.value or phase.value >= (
            StatefulProcessorHandleState.TIMER_PROCESSED.value
        ):
            raise InvalidHandleStateError(
                f"Cannot perform {operation} in handle state {phase.name}: timers can only be used in"
                " handleInputRows, handleInitialState or handleExpiredTimer"
            )

    @staticmethod
    def _timestamp(value: Any, operation: str) -> int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise StateVariableError(
                f"{operation} needs an int timestamp in milliseconds, not {type(value).__name__} ({value!r})"
            )
        return int(value)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """Register a timer at ``expiryTimestampMs`` for the current grouping key (no-op if it exists)."""
        kb = self._timer_key("registerTimer")
        ts8 = codec.encode_ts(self._timestamp(expiryTimestampMs, "registerTimer"))
        store = self._s.store
        if store.get(layout.TIMERS_BY_KEY_CF, kb + ts8) is None:
            store.put(layout.TIMERS_BY_KEY_CF, kb + ts8, b"")
            store.put(layout.TIMERS_CF, ts8 + kb, b"")

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        """Delete the current grouping key's timer at ``expiryTimestampMs`` (no-op if there is none)."""
        kb = self._timer_key("deleteTimer")
        ts8 = codec.encode_ts(self._timestamp(expiryTimestampMs, "deleteTimer"))
        delete_timer(self._s.store, kb, ts8)

    def listTimers(self) -> Iterator[int]:
        """The current grouping key's timers (expiry timestamps in ms), ascending."""
        kb = self._timer_key("listTimers")
        n = len(kb)
        return iter([codec.decode_ts(k, n) for k, _ in self._s.store.items(layout.TIMERS_BY_KEY_CF, kb)])


def delete_timer(store: KeyValueStore, kb: bytes, ts8: bytes) -> bool:
    """Delete one timer from both timer column families; False if it was not registered."""
    if store.get(layout.TIMERS_BY_KEY_CF, kb + ts8) is None:
        return False
    store.delete(layout.TIMERS_BY_KEY_CF, kb + ts8)
    store.delete(layout.TIMERS_CF, ts8 + kb)
    return True
