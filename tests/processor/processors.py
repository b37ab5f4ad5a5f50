"""Example processors written exactly as for Spark's ``transformWithStateInPandas``.

Only the import differs from a Spark program (and ``blobstate.processor.StatefulProcessor`` is a
subclass of PySpark's, so these classes also run under real Spark unchanged). Each documents the
output schema and time mode to use with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, RunningCount
from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

__all__ = ["RUNNING_COUNT_OUTPUT", "RunningCount"]

SESSION_OUTPUT = "key STRING, start_ms BIGINT, end_ms BIGINT, events BIGINT"


class ProcessingTimeSessions(StatefulProcessor):
    """Sessions closed after ``gap_ms`` of processing time without events (time mode ProcessingTime).

    Input ``key: string, value: bigint``. A timer at ``batch time + gap_ms`` is moved forward on
    every batch with events; when it fires the session is emitted (:data:`SESSION_OUTPUT`) and
    cleared. The state also has a TTL of ``ttl_ms``, a safety net should a timer ever be lost.
    """

    def __init__(self, gap_ms: int = 10_000, ttl_ms: int = 3_600_000) -> None:
        self.gap_ms = gap_ms
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState(
            "session", "start_ms BIGINT, last_ms BIGINT, events BIGINT", self.ttl_ms
        )

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        now = timerValues.getCurrentProcessingTimeInMs()
        events = sum(len(pdf) for pdf in rows)
        old = self.session.get()
        if old is None:
            start, total = now, events
        else:
            start, total = old[0], old[2] + events
        for ts in list(self.handle.listTimers()):
            self.handle.deleteTimer(ts)
        self.handle.registerTimer(now + self.gap_ms)
        self.session.update((start, now, total))
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        state = self.session.get()
        self.session.clear()
        if state is not None:
            yield pd.DataFrame(
                {
                    "key": [key[0]],
                    "start_ms": [state[0]],
                    "end_ms": [expiredTimerInfo.getExpiryTimeInMs()],
                    "events": [state[2]],
                }
            )


class EventTimeSessions(StatefulProcessor):
    """Sessions by event time (time mode EventTime): closed when the watermark passes last event + gap.

    Input ``key: string, ts: timestamp``; output :data:`SESSION_OUTPUT` with event times in ms.
    """

    def __init__(self, gap_ms: int = 10_000) -> None:
        self.gap_ms = gap_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start_ms BIGINT, last_ms BIGINT, events BIGINT")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        first = None
        last = None
        events = 0
        for pdf in rows:
            ms = pdf["ts"].astype("datetime64[ms]").astype("int64")
            first = int(ms.min()) if first is None else min(first, int(ms.min()))
            last = int(ms.max()) if last is None else max(last, int(ms.max()))
            events += len(pdf)
        old = self.session.get()
        if old is not None:
            self.handle.deleteTimer(old[1] + self.gap_ms)
            first, last, events = min(first, old[0]), max(last, old[1]), events + old[2]
        self.session.update((first, last, events))
        self.handle.registerTimer(last + self.gap_ms)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        start, last, events = self.session.get()
        self.session.clear()
        yield pd.DataFrame({"key": [key[0]], "start_ms": [start], "end_ms": [last], "events": [events]})


BASKET_OUTPUT = "key STRING, recent STRING, categories BIGINT, top_category STRING, top_count BIGINT"


class Baskets(StatefulProcessor):
    """ListState of the last ``keep`` items and MapState of counts per category (time mode None).

    Input ``key: string, item: string, category: string``; output :data:`BASKET_OUTPUT`, one row
    per key per batch: the recent items joined by ``,``, the number of categories seen, and the
    most frequent category (ties broken by name).
    """

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.recent = handle.getListState("recent", "item STRING")
        self.counts = handle.getMapState("counts", "category STRING", "count BIGINT")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        items = [item for (item,) in self.recent.get()]
        for pdf in rows:
            for item, category in zip(pdf["item"], pdf["category"], strict=True):
                items.append(item)
                old = self.counts.getValue((category,))
                self.counts.updateValue((category,), ((old[0] if old else 0) + 1,))
        items = items[-self.keep :]
        self.recent.put([(i,) for i in items])
        counts = dict((k[0], v[0]) for k, v in self.counts.iterator())
        top = min(counts, key=lambda c: (-counts[c], c))
        yield pd.DataFrame(
            {
                "key": [key[0]],
                "recent": [",".join(items)],
                "categories": [len(counts)],
                "top_category": [top],
                "top_count": [counts[top]],
            }
        )
