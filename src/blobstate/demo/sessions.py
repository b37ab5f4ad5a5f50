"""The demo's stateful processor and a plain-Python reference of the same semantics.

A session is a run of one user's clicks with gaps of at most ``GAP_MS``. The processor keeps the open
session in a ValueState and an event-time timer at ``last click + GAP_MS``; it emits the session when a
click arrives after the gap or when the watermark passes the timer. Clicks older than the batch's
watermark are dropped, as Spark drops late rows. Each emitted session carries the user's tier from the
``profiles`` adjunct store (a side stream of user profiles) as of the batch that closes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from blobstate.processor import StatefulProcessor, StatefulProcessorHandle

GAP_MS = 90_000
WATERMARK_DELAY_MS = 120_000
OUTPUT_SCHEMA = "user string, start_ms long, end_ms long, clicks long, tier string"
COLUMNS = ["user", "start_ms", "end_ms", "clicks", "tier"]

Session = tuple[str, int, int, int, str | None]


class SessionProcessor(StatefulProcessor):
    """Per-user click sessions closed by an event-time timeout."""

    # blobstate passes its own handle (getAdjunct is blobstate's); PySpark types init with PySpark's.
    def init(self, handle: StatefulProcessorHandle) -> None:  # type: ignore[override]
        """Declare the open session of each user."""
        self.handle = handle
        self.session = handle.getValueState("session", "start_ms LONG, last_ms LONG, clicks LONG")
        self.profiles = handle.getAdjunct("profiles")

    def _tier(self, user: str) -> str | None:
        profile = self.profiles.get(user)
        return None if profile is None else profile[0]

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Extend the open session or close it when the next click comes after the gap."""
        (user,) = key
        times = sorted(int(t) for frame in rows for t in frame["ts"])
        current = self.session.get()
        start, last, clicks = current if current is not None else (None, None, 0)
        if last is not None:
            self.handle.deleteTimer(last + GAP_MS)
        closed: list[Session] = []
        for t in times:
            if last is not None and t - last > GAP_MS:
                closed.append((user, start, last, clicks, self._tier(user)))
                start, clicks = None, 0
            if start is None:
                start, last = t, t
            last = max(last, t)
            clicks += 1
        self.session.update((start, last, clicks))
        self.handle.registerTimer(last + GAP_MS)
        if closed:
            yield pd.DataFrame(closed, columns=COLUMNS)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """The watermark passed the gap after the last click: the session is over."""
        (user,) = key
        current = self.session.get()
        if current is not None:
            start, last, clicks = current
            self.session.clear()
            yield pd.DataFrame([(user, start, last, clicks, self._tier(user))], columns=COLUMNS)

    def close(self) -> None:
        """Nothing to release."""


def reference_sessions(
    batches: list[pa.Table], profiles: list[pa.Table] | None = None
) -> tuple[list[Session], dict[str, tuple[int, int, int]]]:
    """Closed sessions and still-open sessions, computed batch by batch without Spark.

    Mirrors Spark's rules: the watermark starts at 0 and, after each batch, becomes the largest event
    time seen minus the delay. A batch fires timers at or before the current watermark but drops
    clicks older than the previous batch's watermark (one step behind). Input rows come before timers.
    ``profiles[b]`` is the profile side stream's file read with click batch ``b``: applied before the
    batch's clicks (a null tier deletes); a session carries its user's tier when it closes.
    """
    open_sessions: dict[str, tuple[int, int, int]] = {}
    closed: list[Session] = []
    tier: dict[str, str] = {}
    watermark = 0
    late_watermark = 0
    max_seen: int | None = None
    for b, table in enumerate(batches):
        for row in [] if profiles is None or b >= len(profiles) else profiles[b].to_pylist():
            if row["user"] is None:
                continue
            if row["tier"] is None:
                tier.pop(row["user"], None)
            else:
                tier[row["user"]] = row["tier"]
        rows = table.select(["user", "ts"]).to_pylist()
        rows = [r for r in rows if r["ts"] >= late_watermark]
        by_user: dict[str, list[int]] = {}
        for r in rows:
            by_user.setdefault(r["user"], []).append(r["ts"])
        for user, times in by_user.items():
            session = open_sessions.get(user)  # (start, last, clicks)
            for t in sorted(times):
                if session is not None and t - session[1] > GAP_MS:
                    closed.append((user, *session, tier.get(user)))
                    session = None
                start, last, clicks = session if session is not None else (t, t, 0)
                session = (start, max(last, t), clicks + 1)
            assert session is not None  # a user is in by_user with at least one click
            open_sessions[user] = session
        for user in sorted(open_sessions):
            start, last, clicks = open_sessions[user]
            if last + GAP_MS <= watermark:
                closed.append((user, start, last, clicks, tier.get(user)))
                del open_sessions[user]
        batch_max = max((r["ts"] for r in rows), default=None)
        if batch_max is not None:
            max_seen = batch_max if max_seen is None else max(max_seen, batch_max)
        late_watermark = watermark
        if max_seen is not None:
            watermark = max(watermark, max_seen - WATERMARK_DELAY_MS)
    return closed, open_sessions
