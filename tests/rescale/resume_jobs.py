"""A processing-time query with every kind of state and a partitioned adjunct store, and its plain-Python
reference, for the tests of a query resuming on a rescaled checkpoint. Imported by Spark's Python workers
(the ``spark`` fixture puts this directory on their ``PYTHONPATH``).

Main stream ``key STRING, value BIGINT``; side stream ``who STRING, tier STRING`` (the adjunct
``tiers``, partitioned: keyed like the main stream). Batch ``i`` reads file ``i`` of each stream; a
batch's side rows apply before its main rows; a null tier deletes the key's tier.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

MAIN = "key STRING, value BIGINT"
SIDE = "who STRING, tier STRING"
OUTPUT = (
    "key STRING, kind STRING, count BIGINT, recent STRING, parity STRING, timers BIGINT,"
    " leftovers BIGINT, tier STRING"
)
VARIABLES = ("count", "recent", "parity", "flags")
HOUR_MS = 3_600_000
KEYS = [f"k{i}" for i in range(7)]

Row = tuple[Any, ...]


class Ledger(StatefulProcessor):
    """Per key (time mode ProcessingTime): ``count`` (value, TTL an hour), ``recent`` (list: the last 3
    values), ``parity`` (map: even/odd -> (n, total)), ``flags`` (map, TTL 1 ms: no batch sees an earlier
    batch's), two processing-time timers (the batch's time + 1 ms, due in the next batch, and an hour
    away), and the key's tier from the ``tiers`` adjunct.

    An ``input`` row per key and batch (with the timers it found and the flags left over); a ``timer``
    row when the short timer fires (in the first batch after one with the key's input, if that batch has
    none for the key: input replaces the key's timers first).
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state and open the adjunct."""
        self.handle = handle
        self.count = handle.getValueState("count", "n BIGINT", ttlDurationMs=HOUR_MS)
        self.recent = handle.getListState("recent", "v BIGINT")
        self.parity = handle.getMapState("parity", "bucket STRING", "n BIGINT, total BIGINT")
        self.flags = handle.getMapState("flags", "flag STRING", "value BIGINT", ttlDurationMs=1)
        self.tiers = handle.getAdjunct("tiers")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Update every state variable and replace the key's timers."""
        now = timerValues.getCurrentProcessingTimeInMs()
        values = sorted(int(v) for pdf in rows for v in pdf["value"])
        leftovers = len(list(self.flags.keys()))
        timers = list(self.handle.listTimers())
        for ts in timers:
            self.handle.deleteTimer(ts)
        self.handle.registerTimer(now + 1)
        self.handle.registerTimer(now + HOUR_MS)
        old = self.count.get()
        self.count.update(((old[0] if old is not None else 0) + len(values),))
        self.recent.appendList([(v,) for v in values])
        current = [r[0] for r in self.recent.get()]
        if len(current) > 3:
            self.recent.put([(v,) for v in current[-3:]])
        for v in values:
            bucket = "even" if v % 2 == 0 else "odd"
            before = self.parity.getValue((bucket,))
            n, total = (0, 0) if before is None else (before[0], before[1])
            self.parity.updateValue((bucket,), (n + 1, total + v))
        self.flags.updateValue(("seen",), (len(values),))
        yield self._row(key[0], "input", len(timers), leftovers)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Report the key's state as the timer sees it."""
        yield self._row(key[0], "timer", -1, -1)

    def _row(self, key: str, kind: str, timers: int, leftovers: int) -> pd.DataFrame:
        count = self.count.get()
        recent = ",".join(str(r[0]) for r in self.recent.get())
        parity = ";".join(f"{k[0]}={v[0]}/{v[1]}" for k, v in sorted(self.parity.iterator()))
        tier = self.tiers.get(key)
        row = (key, kind, count[0], recent, parity, timers, leftovers, None if tier is None else tier[0])
        return pd.DataFrame(
            [row], columns=["key", "kind", "count", "recent", "parity", "timers", "leftovers", "tier"]
        )


def main_batches(n: int, seed: int) -> list[list[tuple[str, int]]]:
    """``n`` batches of ``(key, value)`` rows; each leaves some keys out (their timers fire)."""
    rng = random.Random(seed)
    return [[(rng.choice(KEYS[: 4 + i % 3]), rng.randint(-20, 90)) for _ in range(7)] for i in range(n)]


def side_batches(n: int, seed: int) -> list[list[tuple[str, str | None]]]:
    """``n`` batches of ``(who, tier)`` rows (a None tier deletes)."""
    rng = random.Random(seed)
    return [[(rng.choice(KEYS), rng.choice(["gold", "silver", None])) for _ in range(3)] for _ in range(n)]


def main_table(rows: list[tuple[str, int]]) -> pa.Table:
    """A main-stream file."""
    return pa.table(
        {"key": [k for k, _ in rows], "value": [v for _, v in rows]},
        schema=pa.schema([("key", pa.string()), ("value", pa.int64())]),
    )


def side_table(rows: list[tuple[str, str | None]]) -> pa.Table:
    """A side-stream file."""
    return pa.table(
        {"who": [k for k, _ in rows], "tier": [t for _, t in rows]},
        schema=pa.schema([("who", pa.string()), ("tier", pa.string())]),
    )


def reference(
    mains: list[list[tuple[str, int]]], sides: list[list[tuple[str, str | None]]]
) -> dict[int, list[Row]]:
    """Each batch's output rows (sorted as the test sink sorts them), in plain Python."""
    count: dict[str, int] = {}
    recent: dict[str, list[int]] = {}
    parity: dict[str, dict[str, tuple[int, int]]] = {}
    tiers: dict[str, str] = {}
    last_input: dict[str, int] = {}
    out: dict[int, list[Row]] = {}

    def row(k: str, kind: str, timers: int, leftovers: int) -> Row:
        text = ";".join(f"{b}={n}/{t}" for b, (n, t) in sorted(parity[k].items()))
        return (k, kind, count[k], ",".join(map(str, recent[k])), text, timers, leftovers, tiers.get(k))

    for b, (rows, side) in enumerate(zip(mains, sides, strict=True)):
        for who, tier in side:
            if tier is None:
                tiers.pop(who, None)
            else:
                tiers[who] = tier
        by_key: dict[str, list[int]] = {}
        for k, v in rows:
            by_key.setdefault(k, []).append(v)
        batch: list[Row] = []
        for k, vs in by_key.items():
            values = sorted(vs)
            timers = 0 if k not in last_input else 2 if last_input[k] == b - 1 else 1
            count[k] = count.get(k, 0) + len(values)
            recent[k] = (recent.get(k, []) + values)[-3:]
            buckets = parity.setdefault(k, {})
            for v in values:
                bucket = "even" if v % 2 == 0 else "odd"
                n, total = buckets.get(bucket, (0, 0))
                buckets[bucket] = (n + 1, total + v)
            batch.append(row(k, "input", timers, 0))
        for k, last in last_input.items():
            if last == b - 1 and k not in by_key:
                batch.append(row(k, "timer", -1, -1))
        for k in by_key:
            last_input[k] = b
        out[b] = sorted(batch, key=lambda r: tuple((v is not None, v) for v in r))
    return out
