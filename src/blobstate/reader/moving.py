"""What a move between Spark's own state store and blobstate carries besides the rows of one variable.

A move (README, "Moving a job to or from blobstate") stops the old query, reads its state and starts
the new query with it as its initial state. Two things do not come with a variable's rows:

- the event-time watermark: :func:`last_watermark_ms` reads it after the last committed batch of
  either engine's checkpoint, through the blob store (Spark's ``commits/<N>`` holds
  ``nextBatchWatermarkMs``; blobstate's newest commit ``watermark_ms``), with no Spark session;
- the other variables: :func:`read_moved_state` reads every variable the move names, with the old
  engine's own reader, pinned to the batch the watermark is of, and first refuses
  (:class:`MissingStateVariableError`) a variable the old query declared that the move neither reads
  nor leaves out by name, as Flink refuses a savepoint's state that the new job does not take unless it
  is told to (``--allowNonRestoredState``). Spark's declarations come from its ``state-metadata``
  reader, blobstate's from ``$meta`` (:func:`blobstate.reader.plan.plan_every_variable`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore, open_existing_blob_store
from blobstate.blobstore.redact import redact
from blobstate.blobstore.schemes import hadoop_location, normalize_location
from blobstate.layout import METADATA
from blobstate.reader.variables import StateReadError

SPARK = "spark"
"""A checkpoint of Spark's own stateful operator (``transformWithStateInPandas``, ``transformWithState``)."""
BLOBSTATE = "blobstate"
"""A blobstate query checkpoint (``transform_with_state``)."""

SPARK_METADATA = "metadata"
"""The file Spark writes first into a streaming query's checkpoint (the query id)."""
_MAX_SPARK_COMMIT_BYTES = 64 * 1024
"""A Spark commit file is a version line and a small JSON object: anything larger is not one."""


class MissingStateVariableError(StateReadError):
    """The old query declared a state variable that a move neither reads nor leaves out by name."""


@dataclass(frozen=True)
class LastCommit:
    """The last committed batch of a query checkpoint, either engine's."""

    url: str
    engine: str
    """:data:`SPARK` or :data:`BLOBSTATE`."""
    batch: int
    """Spark's batch id of the commit (``commits/<batch>``), or blobstate's version."""
    watermark_ms: int
    """The event-time watermark after that batch (0 when the query keeps none)."""


def last_commit(checkpoint: str) -> LastCommit:
    """The last committed batch of the query checkpoint at ``checkpoint`` (a path or URL) and the
    watermark after it. Raises :class:`StateReadError` (one line naming the path) for a location that is
    neither engine's checkpoint or that committed nothing."""
    url = normalize_location(checkpoint)
    with open_existing_blob_store(url) as store:
        if store.exists(METADATA):
            return _blobstate_commit(store)
        if store.exists(SPARK_METADATA):
            return _spark_commit(store)
    raise StateReadError(
        f"{redact(url)} is not a query checkpoint: it has neither Spark's {SPARK_METADATA} file nor"
        f" blobstate's {METADATA}"
    )


def last_watermark_ms(checkpoint: str) -> int:
    """The event-time watermark after the last committed batch of a query checkpoint, Spark's or
    blobstate's, in epoch milliseconds (0 when the query keeps none: both engines start at 0).

    For a Spark checkpoint it is ``nextBatchWatermarkMs`` of its newest ``commits/<N>``; for a blobstate
    one its newest commit's ``watermark_ms``: the watermark the old query's next batch would have fired
    timers at, and the one its next batch after that would have dropped late rows by. A move carries
    it: blobstate's ``transform_with_state(..., initial_watermark_ms=...)`` starts from it, and a Spark
    query keeps only the input rows whose event time is after it (``where(col > timestamp_millis(W))``),
    Spark's own rule for late rows (an event at or before the watermark is late).
    Read through the blob store (a path, ``file://``, ``s3://``/``s3a://``, ``az://``/``abfss://``): no
    Spark session is needed. Errors are one :class:`StateReadError` line naming the path.
    """
    return last_commit(checkpoint).watermark_ms


def _blobstate_commit(store: BlobStore) -> LastCommit:
    from blobstate.reader.checkpoint import open_version

    commit = open_version(store).commit
    watermark = commit.watermark_ms if commit.watermark_ms is not None else 0
    return LastCommit(store.url, BLOBSTATE, commit.version, watermark)


