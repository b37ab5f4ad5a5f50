"""The demo's plain-Python reference follows the session, watermark and late-data rules."""

from __future__ import annotations

import pyarrow as pa

from blobstate.demo.clickstream import SCHEMA, SENTINEL_USER, StreamShape, generate_batches
from blobstate.demo.sessions import GAP_MS, WATERMARK_DELAY_MS, reference_sessions


def _batch(rows: list[tuple[str, int]]) -> pa.Table:
    return pa.table(
        {
            "user": [u for u, _ in rows],
            "ts": [t for _, t in rows],
            "event_time": pa.array([t * 1000 for _, t in rows]).cast(pa.timestamp("us", tz="UTC")),
            "page": [0] * len(rows),
        },
        schema=SCHEMA,
    )


def test_gap_splits_sessions_and_watermark_closes_them() -> None:
    t0 = 10_000_000
    batches = [
        _batch([("a", t0), ("a", t0 + 1000), ("a", t0 + GAP_MS + 2000)]),
        # far in the future: the watermark after this batch passes every session of "a"
        _batch([("b", t0 + 10 * GAP_MS + WATERMARK_DELAY_MS)]),
        _batch([("b", t0 + 10 * GAP_MS + WATERMARK_DELAY_MS + 1)]),
    ]
    closed, still_open = reference_sessions(batches)
    assert closed == [("a", t0, t0 + 1000, 2), ("a", t0 + GAP_MS + 2000, t0 + GAP_MS + 2000, 1)]
    assert set(still_open) == {"b"}


def test_clicks_older_than_the_previous_batch_watermark_are_dropped() -> None:
    t0 = 10_000_000
    late = t0 - WATERMARK_DELAY_MS - 1
    batches = [_batch([("a", t0)]), _batch([("a", t0 + 5)]), _batch([("c", late), ("a", t0 + 9)])]
    closed, still_open = reference_sessions(batches)
    assert closed == []
    assert still_open == {"a": (t0, t0 + 9, 3)}
    # one batch earlier the late click is still accepted: Spark's late-row watermark lags one batch
    _, still_open = reference_sessions([_batch([("a", t0)]), _batch([("c", late), ("a", t0 + 5)])])
    assert still_open["c"] == (late, late, 1)


def test_generated_stream_ends_with_every_real_session_closed() -> None:
    batches = generate_batches(StreamShape(batches=4, events_per_batch=500, users=100))
    closed, still_open = reference_sessions(batches)
    assert set(still_open) == {SENTINEL_USER}
    kept = sum(c for *_, c in closed)
    assert 0 < kept <= 4 * 500
