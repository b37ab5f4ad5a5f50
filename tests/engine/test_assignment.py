"""Sticky, balanced assignment of partitions to live executors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from blobstate.engine.assignment import assign_partitions


def test_partitions_stay_on_their_live_executor() -> None:
    previous = {0: "1", 1: "2", 2: "1", 3: "2"}
    assert assign_partitions(4, previous, ["1", "2"]) == previous


def test_orphans_of_a_lost_executor_move_to_the_least_loaded() -> None:
    placement = assign_partitions(4, {0: "1", 1: "2", 2: "1", 3: "2"}, ["1", "3"])
    assert placement[0] == "1" and placement[2] == "1"
    assert placement[1] == "3" and placement[3] == "3"


def test_no_live_executor_means_no_preference() -> None:
    assert assign_partitions(3, {0: "1"}, []) == {}


@given(
    n=st.integers(1, 12),
    previous=st.dictionaries(st.integers(0, 15), st.sampled_from("abcd"), max_size=12),
    alive=st.lists(st.sampled_from("abcde"), min_size=1, max_size=5),
)
def test_every_partition_placed_on_a_live_executor_and_survivors_keep_theirs(
    n: int, previous: dict[int, str], alive: list[str]
) -> None:
    placement = assign_partitions(n, previous, alive)
    assert sorted(placement) == list(range(n))
    assert set(placement.values()) <= set(alive)
    for p, e in previous.items():
        if p < n and e in alive:
            assert placement[p] == e
