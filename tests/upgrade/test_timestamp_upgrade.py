"""Checkpoints keyed by a TIMESTAMP that the previous release wrote in America/Los_Angeles
(``timestamp-checkpoints/``, from ``make_timestamp_checkpoint.py``) continue in this release: its first
start converts the wall-clock keys to instants (read in the session's zone, as the README asks), the
counts continue exactly, the repeated hour of the DST change is two keys from then on, a restart in
another zone changes nothing, and a rescale of such a checkpoint before the conversion is refused."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from make_checkpoint import ROOT_PLACEHOLDER
from make_timestamp_checkpoint import ZONE, instant, run_query, write_inputs

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import INSTANT_KEYS_COMMIT_FORMAT, CommitLog
from blobstate.rescale import RescaleError, rescale_checkpoint
from blobstate.state.verify import verify

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent
UTC = dt.UTC
PDT_0130 = dt.datetime(2026, 11, 1, 8, 30, tzinfo=UTC)
PST_0130 = dt.datetime(2026, 11, 1, 9, 30, tzinfo=UTC)
MORE: list[list[tuple[Any, int]]] = [
    [(0, 20), (2.5, 23)],
    [(-40, 24), (PDT_0130, 21), (PST_0130, 22)],
    [(PST_0130, 25), (0, 26)],
]
"""Rows the test adds (the first batch in the fixture's zone, the others in Asia/Kolkata); 01:30 PDT and
01:30 PST of 2026-11-01 read alike in the fixture's zone. A pandas processor gets the key as that zone's
wall clock, as under Spark's own operator, so the output of such a key is compared where the zone has no
repeated hour."""


def _at(t: Any) -> int:
    moment = t if isinstance(t, dt.datetime) else instant(t)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def reference(batches: list[list[tuple[Any, int]]]) -> dict[int, list[list[int]]]:
    count: Counter[int] = Counter()
    total: Counter[int] = Counter()
    out = {}
    for b, rows in enumerate(batches):
        for t, v in rows:
            count[_at(t)] += 1
            total[_at(t)] += v
        out[b] = sorted([k, count[k], total[k]] for k in {_at(t) for t, _ in rows})
    return out


@contextlib.contextmanager
def session_zone(spark: Any, zone: str) -> Iterator[None]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def copy_fixture(api: str, root: Path) -> None:
    shutil.copytree(HERE / "timestamp-checkpoints" / api, root / "checkpoint")
    for path in (root / "checkpoint" / "_spark").rglob("*"):
        if path.is_file() and ROOT_PLACEHOLDER.encode() in path.read_bytes():
            path.write_bytes(path.read_bytes().replace(ROOT_PLACEHOLDER.encode(), str(root).encode()))


@pytest.mark.parametrize("api", ["pandas", "arrow"])
def test_timestamp_keys_of_the_previous_release_become_instants(spark: Any, tmp_path: Path, api: str) -> None:
    expected = json.loads((HERE / "timestamp-expected.json").read_text())
    assert expected["zone"] == ZONE
    old = [[(t, v) for t, v in batch] for batch in expected["batches"]]
    everything = reference(old + MORE)
    assert {int(b): rows for b, rows in expected["outputs"][api].items()} == {
        b: everything[b] for b in range(3)
    }

    root = tmp_path.resolve() / "upgrade"
    copy_fixture(api, root)
    url = str(root / "checkpoint")
    with pytest.raises(RescaleError, match="start the query once with this release"):
        rescale_checkpoint(spark, url, 3)  # which zone its keys are of is known only to the query's start

    write_inputs(root / "input", old + MORE[:1])
    with session_zone(spark, ZONE):
        outputs = run_query(spark, root, tmp_path / "local", api)
    with open_blob_store(url) as store:
        latest = CommitLog(store).latest_commit()
        assert latest is not None and latest.instant_keys
        assert latest.format_version == INSTANT_KEYS_COMMIT_FORMAT
        assert latest.metrics is not None and "rescale" not in latest.metrics  # a batch after the conversion
    write_inputs(root / "input", old + MORE)
    with session_zone(spark, "Asia/Kolkata"):
        outputs.update(run_query(spark, root, tmp_path / "local", api))
    assert outputs == {b: everything[b] for b in range(len(old), len(old) + len(MORE))}
    with session_zone(spark, ZONE):
        from pyspark.sql import functions as F

        import blobstate

        state = blobstate.read_state(spark, url, state_var="agg")
        counts = {
            r["us"]: r["count"]
            for r in state.select(F.unix_micros("key.ts").alias("us"), "value.count").collect()
        }
    assert counts[_at(PDT_0130)] == 1 and counts[_at(PST_0130)] == 2, "the repeated hour merged two instants"
    assert counts == dict(Counter(_at(t) for batch in old + MORE for t, _ in batch))
    with open_blob_store(url) as store:
        report = verify(store)
        assert report.problems == [], [str(p) for p in report.problems]
