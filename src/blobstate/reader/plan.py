"""Planning a read on the driver: the version, operator, partitions, state variable and row schema.

The state variable's declaration is read from the ``$meta`` of a partition restored at the version (the
first one that declares it); that one restore is the price of a typed schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from blobstate.blobstore import open_blob_store
from blobstate.encoding import layout
from blobstate.reader.checkpoint import (
    CheckpointVersion,
    choose_operator,
    choose_partitions,
    open_version,
    restored_partition,
)
from blobstate.reader.schema import infer_key_schema, row_schema
from blobstate.reader.variables import TIMERS, StateReadError, StateVariable, any_key, declarations
from blobstate.stored_schema import StoredSchemaError, parse_stored_schema


@dataclass(frozen=True)
class ReadPlan:
    """What a read returns: checked against the checkpoint, ready to run on the executors."""

    url: str
    version: int
    operator: str
    partitions: list[int]
    state_var: str
    """A state variable's name, or :data:`TIMERS`."""
    schema: StructType


def _key_schema(checkpoint: CheckpointVersion, operator: str) -> StructType | None:
    """The operator's ``key_schema`` recorded in ``metadata.json`` (None when it records none)."""
    recorded = checkpoint.metadata.operators[operator].get("key_schema")
    if recorded is None:
        return None
    where = f"key_schema of operator {operator} in metadata.json of {checkpoint.url}"
    parsed = parse_stored_schema(recorded, where=where)
    names = checkpoint.key_columns(operator)
    if parsed.fieldNames() != names:
        raise StoredSchemaError(
            where, "", f"its fields {parsed.fieldNames()} are not the key columns {names}"
        )
    return parsed


def plan_read(
    url: str,
    *,
    version: int | None = None,
    operator: str | None = None,
    partition: Any = None,
    state_var: str | None = None,
    schema: StructType | None = None,
) -> ReadPlan:
    """Check the request against the checkpoint at ``url`` and work out the rows' schema.

    ``state_var`` None picks the only state variable; :data:`TIMERS` reads the registered timers.
    Raises :class:`StateReadError` (one line, naming what is known) for anything that does not exist.
    With ``schema`` (already planned) and ``state_var`` given, nothing is restored: the version, operator
    and partitions are checked and the plan returned.
    """
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        op = choose_operator(checkpoint, operator)
        partitions = choose_partitions(checkpoint, partition)
        if schema is not None and state_var is not None:
            return ReadPlan(url, checkpoint.version, op, partitions, state_var, schema)
        names = checkpoint.key_columns(op)
        key_schema = _key_schema(checkpoint, op)
        var: StateVariable | None = None
        known: set[str] = set()
        for p in partitions:
            with restored_partition(store, checkpoint, op, p) as rocks:
                declared = declarations(rocks, where=checkpoint.describe(op, p))
                known.update(declared)
                if state_var is None and len(declared) == 1:
                    state_var = next(iter(declared))
                if state_var is not None and state_var != TIMERS:
                    var = declared.get(state_var, var)
                if key_schema is None and (var is not None or state_var == TIMERS):
                    key = any_key(rocks, [] if var is None else [var.name], len(names))
                    if key is not None:
                        key_schema = infer_key_schema(names, [key])
            if key_schema is not None and (var is not None or state_var == TIMERS):
                break
    where = f"operator {op} of {store.url} at version {checkpoint.version}"
    listed = ", ".join(repr(n) for n in sorted(known)) or "none"
    if state_var is None:
        raise StateReadError(
            f"choose a state variable (stateVarName) of {where}: its state variables are {listed}; timers:"
            f" {TIMERS!r}"
        )
    if state_var != TIMERS and var is None:
        raise StateReadError(
            f"{where} has no state variable {state_var!r}; its state variables are {listed} (timers:"
            f" {TIMERS!r})"
        )
    if key_schema is None:  # nothing stored anywhere: any key type reads no rows
        key_schema = infer_key_schema(names, [])
    return ReadPlan(url, checkpoint.version, op, partitions, state_var, row_schema(key_schema, var))


@dataclass(frozen=True)
class DeclaredState:
    """Every state variable a checkpoint's operator declares at a version, each planned for reading, and
    its timers: what a move reads (:mod:`blobstate.reader.moving`)."""

    version: int
    operator: str
    variables: dict[str, ReadPlan]
    """A plan per declared state variable, by name."""
    timers: ReadPlan
    time_mode: str | None
    """The operator's time mode as its partitions record it (None when none recorded one)."""


def plan_every_variable(
    url: str, *, version: int | None = None, operator: str | None = None
) -> DeclaredState:
    """Plan a read of every state variable the operator declares at ``version`` (default the latest), and
    of its timers, restoring as few partitions as that needs (usually one: every partition's task
    declares the processor's variables in every batch)."""
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        op = choose_operator(checkpoint, operator)
        partitions = choose_partitions(checkpoint, None)
        names = checkpoint.key_columns(op)
        key_schema = _key_schema(checkpoint, op)
        declared: dict[str, StateVariable] = {}
        time_mode: str | None = None
        for p in partitions:
            with restored_partition(store, checkpoint, op, p) as rocks:
                declared.update(declarations(rocks, where=checkpoint.describe(op, p)))
                mode = rocks.get(layout.META_CF, layout.TIME_MODE_KEY)
                time_mode = time_mode if mode is None else bytes(mode).decode("utf-8", "replace")
                if key_schema is None:
                    key = any_key(rocks, list(declared), len(names))
                    if key is not None:
                        key_schema = infer_key_schema(names, [key])
            if declared and key_schema is not None:
                break
    if key_schema is None:  # nothing stored anywhere: any key type reads no rows
        key_schema = infer_key_schema(names, [])

    def plan(state_var: str, var: StateVariable | None) -> ReadPlan:
        return ReadPlan(url, checkpoint.version, op, partitions, state_var, row_schema(key_schema, var))

    return DeclaredState(
        checkpoint.version,
        op,
        {name: plan(name, var) for name, var in sorted(declared.items())},
        plan(TIMERS, None),
        time_mode,
    )
