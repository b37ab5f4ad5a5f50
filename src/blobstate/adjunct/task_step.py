"""The executor half of adjunct stores: a task step (``batch.steps.TaskStep``) of every task of a batch.

The driver's step (``step.py``) plans what the tasks apply (:class:`AdjunctPlan`) and ships it, with the
query's adjunct specs, as an :class:`AdjunctTaskStep` in the task's spec. Before the processor runs, the
step splits the task's input (``records.split_side_rows``), applies its partitioned side rows to the
partition's store (before any main row), opens the executor's copy of every broadcast store at the
batch's version (``broadcast.open_replica``, kept open in the task's scope), hands the processor an
``AdjunctView`` of each, and holds back or releases main rows while a bootstrap store loads
(``deferred.py``). What it applied becomes the task result's ``adjuncts`` entry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa

from blobstate.adjunct.spec import AdjunctSpec
from blobstate.batch.contracts import JsonObject, JsonValue, as_int
from blobstate.batch.steps import TaskBatch


@dataclass(frozen=True)
class AdjunctPlan:
    """What the tasks of one batch apply of the adjunct stores (the driver's step decides it)."""

    recreate: tuple[str, ...] = ()
    """Partitioned adjunct stores emptied before this batch's side rows (the start's decision)."""
    defer_main: bool = False
    """Hold the main rows in the partition's state: a bootstrap adjunct is still loading its backlog."""
    broadcast: dict[str, JsonObject] = field(default_factory=dict)
    """Each broadcast adjunct's version for this batch (``adjunct.broadcast.PendingVersion``'s JSON)."""
    side_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A partitioned adjunct's files of this batch in its file source's order, when it read more than
    one: its rows are applied file by file (``adjunct.order``)."""

    def to_json(self) -> JsonObject:
        """This plan as a JSON object."""
        return {
            "recreate": list(self.recreate),
            "defer_main": self.defer_main,
            "broadcast": dict(self.broadcast),
            "side_files": {n: list(f) for n, f in self.side_files.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> AdjunctPlan:
        """The plan :meth:`to_json` wrote."""
        side_files = data.get("side_files") or {}
        assert isinstance(side_files, dict)
        return cls(
            recreate=tuple(data.get("recreate") or ()),  # type: ignore[arg-type]
            defer_main=bool(data.get("defer_main")),
            broadcast=dict(data.get("broadcast") or {}),  # type: ignore[arg-type]
            side_files={str(n): tuple(f) for n, f in side_files.items()},
        )


@dataclass(frozen=True)
class AdjunctTaskStep:
    """What every task of a batch applies and opens of the query's adjunct stores (see the module)."""

    adjuncts: tuple[AdjunctSpec, ...]
    """The query's adjunct stores: partitioned ones' rows arrive in the input, tagged; broadcast ones
    are read from the executor's copy."""
    plan: AdjunctPlan
    """What the driver decided for this batch."""
    name: ClassVar[str] = "adjuncts"

    def before_processing(self, task: TaskBatch) -> None:
        """Side rows to the store before any main row (which may be held back), broadcast copies opened;
        the side rows do not count as the task's input rows."""
        main, views, applied = self._open(task)
        task.batches = main
        task.views.update(views)
        task.result["adjuncts"] = applied
        side = [a for n, a in applied.items() if not n.startswith("$") and isinstance(a, Mapping)]
        task.taken_rows += sum(as_int(a.get("rows", 0)) for a in side)

    def _open(self, task: TaskBatch) -> tuple[list[pa.RecordBatch], dict[str, object], JsonObject]:
        """Apply the batch's partitioned side rows to the partition's store (before any main row) and
        open the executor's broadcast copies at the batch's version; returns the main rows, the views by
        name and what was applied."""
        from blobstate.adjunct.broadcast import open_replica
        from blobstate.adjunct.deferred import DEFERRED_CF, defer, take_deferred
        from blobstate.adjunct.records import apply_side_rows, split_side_rows
        from blobstate.adjunct.spec import PARTITIONED, TAG_COLUMN
        from blobstate.adjunct.step import pending_from_json
        from blobstate.adjunct.view import AdjunctView
        from blobstate.batch.executor import blob_store_for, resolve_local_dir

        where, plan, store = task.partition, self.plan, task.store
        data: Iterator[pa.RecordBatch] | list[pa.RecordBatch] = task.batches
        partitioned = [a for a in self.adjuncts if a.mode == PARTITIONED]
        main, sides = split_side_rows(data, TAG_COLUMN, [a.name for a in partitioned], plan.side_files)
        views: dict[str, object] = {}
        applied: JsonObject = {}
        for adjunct in self.adjuncts:
            if adjunct.mode == PARTITIONED:
                if adjunct.name in plan.recreate and adjunct.column_family in store.column_families():
                    store.clear(adjunct.column_family)
                applied[adjunct.name] = apply_side_rows(store, adjunct, sides.get(adjunct.name)).to_json()
                source = store
            else:
                pending = pending_from_json(plan.broadcast[adjunct.name])
                local_dir = resolve_local_dir(where.local_dir)
                replica, seconds = task.scope.enter_context(
                    open_replica(
                        blob_store_for(where.checkpoint_url), local_dir, where.query_id, adjunct, pending
                    )
                )
                applied[adjunct.name] = {"version": pending.version, "catch_up_seconds": round(seconds, 4)}
                source = replica
            views[adjunct.name] = AdjunctView(
                adjunct.name, source, adjunct.column_family, adjunct.schema, len(adjunct.key_in_union)
            )
        if plan.defer_main:
            applied["$deferred"] = defer(store, task.plan.committing, main)
            main = []
        elif DEFERRED_CF in store.column_families():
            held = take_deferred(store, main[0].schema if main else None)
            applied["$released"] = sum(b.num_rows for b in held)
            main = held + main
        return main, views, applied
