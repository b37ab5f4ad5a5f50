"""A side stream as the user declares it (:class:`Adjunct`) and as tasks need it (:class:`AdjunctSpec`).

A side stream is any streaming DataFrame. Its rows are never delivered to ``handleInputRows``: each one
upserts (or, with a null value, deletes) one key of a read-only store the processor reads through
``handle.getAdjunct(name)``. A *partitioned* store is keyed like the main stream and lives in the
partition's own state; a *broadcast* store holds the whole side table, one copy per executor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from blobstate.errors import ConfigurationError, ProcessorError

PARTITIONED = "partitioned"
BROADCAST = "broadcast"
MODES = (PARTITIONED, BROADCAST)
ON_BAD_RECORD = ("fail", "skip")

TAG_COLUMN = "__blobstate_adjunct"
"""Set on side rows to the adjunct's name; null on the main stream's rows."""
COLUMN_PREFIX = "__bsadj_"
PHASE_COLUMN = COLUMN_PREFIX + "phase"
"""0 for rows of a reloaded history, 1 for the side stream's own rows: history first."""
RANK_COLUMN = COLUMN_PREFIX + "rank"
"""A row's file in the source's read order (a stream's row: set from its file when applied)."""
ROW_COLUMN = COLUMN_PREFIX + "row"
"""Increases with a row's position in its file (or, from another source, in its read partition)."""
ORDER_COLUMNS = (PHASE_COLUMN, RANK_COLUMN, ROW_COLUMN)
FILE_COLUMN = COLUMN_PREFIX + "file"
"""The file a stream's side row was read from (null for other sources): gives its rank (``order``)."""
BROADCAST_OPERATOR_PREFIX = "adjunct-"
"""A broadcast store is checkpointed as its own one-partition operator ``adjunct-<name>``."""
STORE_CF_PREFIX = "$adjunct:"
"""The column family holding an adjunct's rows (in the partition's store, or the broadcast store)."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")


class AdjunctError(ConfigurationError, ValueError):
    """An adjunct declaration that cannot work; the message names the adjunct."""


class AdjunctRecordError(ProcessorError, ValueError):
    """A side row that cannot be turned into a key and a value (with ``on_bad_record="fail"``)."""


@dataclass(frozen=True)
class Adjunct:
    """A side stream materialized into a read-only store the processor reads (README, "Side streams").

    ``name`` names the store (``handle.getAdjunct(name)``); ``df`` is the side stream (any streaming
    DataFrame); ``key`` its key column(s). The stored value is either the ``value`` column(s) (default:
    every column that is not a key) or what ``transform(row)`` returns for the row as a dict (a tuple,
    list, dict or Row of ``value_schema``, which ``transform`` requires). A null key is skipped; a null
    value (every value column null, or ``transform`` returning None) deletes the key.

    ``mode``: ``"partitioned"`` (keyed like the main stream: the key columns match the main key's
    in number and order, and the store lives with each partition's state) or ``"broadcast"`` (a small
    table; every executor keeps the whole of it, written once per batch by the driver).

    ``bootstrap``: load the side stream's backlog before any main row is processed. ``persistent``:
    keep the store in the checkpoint across restarts (a non-persistent store is rebuilt from the side
    stream at every start). ``max_age_seconds``: a persistent store not updated for longer than this
    at start-up is invalid and rebuilt. ``on_bad_record``: ``"fail"`` the batch on a row that cannot be
    converted, or ``"skip"`` it and count it (the same policy in bootstrap and steady state).
    """

    name: str
    df: Any
    key: str | Sequence[str]
    value: str | Sequence[str] | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    value_schema: StructType | str | None = None
    mode: str = PARTITIONED
    bootstrap: bool = True
    persistent: bool = True
    max_age_seconds: float | None = None
    on_bad_record: str = "fail"

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The side stream's key column(s)."""
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    def validate(self, main_key_types: Sequence[Any], main_key_columns: Sequence[str] = ()) -> None:
        """Check the declaration against the side stream and the main key (its columns' Spark types, and
        names for messages); raises AdjunctError."""
        where = f"adjunct {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise AdjunctError(
                f"adjunct name {self.name!r} must be a letter then letters, digits or '_' (at most 48)"
            )
        if not getattr(self.df, "isStreaming", False):
            raise AdjunctError(f"{where}: df must be a streaming DataFrame (spark.readStream...)")
        if self.mode not in MODES:
            raise AdjunctError(f"{where}: mode must be one of {MODES}, not {self.mode!r}")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise AdjunctError(
                f"{where}: on_bad_record must be one of {ON_BAD_RECORD}, not {self.on_bad_record!r}"
            )
        if self.max_age_seconds is not None and not self.max_age_seconds > 0:
            raise AdjunctError(f"{where}: max_age_seconds must be positive, not {self.max_age_seconds!r}")
        columns = list(self.df.columns)
        keys = self.key_columns
        missing = [k for k in keys if k not in columns]
        if not keys or missing:
            raise AdjunctError(f"{where}: key column(s) {missing or list(keys)} not in its columns {columns}")
        if self.mode == PARTITIONED and len(keys) != len(main_key_types):
            raise AdjunctError(
                f"{where}: a partitioned adjunct is keyed like the main stream, which has"
                f" {len(main_key_types)} key column(s); its key has {len(keys)}"
            )
        if self.mode == PARTITIONED:
            names = list(main_key_columns) or [f"#{i + 1}" for i in range(len(keys))]
            self._check_key_types(keys, main_key_types, names)
        if self.transform is not None:
            if self.value is not None:
                raise AdjunctError(f"{where}: give value columns or a transform, not both")
            if self.value_schema is None:
                raise AdjunctError(f"{where}: a transform needs value_schema (the schema of what it returns)")
            if not callable(self.transform):
                raise AdjunctError(f"{where}: transform must be callable")
        else:
            values = self.value_columns
            missing = [v for v in values if v not in columns]
            if not values or missing:
                raise AdjunctError(
                    f"{where}: value column(s) {missing or values} not in its columns {columns} (or no"
                    " column besides the key)"
                )

    def _check_key_types(
        self, keys: Sequence[str], main_key_types: Sequence[Any], main_keys: Sequence[str]
    ) -> None:
        """A partitioned store's key column has the main key column's type: a cast between them would
        merge keys (``'01'`` into ``1``) or fail in a batch, so a mismatch is refused at the start."""
        types = {f.name: f.dataType for f in self.df.schema.fields}
        for key, main_type, main_key in zip(keys, main_key_types, main_keys, strict=True):
            side, main = types[key].simpleString(), main_type.simpleString()
            if side != main:
                raise AdjunctError(
                    f"adjunct {self.name!r}: its key column {key!r} is {side.upper()} but the main key"
                    f" column {main_key!r} is {main.upper()}; cast the side stream's column, e.g."
                    f' .withColumn("{key}", col("{key}").cast("{main}"))'
                )

    @property
    def value_columns(self) -> list[str]:
        """The value columns (without a transform): ``value``, else every non-key column."""
        if self.value is not None:
            return [self.value] if isinstance(self.value, str) else list(self.value)
        return [c for c in self.df.columns if c not in self.key_columns]

    def stored_schema(self) -> StructType:
        """The schema of the stored values."""
        if self.transform is not None:
            from blobstate.processor.schema import to_struct_type

            return to_struct_type(self.value_schema, what=f"value_schema of adjunct {self.name!r}")
        fields = {f.name: f for f in self.df.schema.fields}
        return StructType([fields[c] for c in self.value_columns])

    def spec(self, main_key_columns: Sequence[str]) -> AdjunctSpec:
        """What tasks and the driver need to apply this adjunct's rows (no DataFrame in it)."""
        side_columns = tuple(self.df.columns)
        if self.mode == PARTITIONED:
            key_in_union = tuple(main_key_columns)
        else:
            key_in_union = tuple(column_name(self.name, k) for k in self.key_columns)
        return AdjunctSpec(
            name=self.name,
            mode=self.mode,
            key_in_union=key_in_union,
            side_key_columns=self.key_columns,
            side_columns=side_columns,
            value_columns=() if self.transform is not None else tuple(self.value_columns),
            schema_json=self.stored_schema().json(),
            transform=self.transform,
            on_bad_record=self.on_bad_record,
            bootstrap=self.bootstrap,
            persistent=self.persistent,
            max_age_seconds=self.max_age_seconds,
        )


