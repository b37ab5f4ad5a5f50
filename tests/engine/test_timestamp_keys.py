"""TIMESTAMP grouping keys are instants: the same instant is the same key in every session time zone,
before and after a restart under another zone and a rescale, the repeated hour of a daylight-saving change
holds two keys, and the state reader reads them back as the instants the input had.

The reference is a count per instant computed in plain Python; the outputs are compared as epoch
microseconds (``unix_micros``), which do not depend on the zone the sink runs in.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import spark_conf

pytestmark = pytest.mark.spark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "upgrade"))
from make_timestamp_checkpoint import write_inputs  # noqa: E402

UTC = dt.UTC
# 2026-11-01 in America/Los_Angeles: 01:30 PDT (08:30Z) and 01:30 PST (09:30Z) read alike there.
PDT_0130 = dt.datetime(2026, 11, 1, 8, 30, tzinfo=UTC)
PST_0130 = dt.datetime(2026, 11, 1, 9, 30, tzinfo=UTC)
OTHER = [
    dt.datetime(2026, 3, 8, 10, 15, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]
BATCHES: list[list[tuple[dt.datetime, int]]] = [
    [(PDT_0130, 1), (PST_0130, 2), (OTHER[0], 3)],
    [(PDT_0130, 4), (OTHER[1], 5)],
    [(PST_0130, 6), (OTHER[0], 7), (OTHER[1], 8)],
    [(PDT_0130, 9), (PST_0130, 10), (OTHER[0], 11), (OTHER[1], 12)],
]
ZONES = ["UTC", "America/Los_Angeles", "Asia/Kolkata", "America/Los_Angeles"]
"""The session time zone of each run (one batch per run after the first two)."""


def micros(t: dt.datetime) -> int:
    return (t - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def reference(batches: list[list[tuple[dt.datetime, int]]]) -> dict[int, list[list[int]]]:
    """Each batch's [instant in microseconds, count so far, total so far] rows, sorted."""
    count: Counter[int] = Counter()
    total: Counter[int] = Counter()
    out = {}
    for b, rows in enumerate(batches):
        for t, v in rows:
            count[micros(t)] += 1
            total[micros(t)] += v
        out[b] = sorted([k, count[k], total[k]] for k in {micros(t) for t, _ in rows})
    return out


@pytest.mark.parametrize("api", ["pandas", "arrow"])
def test_timestamp_keys_are_instants_across_zones_restarts_and_a_rescale(
    spark: Any, tmp_path: Path, api: str
) -> None:
    from make_timestamp_checkpoint import run_query
    from pyspark.sql import functions as F

    import blobstate
    from blobstate.rescale import rescale_checkpoint

    root = tmp_path / "q"
    outputs: dict[int, list[list[Any]]] = {}
    # batches 0-1 in UTC, then one batch per run in another zone, a rescale 2 -> 3 before the last
    runs = [(ZONES[0], 2), (ZONES[1], 3), (ZONES[2], 4)]
    for zone, upto in runs:
        write_inputs(root / "input", BATCHES[:upto])
        if upto == 4:
            rescale_checkpoint(spark, str(root / "checkpoint"), 3, legacy_zone=None)
        with spark_conf(spark, {"spark.sql.session.timeZone": zone}):
            outputs.update(run_query(spark, root, tmp_path / "local", api, num_partitions=None))
    assert outputs == reference(BATCHES)

    with spark_conf(spark, {"spark.sql.session.timeZone": "America/Los_Angeles"}):
        state = blobstate.read_state(spark, str(root / "checkpoint"), state_var="agg")
        rows = state.select(F.unix_micros("key.ts").alias("us"), "value.count", "partition_id").collect()
    counts = {r["us"]: r["count"] for r in rows}
    final = Counter(micros(t) for rows_ in BATCHES for t, _ in rows_)
    assert counts == dict(final), "the state reader's keys are not the input's instants"
    assert len({r["partition_id"] for r in rows}) > 1 and {r["partition_id"] for r in rows} <= {0, 1, 2}