def _spark_commit(store: BlobStore) -> LastCommit:
    batches = [
        int(name.rpartition("/")[2])
        for name in store.list("commits/")
        if name.rpartition("/")[2].isdigit()  # not Spark's checksums (.0.crc) nor its temporary files
    ]
    if not batches:
        raise StateReadError(f"the Spark checkpoint {store.url} has no committed batch (commits/ is empty)")
    batch = max(batches)
    name = f"commits/{batch}"
    try:
        data = store.get(name)
    except BlobNotFoundError:  # removed since the listing (Spark purges old ones): the query is running
        raise StateReadError(
            f"{name} of the Spark checkpoint {store.url} vanished while read: stop the old query first"
        ) from None
    return LastCommit(store.url, SPARK, batch, parse_spark_commit(data, f"{name} of {store.url}"))


def parse_spark_commit(data: bytes, where: str) -> int:
    """``nextBatchWatermarkMs`` of a Spark commit file (a version line such as ``v1``, then a JSON
    object); :class:`StateReadError` naming ``where`` when it is not one."""
    if len(data) > _MAX_SPARK_COMMIT_BYTES:
        raise StateReadError(f"{where} is not a Spark commit file: {len(data)} bytes")
    try:
        version, _, body = data.decode("utf-8").partition("\n")
        if not (version.startswith("v") and version[1:].isdigit()):
            raise ValueError(f"its first line is {version[:40]!r}, not a version such as 'v1'")
        record = json.loads(body)
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors too
        raise StateReadError(f"{where} is not a Spark commit file: {error}") from None
    watermark = record.get("nextBatchWatermarkMs") if isinstance(record, dict) else None
    if isinstance(watermark, bool) or not isinstance(watermark, int):
        raise StateReadError(f"{where} is not a Spark commit file: no integer nextBatchWatermarkMs")
    return watermark


# ---------------------------------------------------------------------------------------------- moving
@dataclass(frozen=True)
class MovedState:
    """What :func:`read_moved_state` read from the old query's checkpoint: lazy DataFrames, with rows
    laid out as both engines' state readers lay them out (``key``, then ``value``, ``list_element`` or
    ``user_key`` and ``value``)."""

    checkpoint: str
    engine: str
    """:data:`SPARK` or :data:`BLOBSTATE`: whose checkpoint it is."""
    batch: int
    """The committed batch read (Spark's batch id, blobstate's version): every frame and the watermark
    are of this one."""
    variables: Mapping[str, Any]
    """Each moved state variable's rows, by name, in the order the move named them."""
    timers: Any
    """The registered timers (``key``, ``expiration_timestamp_ms``), or None when the old query's time
    mode has none (``None``)."""
    watermark_ms: int
    """:func:`last_watermark_ms` of the batch read."""
    left_out: tuple[str, ...]
    """The declared variables the move leaves out on purpose (``leave_out``)."""


def check_moved(
    declared: Sequence[str], variables: Sequence[str], leave_out: Sequence[str], where: str
) -> None:
    """Refuse a move that does not account for every declared variable.

    ``declared`` are the old query's state variables, ``variables`` those the move reads, ``leave_out``
    those it drops on purpose. A name in neither list raises :class:`MissingStateVariableError` naming
    every such variable; a name the old query did not declare, or one in both lists, raises
    :class:`StateReadError`. ``where`` names the old query's checkpoint.
    """
    variables, leave_out = _names(variables, "variables"), _names(leave_out, "leave_out")
    listed = ", ".join(repr(n) for n in declared) or "none"
    for given in (variables, leave_out):
        unknown = [n for n in given if n not in declared]
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise StateReadError(f"{where} declares no state variable {names}; it declares {listed}")
    both = [n for n in variables if n in leave_out]
    if both:
        raise StateReadError(f"{', '.join(repr(n) for n in both)} both moved and left out: choose one")
    missing = [n for n in declared if n not in variables and n not in leave_out]
    if missing:
        names = ", ".join(repr(n) for n in missing)
        raise MissingStateVariableError(
            f"{where} declares state variable{'s' if len(missing) > 1 else ''} {names}, which the move"
            " does not read: add it to variables (and to the initial state), or to leave_out to drop its"
            " state on purpose"
        )


@dataclass(frozen=True)
class SparkOperator:
    """Spark's transformWithState operator as its ``state-metadata`` reader describes it."""

    operator_id: int
    variables: tuple[str, ...]
    """The declared state variables (not Spark's internal timer families)."""
    time_mode: str