def column_name(adjunct: str, column: str) -> str:
    """The name of a side stream's column in the query's one input (unique per adjunct)."""
    return f"{COLUMN_PREFIX}{adjunct}__{column}"


@dataclass(frozen=True)
class AdjunctSpec:
    """An adjunct as the engine needs it: column names in the query's input, the value schema, the
    transform and the policies. Shipped to tasks inside the batch's plan."""

    name: str
    mode: str
    key_in_union: tuple[str, ...]
    """The key columns of its rows in the query's input (the main key's names for a partitioned one)."""
    side_key_columns: tuple[str, ...]
    """The key columns as the side stream names them."""
    side_columns: tuple[str, ...]
    """The side stream's own columns (present in the input as :func:`column_name`)."""
    value_columns: tuple[str, ...]
    """The side columns stored as the value; empty when a transform computes it."""
    schema_json: str
    transform: Callable[[dict[str, Any]], Any] | None
    on_bad_record: str
    bootstrap: bool
    persistent: bool
    max_age_seconds: float | None

    @property
    def schema(self) -> StructType:
        """The stored values' schema."""
        import json

        return StructType.fromJson(json.loads(self.schema_json))

    @property
    def column_family(self) -> str:
        """The column family of its rows."""
        return STORE_CF_PREFIX + self.name

    @property
    def operator(self) -> str:
        """The operator a broadcast store is checkpointed as."""
        return BROADCAST_OPERATOR_PREFIX + self.name
