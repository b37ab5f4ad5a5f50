"""Reading a query checkpoint's state without running the query.

:func:`read_state` returns a partition's (or every partition's) state at a retained version as a Spark
DataFrame, through the ``blobstate`` Python data source (:mod:`blobstate.reader.datasource`); rows are
flattened as Spark's own state reader flattens ``transformWithState`` state (:mod:`.schema`). The
checkpoint is only read, never written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blobstate.blobstore.schemes import normalize_location
from blobstate.reader.variables import TIMERS, StateReadError

if TYPE_CHECKING:
    from blobstate.reader.plan import ReadPlan

__all__ = ["TIMERS", "StateReadError", "read_planned", "read_state", "register_reader"]


def register_reader(spark: Any) -> None:
    """Register the ``blobstate`` data source with ``spark`` (idempotent).

    A registration carries the Python workers' environment of its moment (``sparkContext.environment``,
    where credentials for a blob store may have been set since the session started), so the first one in
    a session replaces the one PySpark made at start-up from the installed ``pyspark_blobstate`` module
    (Spark logs one line saying so), and a later one registers again only when that environment changed
    since: not on every state read."""
    from blobstate.reader.datasource import BlobstateDataSource

    environment = _workers_environment(spark)
    if environment is not None and getattr(spark, _REGISTERED_WITH, None) == environment:
        return
    spark.dataSource.register(BlobstateDataSource)
    if environment is not None:
        setattr(spark, _REGISTERED_WITH, environment)


_REGISTERED_WITH = "_blobstate_reader_environment"
"""The attribute of a session that holds the workers' environment of blobstate's last registration."""


def _workers_environment(spark: Any) -> tuple[tuple[str, str], ...] | None:
    """The Python workers' environment of a classic session, None when there is none to compare
    (Spark Connect: then every call registers)."""
    try:
        environment = spark.sparkContext.environment
    except Exception:  # a Spark Connect session has no SparkContext
        return None
    return tuple(sorted((str(k), str(v)) for k, v in environment.items()))


def _warn_if_lost(checkpoint: str) -> None:
    """Warn (:class:`~blobstate.state.lost.LostCommitWarning`, and the log) when the checkpoint's newest
    commits were lost or its commit log has holes: the version read as the newest is then not."""
    import logging
    import warnings

    from blobstate.blobstore import open_blob_store
    from blobstate.state.lost import LostCommitWarning, scan_for_loss

    with open_blob_store(checkpoint) as store:
        lines = scan_for_loss(store).warnings()
    for line in lines:
        logging.getLogger(__name__).warning("%s", line)
        warnings.warn(LostCommitWarning(line), stacklevel=3)


def read_state(
    spark: Any,
    checkpoint: str,
    *,
    version: int | None = None,
    operator: str | None = None,
    partition: int | None = None,
    state_var: str | None = None,
    timers: bool = False,
) -> Any:
    """The state of the query checkpoint at ``checkpoint`` as a DataFrame.

    ``version`` defaults to the latest committed one and must be retained; ``partition`` None reads every
    partition (in parallel, one Spark task each); ``state_var`` names the state variable (None: the only
    one); ``timers=True`` reads the registered timers instead. The request is checked here, on the
    driver, so a mistake is one :class:`StateReadError` naming what exists. When the checkpoint's newest
    commits were lost (or its commit log has holes) it warns first
    (:class:`~blobstate.state.lost.LostCommitWarning`): the version it reads as the latest is not.
    """
    from blobstate.reader.plan import plan_read

    checkpoint = normalize_location(checkpoint)  # Python workers run elsewhere: not relative to our cwd
    if timers and state_var not in (None, TIMERS):
        raise StateReadError("give either state_var or timers=True, not both")
    plan = plan_read(
        checkpoint, version=version, operator=operator, partition=partition,
        state_var=TIMERS if timers else state_var,
    )  # fmt: skip
    _warn_if_lost(checkpoint)
    register_reader(spark)
    return read_planned(spark, plan)


def read_planned(spark: Any, plan: ReadPlan) -> Any:
    """The DataFrame of a read already planned (:mod:`.plan`), through the ``blobstate`` data source
    (registered by the caller)."""
    reader = spark.read.format("blobstate").schema(plan.schema)
    options = {"version": str(plan.version), "operator": plan.operator, "stateVarName": plan.state_var}
    options["partition"] = ",".join(str(p) for p in plan.partitions)
    return reader.options(**options).load(plan.url)
