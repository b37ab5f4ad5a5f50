"""The example processors over several batches, against plain-Python references."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
from processor_helpers import run, run_with_stats, table
from processors import (
    BASKET_OUTPUT,
    RUNNING_COUNT_OUTPUT,
    SESSION_OUTPUT,
    Baskets,
    EventTimeSessions,
    ProcessingTimeSessions,
    RunningCount,
)

from blobstate.state.store import RocksStateStore


def test_running_count_matches_a_dict(store: Any) -> None:
    rng = random.Random(1)
    counts: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for _ in range(5):
        keys = [f"k{rng.randrange(20)}" for _ in range(200)]
        values = [rng.randrange(100) for _ in keys]
        rows = run(RunningCount(), store, table(key=keys, value=values), output_schema=RUNNING_COUNT_OUTPUT)
        for k, v in zip(keys, values, strict=True):
            counts[k] += 1
            totals[k] += v
        assert rows == [{"key": k, "count": counts[k], "total": totals[k]} for k in sorted(set(keys))]


def test_running_count_with_initial_state(store: Any) -> None:
    initial = table(key=["a", "z"], count=[10, 5], total=[100, 50])
    rows = run(
        RunningCount(),
        store,
        table(key=["a", "b"], value=[1, 2]),
        output_schema=RUNNING_COUNT_OUTPUT,
        initial_state=initial,
    )
    assert rows == [{"key": "a", "count": 11, "total": 101}, {"key": "b", "count": 1, "total": 2}]
    rows = run(RunningCount(), store, table(key=["z"], value=[1]), output_schema=RUNNING_COUNT_OUTPUT)
    assert rows == [{"key": "z", "count": 6, "total": 51}]


def test_processing_time_sessions_close_after_the_gap(store_path: Any) -> None:
    gap = 1_000
    # (batch time, keys with events)
    schedule = [
        (0, ["a", "b"]),
        (500, ["a"]),
        (1_000, []),
        (1_400, ["b"]),
        (1_500, []),
        (2_400, []),
        (3_000, ["a"]),
    ]
    emitted = []
    for ts, keys in schedule:
        with RocksStateStore.open(store_path) as s:
            rows = run(
                ProcessingTimeSessions(gap_ms=gap),
                s,
                table(key=keys, value=[1] * len(keys)) if keys else None,
                output_schema=SESSION_OUTPUT,
                time_mode="ProcessingTime",
                batch_timestamp_ms=ts,
            )
        emitted += [(ts, r["key"], r["start_ms"], r["end_ms"], r["events"]) for r in rows]
    # b: events at 0 -> timer 1000 fires at batch 1000; a: 0, 500 -> timer 1500; b again at 1400 -> 2400
    assert emitted == [(1_000, "b", 0, 1_000, 1), (1_500, "a", 0, 1_500, 2), (2_400, "b", 1_400, 2_400, 1)]


def test_processing_time_sessions_ttl_cleans_up_abandoned_state(store: Any) -> None:
    class NoTimers(ProcessingTimeSessions):
        def handleInputRows(self, key, rows, timerValues):
            self.session.update((0, 0, sum(len(p) for p in rows)))
            return iter([])

    def batch(ts: int, data: Any) -> Any:
        return run_with_stats(
            NoTimers(ttl_ms=100),
            store,
            data,
            output_schema=SESSION_OUTPUT,
            time_mode="ProcessingTime",
            batch_timestamp_ms=ts,
        )[1]

    batch(0, table(key=["a"], value=[1]))
    assert batch(99, None).ttl_values_removed == 0
    assert batch(100, None).ttl_values_removed == 1


def test_event_time_sessions_against_a_reference(store: Any) -> None:
    rng = random.Random(3)
    gap = 10_000
    watermark_delay = 5_000
    batches = []
    clock = 0
    for _ in range(8):
        events = []
        for _ in range(30):
            clock += rng.randrange(0, 1_500) + (25_000 if rng.random() < 0.05 else 0)
            events.append((f"u{rng.randrange(4)}", clock + rng.randrange(-12_000, 0)))
        batches.append(events)
    batches.append([("zz", clock + 100_000)])  # pushes the watermark past every open session

    # reference: Spark-like batches; watermark for batch n = max event time seen before it - delay
    emitted = []
    expected = []
    open_sessions: dict[str, list[int]] = {}
    max_seen: int | None = None
    watermark = 0
    dropped = 0
    for events in [*batches, [], []]:
        late_watermark = watermark
        watermark = max(watermark, (max_seen or 0) - watermark_delay)
        kept = [(k, t) for k, t in events if t > late_watermark]
        dropped += len(events) - len(kept)
        by_key: dict[str, list[int]] = defaultdict(list)
        for k, t in kept:
            by_key[k].append(t)
        for k, ts in by_key.items():
            s = open_sessions.get(k)
            open_sessions[k] = (
                [min(ts), max(ts), len(ts)] if s is None else [min(s[0], *ts), max(s[1], *ts), s[2] + len(ts)]
            )
        closing = sorted((s[1] + gap, k) for k, s in open_sessions.items() if s[1] + gap <= watermark)
        for _, k in closing:
            s = open_sessions.pop(k)
            expected.append((k, s[0], s[1], s[2]))

        data = (
            pa.table(
                {
                    "key": [k for k, _ in events],
                    "ts": pa.array([t * 1000 for _, t in events], pa.timestamp("us")),
                }
            )
            if events
            else None
        )
        max_event_time: list[int | None] = [None]
        rows = run(
            EventTimeSessions(gap_ms=gap),
            store,
            data,
            output_schema=SESSION_OUTPUT,
            time_mode="EventTime",
            batch_timestamp_ms=0,
            watermark_ms=watermark,
            late_watermark_ms=late_watermark,
            event_time_column="ts",
            max_event_time=max_event_time,
        )
        emitted += [(r["key"], r["start_ms"], r["end_ms"], r["events"]) for r in rows]
        if max_event_time[0] is not None:
            max_seen = max(max_seen or max_event_time[0], max_event_time[0])
    assert len(expected) >= 3 and dropped, "the scenario should close sessions and drop late events"
    assert emitted == expected


def test_baskets_list_and_map_state(store: Any) -> None:
    rng = random.Random(5)
    recent: dict[str, list[str]] = defaultdict(list)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for _ in range(4):
        keys = [f"c{rng.randrange(5)}" for _ in range(40)]
        items = [f"i{rng.randrange(50)}" for _ in keys]
        cats = [rng.choice(["food", "toys", "books"]) for _ in keys]
        rows = run(
            Baskets(keep=3), store, table(key=keys, item=items, category=cats), output_schema=BASKET_OUTPUT
        )
        for k, i, c in zip(keys, items, cats, strict=True):
            recent[k] = (recent[k] + [i])[-3:]
            counts[k][c] += 1
        expected = []
        for k in sorted(set(keys)):
            top = min(counts[k], key=lambda c, k=k: (-counts[k][c], c))
            expected.append(
                {
                    "key": k,
                    "recent": ",".join(recent[k]),
                    "categories": len(counts[k]),
                    "top_category": top,
                    "top_count": counts[k][top],
                }
            )
        assert rows == expected
