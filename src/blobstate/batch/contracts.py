"""The typed contracts of one micro-batch: what a task is told, and what it reports back.

Every task of the processing stage gets a :class:`PartitionSpec` (where the query's partition state
lives, the same in every batch) and a :class:`BatchPlan` (what the driver decided for this batch: the
version the tasks start from, each partition's uid, the processor's :class:`RunSpec` with this batch's
timestamp and watermarks); the engine ships them with the processor and the batch's task steps
(``batch.steps.TaskStep``) in its ``TaskSpec``. Each task answers with one :class:`TaskResult` (or a failure),
as plain JSON in its metadata row: nothing that travels back from a task is unpickled.

Every contract is frozen and has ``to_json``/``from_json`` (plain JSON types). Defaults come from
:mod:`blobstate.defaults`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa

from blobstate import defaults

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

JsonValue: TypeAlias = str | int | float | bool | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
"""A value that ``json.dumps`` writes (``json.loads`` reads sequences back as lists, mappings as dicts)."""

JsonObject: TypeAlias = dict[str, JsonValue]

SchemaLike: TypeAlias = "pa.Schema | StructType | str"
"""An output schema as a processor's caller gives it: Arrow, Spark's StructType or a DDL string."""


def as_int(value: JsonValue) -> int:
    """A JSON number (or numeric string) as an int; 0 for anything else (absent, null)."""
    if isinstance(value, int | float | str):
        return int(value)
    return 0


def _ints(mapping: Mapping[str, JsonValue] | Mapping[int, JsonValue]) -> dict[int, JsonValue]:
    """A JSON object keyed by partition (JSON keys are strings) with int keys again."""
    return {int(k): v for k, v in mapping.items()}


@dataclass(frozen=True)
class PartitionSpec:
    """Where the query's partition state lives and how a task commits it; the same in every batch."""

    checkpoint_url: str
    """The checkpoint's blob store URL, options included as its query (tasks open the store with it)."""
    query_id: str
    operator: str
    num_partitions: int
    local_dir: str = ""
    """Executor-local directory (empty: each executor's default, resolved on the executor)."""
    local_dir_grace_seconds: float = defaults.LOCAL_DIR_GRACE_SECONDS
    snapshot_every: int = defaults.SNAPSHOT_EVERY
    snapshot_delta_bytes: int = defaults.SNAPSHOT_DELTA_BYTES
    snapshot_upload: str = defaults.SNAPSHOT_UPLOAD

    def to_json(self) -> JsonObject:
        """This spec as a JSON object."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> PartitionSpec:
        """The spec :meth:`to_json` wrote."""
        return cls(**data)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunSpec:
    """How the processor runs over one partition's rows for one batch (``processor.runner``'s options).

    ``key_columns`` are the grouping columns; ``output_schema`` the schema of the rows the processor
    yields; ``time_mode`` and ``output_mode`` as in Spark (any case); ``api`` one of
    :data:`blobstate.defaults.APIS`; ``batch_timestamp_ms`` the batch's processing time (needed for
    ProcessingTime and TTL); ``watermark_ms`` the event-time watermark for timers and eviction,
    ``late_watermark_ms`` the one for dropping late rows (Spark uses the previous batch's; default
    ``watermark_ms``); ``event_time_column`` the input's event-time column;
    ``initial_state_key_columns`` the initial state's key columns (default ``key_columns``);
    ``timezone`` the zone of naive pandas timestamps; ``instant_keys`` the positions of the key's
    TIMESTAMP columns (instants: stored by their UTC reading, handed to handlers in ``timezone``).
    """

    key_columns: tuple[str, ...]
    output_schema: SchemaLike
    time_mode: str = "None"
    output_mode: str = "Update"
    api: str = "pandas"
    timezone: str = "UTC"
    event_time_column: str | None = None
    batch_timestamp_ms: int | None = None
    watermark_ms: int | None = None
    late_watermark_ms: int | None = None
    initial_state_key_columns: tuple[str, ...] | None = None
    max_rows_per_frame: int = defaults.MAX_ROWS_PER_FRAME
    flush_rows: int = defaults.FLUSH_ROWS
    instant_keys: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # A single column name is accepted for a key, as Spark's groupBy does; lists become tuples.
        for name in ("key_columns", "initial_state_key_columns", "instant_keys"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    def to_json(self) -> JsonObject:
        """This spec as a JSON object (an Arrow schema as its IPC bytes in base64)."""
        out: JsonObject = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out["output_schema"] = _schema_json(self.output_schema)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> RunSpec:
        """The spec :meth:`to_json` wrote."""
        values: dict[str, object] = dict(data)
        schema = data["output_schema"]
        assert isinstance(schema, Mapping)
        values["output_schema"] = _schema_from_json(schema)
        return cls(**values)  # type: ignore[arg-type]


def _schema_json(schema: SchemaLike) -> JsonObject:
    if isinstance(schema, pa.Schema):
        return {"arrow": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}
    if isinstance(schema, str):
        return {"ddl": schema}
    raise TypeError(
        "a RunSpec travels as JSON with an Arrow or DDL output schema, not a StructType: convert it with"
        " blobstate.processor.schema.to_arrow first"
    )


def _schema_from_json(data: Mapping[str, JsonValue]) -> SchemaLike:
    if "arrow" in data:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(str(data["arrow"]))))
    return str(data["ddl"])


@dataclass(frozen=True)
class BatchPlan:
    """What the driver decided for one batch, the same for every task of its stage."""

    version: int
    """The committed version the tasks start from; they commit ``version + 1``."""
    uids: dict[int, str]
    """Each partition's uid at ``version`` (empty at version 0)."""
    run: RunSpec
    """How the processor runs, with this batch's timestamp and watermarks."""
    inline_output_bytes: int = 0
    """A partition's outputs up to this many bytes go to the driver in its metadata row (``inline.py``);
    0: always emitted as rows."""
    report_failures: bool = True
    """A processor's exception ends the task with a ``failed`` metadata row instead of failing it; off
    for a write-through sink (whose job must see the task fail)."""
    pandas_object_strings: bool = True
    """Build pandas string columns with the object dtype in the Python workers."""
    batch_id: int | None = None
    """Spark's id of the batch; None: :attr:`version` (a checkpoint never rescaled, where batch ``b``
    starts from version ``b``; a rescale commits a version of its own, ``engine/batch_versions.py``)."""

    @property
    def committing(self) -> int:
        """The version this batch commits."""
        return self.version + 1

    @property
    def batch(self) -> int:
        """Spark's id of the batch (what the sink is handed and messages name)."""
        return self.version if self.batch_id is None else self.batch_id

    def to_json(self) -> JsonObject:
        """This plan as a JSON object."""
        return {
            "version": self.version,
            "uids": {str(p): u for p, u in sorted(self.uids.items())},
            "run": self.run.to_json(),
            "inline_output_bytes": self.inline_output_bytes,
            "report_failures": self.report_failures,
            "pandas_object_strings": self.pandas_object_strings,
            "batch_id": self.batch_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> BatchPlan:
        """The plan :meth:`to_json` wrote."""
        uids = data["uids"]
        run = data["run"]
        assert isinstance(uids, dict) and isinstance(run, dict)
        return cls(
            version=int(data["version"]),  # type: ignore[arg-type]
            uids={p: str(u) for p, u in _ints(uids).items()},
            run=RunSpec.from_json(run),
            inline_output_bytes=int(data["inline_output_bytes"]),  # type: ignore[arg-type]
            report_failures=bool(data["report_failures"]),
            pandas_object_strings=bool(data["pandas_object_strings"]),
            batch_id=None if data.get("batch_id") is None else int(data["batch_id"]),  # type: ignore[arg-type]
        )


PARTITION_METRICS = (
    "input_rows",
    "output_rows",
    "bytes_uploaded",
    "load_seconds",
    "load_rule",
    "restore_bytes",
    "process_seconds",
    "commit_seconds",
    "task_seconds",
    "snapshot_repairs",
    "snapshot_upload",
    "state_keys",
    "adjunct_keys",
    "snapshot_restore_bytes",
    "executor_id",
    "host",
    "started_at",
    "opened_at",
)
"""Per-partition entries of a commit's ``metrics.partitions``, from each :class:`TaskResult`."""


@dataclass(frozen=True)
class TaskResult:
    """What one task of the processing stage committed and measured (its metadata row, as JSON)."""

    partition: int
    version: int
    """The version the task committed (the batch's :attr:`BatchPlan.committing`)."""
    uid: str
    executor_id: str
    host: str
    attempt: int
    stage_id: int
    objects_written: tuple[str, ...]
    objects: JsonObject
    """The checkpoint's ``lineage.refs.PartitionObjects`` as JSON."""
    snapshot_repairs: tuple[str, ...]
    bytes_uploaded: int
    changelog_bytes: int
    snapshot: bool
    snapshot_upload: JsonObject
    load_seconds: float
    started_at: float
    """Wall-clock time the task started (``engine/recovery.py``)."""
    opened_at: float
    restore_bytes: int
    snapshot_restore_bytes: int
    load_rule: str
    task_seconds: float
    max_event_time_ms: int | None
    input_rows: int
    output_rows: int
    state_keys: int
    commit_seconds: float
    process_seconds: float
    adjuncts: JsonObject | None = None
    """With side streams: what the task applied, and the broadcast versions it read."""
    adjunct_keys: int = 0
    """RocksDB's estimate of the keys of the partition's side (adjunct) stores; ``state_keys`` is the
    query's own state without them."""

    def metrics(self) -> JsonObject:
        """The task's ``PARTITION_METRICS`` (and ``adjuncts``), for the commit and the progress."""
        out: JsonObject = {}
        for name in PARTITION_METRICS:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        if self.adjuncts is not None:
            out["adjuncts"] = self.adjuncts
        return out

    def to_json(self) -> JsonObject:
        """The metadata row's JSON object."""
        out: JsonObject = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "adjuncts" and value is None:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> TaskResult:
        """The result :meth:`to_json` wrote (unknown keys are refused, missing ones too)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"task result of partition {data.get('partition')}: unknown entries {unknown}")
        values: dict[str, object] = dict(data)
        for name in ("objects_written", "snapshot_repairs"):
            listed = data[name]
            assert isinstance(listed, Sequence)
            values[name] = tuple(listed)
        return cls(**values)  # type: ignore[arg-type]
