"""Grouping one partition's rows by key as Spark groups them: a struct key holding NaN or -0.0 is one key
(Python's != made a group of every NaN row, so a handler ran twice for one key in one batch), and a
TIMESTAMP key's stored bytes are its instant, whatever zone the rows came in."""

from __future__ import annotations

import math

import pyarrow as pa

from blobstate.encoding import codec
from blobstate.processor.grouping import group_by_key, key_runs


def test_struct_keys_holding_nan_or_negative_zero_are_one_key() -> None:
    struct = pa.struct([("f0", pa.float64())])
    keys = [{"f0": math.nan}, {"f0": 1.0}, {"f0": math.nan}, {"f0": -0.0}, {"f0": 0.0}]
    table = pa.table({"k": pa.array(keys, type=struct), "v": pa.array(range(5), type=pa.int64())})
    _, starts, ends = key_runs(table, ["k"])
    assert sorted((ends - starts).tolist()) == [1, 2, 2]


def test_timestamp_keys_are_stored_by_their_instant_in_every_zone() -> None:
    micros = [1_793_521_800_000_000, 1_793_525_400_000_000]  # 01:30 PDT and 01:30 PST on 2026-11-01
    by_zone = {}
    for zone in ("America/Los_Angeles", "UTC", "Asia/Kolkata"):
        column = pa.array(micros, type=pa.int64()).cast(pa.timestamp("us", tz=zone))
        groups = group_by_key(pa.table({"ts": column}), ["ts"], zone)
        assert len(groups) == 2, zone  # the repeated hour's two instants stay two keys
        by_zone[zone] = groups.key_bytes
    assert len({tuple(v) for v in by_zone.values()}) == 1
    assert codec.decode_key(by_zone["UTC"][0], 1)[0][0].value == micros[0] * 1000
