"""Partition groups: the state partitions that one task of the processing stage runs, one after another.

A query's state is split into ``num_partitions`` state partitions (Spark's hash partitioning of the
key, the unit of a rescale, of a standby replica and of a commit entry, as Flink's key groups are). The
processing stage need not run one Spark task per state partition: at Spark's default of 200 partitions
and small batches, a task's own cost (scheduling, the Python worker's round trip, the stage closure)
is most of a batch. So a task runs a *group* of state partitions in turn, each still opened, processed,
committed and reported on its own (``task.run_task``), while Spark's shuffle still places every row in
its own state partition.

:func:`plan_groups` makes the groups of one batch from the partitions' preferred locations (a group
never mixes two locations, so host affinity and standby placement hold partition by partition), and
:func:`split_input` splits a group task's input, whose rows arrive partition after partition in the
group's order, into one input per partition (an empty one for a partition without rows). A task of
one partition is a group of one: the same check holds it to its partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from blobstate.errors import QueryError

AUTO_MIN_PARTITIONS_PER_CORE = 8
"""Automatic groups start where a stage has more than this many partitions per core of the cluster."""
AUTO_TASKS_PER_CORE = 4
"""Automatic groups give a stage about this many tasks per core (a slow task delays the batch less)."""


@dataclass(frozen=True)
class PartitionGroup:
    """The state partitions one task runs, in order, and the executor(s) the task prefers."""

    partitions: tuple[int, ...]
    location: str | None


def partitions_per_task(num_partitions: int, cores: int, configured: int) -> int:
    """How many state partitions a task runs: ``configured`` when positive; else (automatic) 1 unless the
    stage has more than ``AUTO_MIN_PARTITIONS_PER_CORE`` partitions per core, then enough for about
    ``AUTO_TASKS_PER_CORE`` tasks per core."""
    if configured > 0:
        return configured
    cores = max(1, cores)
    if num_partitions <= AUTO_MIN_PARTITIONS_PER_CORE * cores:
        return 1
    return math.ceil(num_partitions / (AUTO_TASKS_PER_CORE * cores))


def plan_groups(
    num_partitions: int, locations: Sequence[str | None] | None, per_task: int
) -> list[PartitionGroup]:
    """The groups of a stage: partitions with the same preferred location (``locations[p]``; None or no
    list: no preference) in increasing order, cut into runs of at most ``per_task``; locations in the
    order of their first partition."""
    if per_task < 1:
        raise ValueError(f"partitions per task must be at least 1, not {per_task}")
    if locations is not None and len(locations) != num_partitions:
        raise ValueError(f"{len(locations)} locations for {num_partitions} partitions")
    by_location: dict[str | None, list[int]] = {}
    for p in range(num_partitions):
        location = locations[p] if locations is not None else None
        by_location.setdefault(location or None, []).append(p)
    groups: list[PartitionGroup] = []
    for location, partitions in by_location.items():
        for start in range(0, len(partitions), per_task):
            groups.append(PartitionGroup(tuple(partitions[start : start + per_task]), location))
    return groups


class GroupInputError(QueryError, RuntimeError):
    """A group task's input does not split into its partitions' turns: rows of a partition outside the
    group or after its turn, or a partition's rows left unread before the next partition's turn."""


def split_input(
    batches: Iterator[pa.RecordBatch], group: Sequence[int], column: str
) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
    """Each partition of ``group`` in order, with an iterator of its rows (``column`` holds each row's
    partition; rows arrive partition after partition in the group's order, as the group's task reads
    Spark's shuffle blocks). A partition's iterator must be read to its end before the next partition is
    asked for: rows left unread raise instead of being dropped. Rows of a partition not in the group, or
    after its turn, raise :class:`GroupInputError`."""
    reader = _PartitionRuns(batches, column)
    position = {p: i for i, p in enumerate(group)}
    for index, partition in enumerate(group):
        reader.check_head(position, index)
        yield partition, reader.rows_of(partition, position, index)
        if reader.has_rows_of(partition):
            raise GroupInputError(
                f"the input of partition {partition} was not read to its end before the next partition"
                " of its task"
            )
    reader.check_head(position, len(group))


class _PartitionRuns:
    """Runs of rows of one partition each, cut from the task's record batches."""

    def __init__(self, batches: Iterator[pa.RecordBatch], column: str) -> None:
        self._batches = batches
        self._column = column
        self._runs: list[tuple[int, pa.RecordBatch]] = []
        self._seen: set[int] = set()

    def _fill(self) -> bool:
        """Cut the next non-empty batch into runs; False at the end of the input."""
        import pyarrow.compute as pc

        for batch in self._batches:
            if batch.num_rows == 0:
                continue
            values = batch.column(self._column)
            if values.null_count:
                raise GroupInputError("rows without a partition reached a task of the processing stage")
            if batch.num_rows == 1:
                starts = [0]
            else:
                changed = pc.not_equal(values.slice(1), values.slice(0, batch.num_rows - 1))
                starts = [0, *(i + 1 for i in pc.indices_nonzero(changed).to_pylist())]
            ends = [*starts[1:], batch.num_rows]
            self._runs = [
                (values[s].as_py(), batch.slice(s, e - s)) for s, e in zip(starts, ends, strict=True)
            ]
            self._runs.reverse()  # popped from the end
            return True
        return False

    def _head(self) -> int | None:
        if not self._runs and not self._fill():
            return None
        return self._runs[-1][0]

    def has_rows_of(self, partition: int) -> bool:
        """Whether the next unread rows are ``partition``'s."""
        return self._head() == partition

    def rows_of(self, partition: int, position: dict[int, int], index: int) -> Iterator[pa.RecordBatch]:
        """``partition``'s rows (at ``index`` of the group), up to the first row of another partition,
        which must be a later one of the group: rows out of turn fail the partition's own input, before
        it can end and be committed."""
        if partition in self._seen:
            raise GroupInputError(f"partition {partition} appears twice in one task's group")
        self._seen.add(partition)
        while self._head() == partition:
            yield self._runs.pop()[1]
        self.check_head(position, index + 1)

    def check_head(self, position: dict[int, int], index: int) -> None:
        """Raise :class:`GroupInputError` unless the next unread rows belong to the partition at
        ``index`` of the group or a later one (``position``: each partition's index in the group)."""
        head = self._head()
        if head is None or position.get(head, -1) >= index:
            return
        where = "after its turn" if head in position else "outside the task's group"
        raise GroupInputError(
            f"rows of partition {head} reached a task of the processing stage {where}: the shuffle did not"
            " keep Spark's hash partitioning (is adaptive execution coalescing partitions?)"
        )
