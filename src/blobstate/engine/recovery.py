"""How long a batch's processing stage spent recovering from failures (``spark_recovery_seconds``).

A batch without failures recovers nothing: 0. Otherwise the figure is the time from the stage's first
task start to the start of the last retried task that produced a committed partition, plus the runs of
the stage blobstate discarded before it (outputs lost before the sink read them). A task is retried when
its attempt number is above 0 (Spark ran it again after its executor was lost or the attempt failed) or
when it started in a stage attempt Spark resubmitted (after a shuffle fetch failure, with the lost map
outputs recomputed first). That span holds what the failure cost the stage: detecting the lost
executor, fetch retries, the recomputed map outputs and the wait for an executor to run the retry.

Task start times are the executors' wall clocks. The driver's clock enters only when every partition
was retried (the job's submission is then the start) or Spark resubmitted the stage (its submission
time tells which tasks ran in the new attempt): a clock skew between hosts shifts those cases by it.

It leaves out the rest of the stage (reading and shuffling the input, scheduling, the tasks'
own work: ``spark_overhead_seconds`` and the per-partition seconds) and failures in the input's shuffle
map stage before any processing task started.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def retried_partitions(
    metas: Mapping[int, Mapping[str, Any]], resubmitted_at: float | None = None
) -> list[int]:
    """The partitions whose committed task is a retry: a task attempt above 0, or one started (wall
    clock, ``started_at``) at or after ``resubmitted_at``, when Spark resubmitted the stage."""
    return sorted(
        p
        for p, m in metas.items()
        if int(m.get("attempt") or 0) > 0
        or (resubmitted_at is not None and float(m["started_at"]) >= resubmitted_at)
    )


def spark_recovery_seconds(
    metas: Mapping[int, Mapping[str, Any]],
    *,
    submitted_at: float,
    resubmitted_at: float | None = None,
    earlier_runs_seconds: float = 0.0,
) -> float:
    """Seconds the batch's processing stage spent on retries (0 without a failure); see the module.

    ``metas`` are the committed tasks' metadata (``started_at``: wall clock, ``attempt``);
    ``submitted_at`` is when the driver submitted the committed run's job (the start when every
    partition was retried); ``resubmitted_at`` when Spark submitted the stage's last attempt, if it
    resubmitted it; ``earlier_runs_seconds`` the time of the runs blobstate discarded before it.
    """
    retried = retried_partitions(metas, resubmitted_at)
    within = 0.0
    if retried:
        first_tries = [float(m["started_at"]) for p, m in metas.items() if p not in retried]
        origin = min(first_tries) if first_tries else submitted_at
        within = max(0.0, max(float(metas[p]["started_at"]) for p in retried) - origin)
    return round(max(0.0, earlier_runs_seconds) + within, 3)