def spark_operator(rows: Sequence[Mapping[str, Any]], where: str) -> SparkOperator:
    """The one transformWithState operator among the rows of Spark's ``state-metadata`` reader
    (``operatorId``, ``operatorName``, ``operatorProperties``: JSON with ``timeMode`` and
    ``stateVariables``); :class:`StateReadError` naming ``where`` when there is none or more than one."""
    found = []
    for row in rows:
        try:
            properties = json.loads(row.get("operatorProperties") or "{}")
        except ValueError:
            continue
        if isinstance(properties, dict) and isinstance(properties.get("stateVariables"), list):
            found.append((row, properties))
    if len(found) != 1:
        operators = ", ".join(f"{r.get('operatorName')} (id {r.get('operatorId')})" for r in rows) or "none"
        raise StateReadError(
            f"{where} holds {len(found)} transformWithState operators (its stateful operators: {operators});"
            " a move reads a query with exactly one"
        )
    row, properties = found[0]
    variables = tuple(
        str(v["stateName"])
        for v in properties["stateVariables"]
        if isinstance(v, dict)
        and v.get("stateVariableType") != "TimerState"
        and not str(v.get("stateName", "$")).startswith("$")
    )
    return SparkOperator(int(row["operatorId"]), variables, str(properties.get("timeMode", "None")))


def read_moved_state(
    spark: Any, checkpoint: str, variables: Sequence[str], *, leave_out: Sequence[str] = ()
) -> MovedState:
    """Read what a move carries from the old query's checkpoint (Spark's or blobstate's): the rows of
    each state variable in ``variables``, the registered timers and the watermark, all of its last
    committed batch, with that engine's own reader (Spark's ``format("statestore")``,
    :func:`blobstate.read_state`).

    ``variables`` names the state variables the move reads, ``leave_out`` those it drops on purpose;
    together they must name every variable the old query declared, or the read is refused before
    anything runs (:class:`MissingStateVariableError` naming each one), so a variable is never lost by
    being forgotten. The frames are lazy; the timers frame is None in time mode ``None``. Stop the old
    query first: a batch it commits meanwhile is not in the frames read (they are pinned to one batch).
    """
    moved, dropped = _names(variables, "variables"), _names(leave_out, "leave_out")
    last = last_commit(checkpoint)
    where = f"the old query's checkpoint {last.url}"
    if last.engine == SPARK:
        return _read_spark(spark, last, moved, dropped, where)
    return _read_blobstate(spark, last, moved, dropped, where)


def _names(given: Sequence[str], what: str) -> tuple[str, ...]:
    """``given`` as a tuple of names; :class:`StateReadError` for one string or a name that is not one."""
    if isinstance(given, str) or not all(isinstance(n, str) for n in given):
        raise StateReadError(f"{what} must be a list of state variable names, not {given!r}")
    return tuple(given)


def _read_spark(
    spark: Any, last: LastCommit, variables: Sequence[str], leave_out: Sequence[str], where: str
) -> MovedState:
    path = hadoop_location(last.url)
    rows = [r.asDict() for r in spark.read.format("state-metadata").load(path).collect()]
    operator = spark_operator(rows, where)
    check_moved(operator.variables, variables, leave_out, where)

    def reader() -> Any:
        options = {"operatorId": str(operator.operator_id), "batchId": str(last.batch)}
        return spark.read.format("statestore").options(**options)

    frames = {name: reader().option("stateVarName", name).load(path) for name in variables}
    timers = None
    if operator.time_mode != "None":
        timers = reader().option("readRegisteredTimers", "true").load(path)
    return MovedState(last.url, SPARK, last.batch, frames, timers, last.watermark_ms, tuple(leave_out))


def _read_blobstate(
    spark: Any, last: LastCommit, variables: Sequence[str], leave_out: Sequence[str], where: str
) -> MovedState:
    from blobstate.reader import _warn_if_lost, read_planned, register_reader
    from blobstate.reader.plan import plan_every_variable

    declared = plan_every_variable(last.url, version=last.batch)
    check_moved(list(declared.variables), variables, leave_out, where)
    _warn_if_lost(last.url)
    register_reader(spark)
    frames = {name: read_planned(spark, declared.variables[name]) for name in variables}
    timers = None if declared.time_mode == "None" else read_planned(spark, declared.timers)
    return MovedState(last.url, BLOBSTATE, last.batch, frames, timers, last.watermark_ms, tuple(leave_out))
