"""A batch's commit, built from its plan, its tasks' results and the commit before it: no Spark, no I/O.

:func:`build_commit` decides everything ``commits/<v>.json`` records: each partition's uid and objects,
the retained window and the horizon (``state/retention.py``), the event-time watermark, the placement,
the metrics, what each per-batch step adds (:class:`~blobstate.batch.steps.CommitPart`), Spark's batch
id (the plan's: after a rescale it is no longer ``version - 1``, ``batch_versions.py``) and the partition
layout (the previous commit's: ``num_partitions`` and ``layout_from`` carry forward from a rescale). The
driver writes it; nothing here reads or writes storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from blobstate.batch.contracts import BatchPlan, JsonObject, JsonValue, TaskResult
from blobstate.batch.steps import CommitPart
from blobstate.lineage.commitlog import Commit
from blobstate.lineage.refs import PartitionObjects
from blobstate.state.retention import declared_horizon, retained_from


@dataclass(frozen=True)
class CommitContext:
    """What a commit needs besides the plan and the results: the query's settings and the run's."""

    operator: str
    writer: str
    """The driver run writing the commit."""
    min_versions_to_retain: int
    time_mode: str = "None"
    watermark_delay_ms: int = 0
    needed_from: int = 0
    """The oldest version a cleanup of this run found still needed (0: none ran yet)."""
    seconds: float = 0.0
    """The batch's time so far (``metrics.seconds``)."""
    source: Mapping[str, JsonValue] | None = None
    """Where the batch's input came from (``replay.SourceProgress``)."""
    metrics: JsonObject = field(default_factory=dict)
    """The stage's timings and counts (``stage_seconds``, ``spark_recovery_seconds``, ...)."""
    parts: Sequence[CommitPart] = ()
    """The per-batch steps' contributions, in step order."""


def next_watermark(
    watermark_ms: int | None, results: Mapping[int, TaskResult], time_mode: str, delay_ms: int
) -> int | None:
    """The event-time watermark after the batch: the largest event time seen minus the delay, never
    below ``watermark_ms`` (unchanged outside time mode EventTime, or when no row had an event time)."""
    if time_mode != "EventTime":
        return watermark_ms
    seen = [r.max_event_time_ms for r in results.values() if r.max_event_time_ms is not None]
    if not seen:
        return watermark_ms
    candidate = max(seen) - delay_ms
    return candidate if watermark_ms is None else max(watermark_ms, candidate)


def build_commit(
    plan: BatchPlan, results: Mapping[int, TaskResult], previous: Commit | None, context: CommitContext
) -> Commit:
    """The commit of the batch ``plan`` describes, whose tasks reported ``results``, after ``previous``
    (None: the query's first batch)."""
    version = plan.committing
    operator = context.operator
    checkpoints = {operator: {p: r.uid for p, r in sorted(results.items())}}
    objects = {operator: {p: PartitionObjects.from_json(r.objects) for p, r in sorted(results.items())}}
    placement: dict[int, str | JsonObject] = {
        p: {"executor_id": r.executor_id, "host": r.host} for p, r in sorted(results.items())
    }
    step_metrics: JsonObject = {}
    adjunct_offsets: JsonObject | None = None
    for part in context.parts:
        checkpoints.update(part.checkpoints)
        objects.update(part.objects)
        step_metrics.update(part.metrics)
        if part.placement is not None:
            placement = dict(part.placement)
        if part.adjunct_offsets is not None:
            adjunct_offsets = part.adjunct_offsets
    watermark = plan.run.watermark_ms
    retained = retained_from(previous, version, context.min_versions_to_retain)
    return Commit(
        version=version,
        batch_id=plan.batch,
        checkpoints=checkpoints,
        objects=objects,
        retained_from=retained,
        horizon=declared_horizon(previous, context.needed_from, retained),
        placement=placement,
        watermark_ms=next_watermark(watermark, results, context.time_mode, context.watermark_delay_ms),
        metrics={
            "eviction_watermark_ms": watermark,
            "seconds": round(context.seconds, 3),
            "partitions": {p: r.metrics() for p, r in sorted(results.items())},
            "objects": {p: list(r.objects_written) for p, r in results.items()},
            **context.metrics,
            **step_metrics,
        },
        adjunct_offsets=adjunct_offsets,
        source=None if context.source is None else dict(context.source),
        writer=context.writer,
        # A rescaled checkpoint's layout carries forward: every commit after a rescale records it.
        num_partitions=None if previous is None else previous.num_partitions,
        layout_from=1 if previous is None else previous.layout_from,
        # A query keyed by a TIMESTAMP stores it as an instant (a checkpoint of an earlier release was
        # converted at the start); the mark carries forward.
        instant_keys=bool(plan.run.instant_keys) or (previous is not None and previous.instant_keys),
    )
