"""Which executor each partition should run on next: sticky, balanced, and only on live executors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence


def assign_partitions(
    num_partitions: int,
    previous: Mapping[int, str],
    alive: Sequence[str],
) -> dict[int, str]:
    """Keep every partition on its previous executor while that executor lives; place the others.

    ``previous`` maps partitions to executor ids (where their state is); ``alive`` lists live executor
    ids. Orphaned or new partitions go to the least-loaded live executor (ties by id), so state moves
    only when its executor is gone. With no live executor known, returns an empty map (no preference).
    """
    if not alive:
        return {}
    live = sorted(set(alive))
    placement = {p: e for p, e in previous.items() if 0 <= p < num_partitions and e in live}
    load = Counter({e: 0 for e in live})
    load.update(placement.values())
    for p in range(num_partitions):
        if p not in placement:
            target = min(live, key=lambda e: (load[e], e))
            placement[p] = target
            load[target] += 1
    return placement
