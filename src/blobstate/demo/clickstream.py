"""A deterministic synthetic click stream, one parquet file per micro-batch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("user", pa.string()),
        ("ts", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("page", pa.int32()),
    ]
)
"""Columns of the click stream: user id, event time (epoch ms, and as the timestamp that drives the
watermark), page id."""

SENTINEL_USER = "~flush"
"""A user whose far-future clicks in the last two batches push the watermark past every real session."""


@dataclass(frozen=True)
class StreamShape:
    """How much click stream to generate."""

    batches: int = 16
    events_per_batch: int = 20_000
    users: int = 20_000
    batch_span_ms: int = 60_000
    late_fraction: float = 0.01
    seed: int = 7


def generate_batches(shape: StreamShape) -> list[pa.Table]:
    """The click stream's batches: event times advance a minute per batch, with a few late clicks.

    The last two batches hold one click of :data:`SENTINEL_USER` each, far in the future, so the
    watermark passes every real session and all of them are closed by the end.
    """
    rng = np.random.default_rng(shape.seed)
    start = 1_700_000_000_000
    tables = []
    for b in range(shape.batches):
        n = shape.events_per_batch
        # Zipf-like skew: a few users click a lot, most rarely.
        users = np.minimum(rng.zipf(1.3, n), shape.users) - 1
        base = start + b * shape.batch_span_ms
        ts = base + rng.integers(0, shape.batch_span_ms, n)
        late = rng.random(n) < shape.late_fraction
        ts = np.where(late, ts - 5 * shape.batch_span_ms, ts)
        pages = rng.integers(0, 50, n).astype(np.int32)
        tables.append(_table([f"u{u:06d}" for u in users], ts.astype(np.int64), pages))
    far = start + (shape.batches + 1000) * shape.batch_span_ms
    for i in (1, 2):
        tables.append(_table([SENTINEL_USER], np.array([far + i], np.int64), np.zeros(1, np.int32)))
    return tables


PROFILE_SCHEMA = pa.schema([("user", pa.string()), ("tier", pa.string())])
"""Columns of the user-profile side stream: user id and tier (a null tier deletes the profile)."""
TIERS = ("free", "plus", "pro")


def generate_profiles(shape: StreamShape, batches: int) -> list[pa.Table]:
    """The user-profile side stream, one table per click batch: every user's tier with the first batch,
    then about 2% of users changing tier (and a few losing their profile) with each later batch, so the
    profiles change while the demo runs."""
    rng = np.random.default_rng(shape.seed + 1)
    users = [f"u{u:06d}" for u in range(shape.users)]
    tables = [
        pa.table(
            {"user": users, "tier": [TIERS[i] for i in rng.integers(0, 3, len(users))]}, schema=PROFILE_SCHEMA
        )
    ]
    for _ in range(1, batches):
        changed = rng.choice(len(users), size=max(1, len(users) // 50), replace=False)
        tiers = [None if rng.random() < 0.05 else TIERS[int(t)] for t in rng.integers(0, 3, len(changed))]
        tables.append(pa.table({"user": [users[i] for i in changed], "tier": tiers}, schema=PROFILE_SCHEMA))
    return tables


def _table(users: list[str], ts: np.ndarray, pages: np.ndarray) -> pa.Table:
    micros = pa.array(ts * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.table({"user": users, "ts": ts, "event_time": micros, "page": pages}, schema=SCHEMA)


def write_batches(tables: list[pa.Table], directory: Path, name: str = "clicks") -> list[Path]:
    """Write one parquet file per batch with increasing modification times (the file source's order)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    base = 1_600_000_000
    for i, table in enumerate(tables):
        path = directory / f"{name}-{i:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + i, base + i))
        paths.append(path)
    return paths
