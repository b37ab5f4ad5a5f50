"""A processor with every kind of state (value, list, map, a TTL'd value, timers) and its plain-Python
reference, shared by the state reader tests. Imported by Spark's Python workers (the ``spark`` fixture
puts this directory on their ``PYTHONPATH``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pandas as pd

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

OUTPUT = "key STRING, count BIGINT"
FAR_MS = 4_000_000_000_000
"""Timers are set this far in the future (2096): processing-time timers that never fire."""
TTL_MS = 86_400_000
KEYS = [f"u{i}" for i in range(9)]


def bucket(v: int) -> str:
    """The map state's user key of a value."""
    return "neg" if v < 0 else "small" if v < 50 else "big"


class EveryState(StatefulProcessor):
    """Per key: ``totals`` (value: count, total), ``recent`` (list: the values, sorted per batch, cut back
    to the last 4 when longer than 8), ``buckets`` (map: bucket -> (n, max)), ``visits`` (value with a
    TTL: batches seen) and a timer at ``FAR_MS + count`` (the previous one deleted when its count was
    odd). Time mode ProcessingTime."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state."""
        self.handle = handle
        self.totals = handle.getValueState("totals", "count BIGINT, total BIGINT")
        self.recent = handle.getListState("recent", "v BIGINT")
        self.buckets = handle.getMapState("buckets", "bucket STRING", "n BIGINT, max BIGINT")
        self.visits = handle.getValueState("visits", "batches INT", TTL_MS)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Update every state variable and the timer."""
        values = sorted(int(v) for pdf in rows for v in pdf["value"])
        old_count, old_total = self.totals.get() or (0, 0)
        count, total = old_count + len(values), old_total + sum(values)
        self.totals.update((count, total))
        self.recent.appendList([(v,) for v in values])
        current = [r[0] for r in self.recent.get()]
        if len(current) > 8:
            self.recent.put([(v,) for v in current[-4:]])
        for v in values:
            old = self.buckets.getValue((bucket(v),))
            n, top = (0, v) if old is None else (old[0], max(old[1], v))
            self.buckets.updateValue((bucket(v),), (n + 1, top))
        if count % 5 == 0:
            self.buckets.removeKey(("small",))
        seen = self.visits.get()
        self.visits.update((1 if seen is None else seen[0] + 1,))
        if old_count and old_count % 2 == 1:
            self.handle.deleteTimer(FAR_MS + old_count)
        self.handle.registerTimer(FAR_MS + count)
        yield pd.DataFrame({"key": [key[0]], "count": [count]})


def batches(n: int, rows: int = 24, seed: int = 5) -> list[list[tuple[str, int]]]:
    """``n`` batches of random ``(key, value)`` rows."""
    rng = random.Random(seed)
    return [[(rng.choice(KEYS), rng.randint(-30, 120)) for _ in range(rows)] for _ in range(n)]


def reference(batch_rows: list[list[tuple[str, int]]]) -> list[dict[str, Any]]:
    """The state after each batch (index i: version i + 1), as the reader's rows without partition ids:
    ``totals``/``visits``: key -> value tuple; ``recent``: key -> list of elements; ``buckets``:
    (key, user key) -> value; ``$timers``: sorted (key, ms)."""
    totals: dict[str, tuple] = {}
    recent: dict[str, list] = {}
    buckets: dict[tuple, tuple] = {}
    visits: dict[str, tuple] = {}
    timers: set[tuple[str, int]] = set()
    out = []
    for rows in batch_rows:
        by_key: dict[str, list[int]] = {}
        for k, v in rows:
            by_key.setdefault(k, []).append(v)
        for k, vs in by_key.items():
            values = sorted(vs)
            old_count, old_total = totals.get(k, (0, 0))
            count = old_count + len(values)
            totals[k] = (count, old_total + sum(values))
            lst = recent.setdefault(k, []) + [(v,) for v in values]
            recent[k] = lst[-4:] if len(lst) > 8 else lst
            for v in values:
                old = buckets.get((k, bucket(v)))
                n, top = (0, v) if old is None else (old[0], max(old[1], v))
                buckets[(k, bucket(v))] = (n + 1, top)
            if count % 5 == 0:
                buckets.pop((k, "small"), None)
            visits[k] = (visits.get(k, (0,))[0] + 1,)
            if old_count and old_count % 2 == 1:
                timers.discard((k, FAR_MS + old_count))
            timers.add((k, FAR_MS + count))
        out.append(
            {
                "totals": dict(totals),
                "recent": {k: list(v) for k, v in recent.items()},
                "buckets": dict(buckets),
                "visits": dict(visits),
                "$timers": sorted(timers),
            }
        )
    return out
