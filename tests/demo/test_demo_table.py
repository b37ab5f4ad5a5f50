"""The demo's per-batch table marks a snapshot at the batch whose state it holds, as ``lineage`` does."""

from __future__ import annotations

from blobstate.demo.run import snapshot_taken


def _report(snapshots: int, *uploads: dict) -> dict:
    """A batch report as the demo job prints it: ``snapshots`` counts the commit's snapshots (own or named
    late) and each partition's metrics carry its ``snapshot_upload``."""
    return {
        "snapshots": snapshots,
        "partitions": {str(p): {"snapshot_upload": u} for p, u in enumerate(uploads)},
    }


def test_a_background_snapshot_is_marked_where_it_started_not_where_it_was_named() -> None:
    started = _report(0, {"mode": "background", "started": "5_ab"}, {"mode": "background"})
    named = _report(2, {"mode": "background", "named": "5_ab"}, {"mode": "background", "named": "5_cd"})
    assert snapshot_taken(started) and not snapshot_taken(named)


def test_an_inline_snapshot_is_marked_at_its_own_batch() -> None:
    assert snapshot_taken(_report(1, {"mode": "inline"}, {"mode": "inline"}))
    assert not snapshot_taken(_report(0, {"mode": "inline"}))
