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
    assert closed == [("a", t0, t0 + 1000, 2, None), ("a", t0 + GAP_MS + 2000, t0 + GAP_MS + 2000, 1, None)]
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
    kept = sum(session[3] for session in closed)
    assert 0 < kept <= 4 * 500


def test_a_session_carries_the_tier_its_user_has_in_the_batch_that_closes_it() -> None:
    from blobstate.demo.clickstream import PROFILE_SCHEMA

    def profiles(rows: list[tuple[str, str | None]]) -> pa.Table:
        return pa.table({"user": [u for u, _ in rows], "tier": [t for _, t in rows]}, schema=PROFILE_SCHEMA)

    t0 = 10_000_000
    far = t0 + 10 * GAP_MS + WATERMARK_DELAY_MS
    batches = [_batch([("a", t0), ("c", t0)]), _batch([("b", far)]), _batch([("b", far + 1)])]
    side = [profiles([("a", "free"), ("c", "plus")]), profiles([("a", "pro"), ("c", None)]), profiles([])]
    closed, _ = reference_sessions(batches, side)
    # Both sessions close in batch 2 (the watermark passed them after batch 1): a is "pro" by then and
    # c has no profile any more.
    assert sorted(closed) == [("a", t0, t0, 1, "pro"), ("c", t0, t0, 1, None)]
