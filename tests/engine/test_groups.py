"""Partition groups: how a stage's state partitions are grouped into tasks, and how a group task's input
is split back into each partition's rows (``engine/groups.py``; the Spark run is in test_task_groups)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstate.engine.groups import (
    GroupInputError,
    PartitionGroup,
    partitions_per_task,
    plan_groups,
    split_input,
)

COLUMN = "p"


def _batches(partitions: list[int], sizes: list[int]) -> list[pa.RecordBatch]:
    """Rows numbered 0.. with their partition, cut into record batches of the given sizes."""
    table = pa.table({COLUMN: pa.array(partitions, pa.int32()), "row": list(range(len(partitions)))})
    out, start = [], 0
    for size in sizes:
        out.append(table.slice(start, size).combine_chunks().to_batches()[0] if size else _empty(table))
        start += size
    assert start == len(partitions)
    return out


def _empty(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=table.schema)


def _read(batches: list[pa.RecordBatch], group: list[int]) -> dict[int, list[int]]:
    return {
        p: [r for b in rows for r in b.column("row").to_pylist()]
        for p, rows in split_input(iter(batches), group, COLUMN)
    }


def test_automatic_groups_start_beyond_eight_partitions_a_core_and_aim_at_four_tasks_a_core() -> None:
    assert partitions_per_task(200, 2, 0) == 25
    assert partitions_per_task(16, 2, 0) == 1
    assert partitions_per_task(17, 2, 0) == 3
    assert partitions_per_task(6, 2, 0) == 1
    assert partitions_per_task(200, 0, 0) == 50  # no cores known: counted as one
    assert partitions_per_task(6, 2, 4) == 4  # configured wins


def test_groups_never_mix_locations_and_keep_each_partition_once() -> None:
    locations = ["a", "b", "a", None, "a", "b", None, "a"]
    groups = plan_groups(8, locations, 2)
    assert groups == [
        PartitionGroup((0, 2), "a"),
        PartitionGroup((4, 7), "a"),
        PartitionGroup((1, 5), "b"),
        PartitionGroup((3, 6), None),
    ]
    assert plan_groups(5, None, 2) == [
        PartitionGroup((0, 1), None),
        PartitionGroup((2, 3), None),
        PartitionGroup((4,), None),
    ]
    assert [g.partitions for g in plan_groups(3, ["", None, "x"], 5)] == [(0, 1), (2,)]
    with pytest.raises(ValueError, match="3 locations for 4 partitions"):
        plan_groups(4, ["a", "b", "c"], 2)
    with pytest.raises(ValueError, match="at least 1"):
        plan_groups(4, None, 0)


@settings(max_examples=200, deadline=None)
@given(
    num_partitions=st.integers(1, 40),
    per_task=st.integers(1, 12),
    hosts=st.lists(st.sampled_from(["h1", "h2", "h3", None]), min_size=40, max_size=40),
)
def test_every_partition_is_in_exactly_one_group_of_its_location(
    num_partitions: int, per_task: int, hosts: list[str | None]
) -> None:
    locations = hosts[:num_partitions]
    groups = plan_groups(num_partitions, locations, per_task)
    seen = [p for g in groups for p in g.partitions]
    assert sorted(seen) == list(range(num_partitions))
    for group in groups:
        assert 1 <= len(group.partitions) <= per_task
        assert {locations[p] for p in group.partitions} == {group.location}


def test_a_group_input_is_split_at_partition_boundaries_inside_and_across_batches() -> None:
    partitions = [3] * 4 + [5] * 3 + [9] * 5
    batches = _batches(partitions, [2, 3, 0, 6, 1])  # batch 1 spans 3|5, batch 3 spans 5|9
    assert _read(batches, [3, 4, 5, 9, 11]) == {
        3: [0, 1, 2, 3],
        4: [],
        5: [4, 5, 6],
        9: [7, 8, 9, 10, 11],
        11: [],
    }


def test_a_group_without_rows_still_gives_every_partition_its_turn() -> None:
    assert _read([], [1, 2]) == {1: [], 2: []}


def test_rows_outside_the_group_or_after_their_turn_are_refused() -> None:
    with pytest.raises(GroupInputError, match=r"partition 7 .* outside the task's group"):
        _read(_batches([1, 7], [2]), [1, 2])
    with pytest.raises(GroupInputError, match=r"partition 1 .* after its turn"):
        _read(_batches([1, 2, 1], [3]), [1, 2])
    with pytest.raises(GroupInputError, match=r"partition 2 .* after its turn"):
        _read(_batches([3, 2], [2]), [2, 3])


def test_rows_out_of_turn_fail_the_partition_being_read_before_its_input_ends() -> None:
    """The partition whose rows the foreign row follows never sees its input end (so it never commits):
    its own iteration raises, also in a task of one partition."""
    for group, partitions in (([1, 2], [1, 1, 7]), ([4], [4, 5]), ([2, 3], [2, 9])):
        parts = split_input(iter(_batches(partitions, [len(partitions)])), group, COLUMN)
        _, rows = next(parts)
        with pytest.raises(GroupInputError, match="outside the task's group"):
            list(rows)


def test_a_partition_read_only_in_part_raises_instead_of_dropping_rows() -> None:
    parts = split_input(iter(_batches([1, 1, 2], [1, 2])), [1, 2], COLUMN)
    _, rows = next(parts)
    next(rows)  # one of partition 1's two rows
    with pytest.raises(GroupInputError, match="input of partition 1 was not read to its end"):
        next(parts)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_split_input_gives_each_partition_exactly_its_rows(data: st.DataObject) -> None:
    group = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=8, unique=True))
    counts = data.draw(st.lists(st.integers(0, 6), min_size=len(group), max_size=len(group)))
    partitions = [p for p, n in zip(group, counts, strict=True) for _ in range(n)]
    sizes: list[int] = []
    left = len(partitions)
    while left:
        size = data.draw(st.integers(1, left))
        sizes.append(size)
        left -= size
    read = _read(_batches(partitions, sizes), group)
    expected: dict[int, list[int]] = {p: [] for p in group}
    for row, p in enumerate(partitions):
        expected[p].append(row)
    assert read == expected
