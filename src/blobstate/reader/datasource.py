"""``spark.read.format("blobstate")``: a PySpark Python data source over a query checkpoint's state.

Options (names are case-insensitive): ``version`` (default: the latest committed), ``operator`` (default:
the only one), ``partition`` (an int or a comma-separated list; default: all), ``stateVarName`` (default:
the only state variable) and ``readRegisteredTimers`` (``true``: one row per registered timer instead of
a state variable's rows; Spark's own state reader names the option so). The path is the checkpoint URL.
One input partition per state partition, so partitions restore in parallel on the executors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from blobstate.reader.plan import ReadPlan, plan_read
from blobstate.reader.rows import partition_rows
from blobstate.reader.variables import TIMERS, StateReadError

NAME = "blobstate"
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no", ""}


def plan_from_options(options: Mapping[str, Any], schema: StructType | None = None) -> ReadPlan:
    """The :class:`ReadPlan` the data source options ask for (checked against the checkpoint); with the
    ``schema`` already known and a state variable named, no partition is restored to plan it."""
    opts = {str(k).lower(): v for k, v in options.items()}
    url = opts.get("path")
    if not url:
        raise StateReadError('give the checkpoint URL: spark.read.format("blobstate").load(URL)')
    version = opts.get("version")
    if version not in (None, ""):
        try:
            version = int(version)
        except ValueError:
            raise StateReadError(f"option version must be an int, not {version!r}") from None
    else:
        version = None
    read_timers = str(opts.get("readregisteredtimers", "false")).strip().lower()
    if read_timers not in _TRUE | _FALSE:
        raise StateReadError(f"option readRegisteredTimers must be true or false, not {read_timers!r}")
    state_var = opts.get("statevarname") or None
    if read_timers in _TRUE:
        if state_var not in (None, TIMERS):
            raise StateReadError("give either stateVarName or readRegisteredTimers=true, not both")
        state_var = TIMERS
    return plan_read(
        url, version=version, operator=opts.get("operator") or None, partition=opts.get("partition"),
        state_var=state_var, schema=schema,
    )  # fmt: skip


class StatePartition(InputPartition):
    """One state partition to read."""

    def __init__(self, partition: int) -> None:
        super().__init__(partition)
        self.partition = partition


class BlobstateDataSource(DataSource):
    """The ``blobstate`` format: the state of a blobstate query checkpoint as rows."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``blobstate``."""
        return NAME

    def schema(self) -> StructType:
        """The rows' schema, from the state variable's recorded schema."""
        return plan_from_options(self.options).schema

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader of the planned version, with one input partition per state partition."""
        return BlobstateReader(plan_from_options(self.options, schema), schema)


class BlobstateReader(DataSourceReader):
    """Reads each state partition on an executor: restore into a temporary directory, decode, delete."""

    def __init__(self, plan: ReadPlan, schema: StructType) -> None:
        self.plan = plan
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        """One input partition per state partition read."""
        return [StatePartition(p) for p in self.plan.partitions]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The rows of one state partition."""
        p = partition.partition if isinstance(partition, StatePartition) else int(partition.value)
        plan = self.plan
        yield from partition_rows(plan.url, plan.version, plan.operator, p, plan.state_var, self.schema)
