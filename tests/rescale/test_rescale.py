"""Rescaling a checkpoint with every state kind: the state read at the last version before equals the state
read at the first version after, and a plain-Python reference; every record lands in the partition Spark
gives its key; the query continues on the new layout; a rescale killed at each of its steps leaves the old
layout or the new one, and a rerun finishes it with nothing lost or orphaned."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rescale_checkpoints import (
    ADJUNCT_CF,
    adjunct_reference,
    batches,
    frozen,
    partition_of,
    reference,
    run_batches,
    watermark_of,
)

from blobstate.blobstore import open_blob_store
from blobstate.encoding.codec import decode_key
from blobstate.lineage.commitlog import CommitLog
from blobstate.reader import TIMERS
from blobstate.reader.checkpoint import open_version, restored_partition
from blobstate.reader.plan import plan_read
from blobstate.reader.rows import partition_rows
from blobstate.rescale import STEPS, rescale_checkpoint
from blobstate.rescale.split import grouping_key
from blobstate.state.retention import gc_checkpoint, referenced_by_retained
from blobstate.state.verify import verify

VARIABLES = ("totals", "recent", "buckets", "visits", TIMERS)


def read_state(url: str, version: int) -> Counter:
    """Every (variable, row without its partition id) the state reader returns at ``version``, plus the
    adjunct store's (key, value) records, as a multiset."""
    rows: Counter = Counter()
    for var in VARIABLES:
        plan = plan_read(url, version=version, state_var=var)
        for p in plan.partitions:
            for row in partition_rows(url, plan.version, plan.operator, p, plan.state_var, plan.schema):
                rows[(var, frozen(row[:-1]))] += 1
    for cf, key, value in raw_records(url, version, check_partition=False):
        if cf == ADJUNCT_CF:
            rows[("prices", (decode_key(key, 1)[0][0], value))] += 1
    return rows


def expected_state(data: list[list[tuple[str, int]]]) -> Counter:
    """:func:`read_state`'s rows from the plain-Python reference."""
    ref = reference(data)[-1]
    rows: Counter = Counter()
    for k, v in ref["totals"].items():
        rows[("totals", ((k,), v))] += 1
    for k, elements in ref["recent"].items():
        for e in elements:
            rows[("recent", ((k,), e))] += 1
    for (k, uk), v in ref["buckets"].items():
        rows[("buckets", ((k,), (uk,), v))] += 1
    for k, v in ref["$timers"]:
        rows[(TIMERS, ((k,), v))] += 1
    for k, v in ref["visits"].items():
        rows[("visits", ((k,), v))] += 1
    for k, value in adjunct_reference(data).items():
        rows[("prices", (k, value))] += 1
    return rows


def without_expiry(rows: Counter) -> Counter:
    """The rows with ``visits`` rows cut to key and value (the reference has no TTL expiry)."""
    out: Counter = Counter()
    for (var, row), count in rows.items():
        out[(var, row[:2] if var == "visits" else row)] += count
    return out


def raw_records(url: str, version: int, *, check_partition: bool = True) -> list[tuple[str, bytes, bytes]]:
    """Every record of every partition at ``version`` but ``$meta``; each grouping key must be in the
    partition Spark gives it (with ``check_partition``)."""
    out = []
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        n = len(checkpoint.commit.checkpoints["0"])
        for p in range(n):
            with restored_partition(store, checkpoint, "0", p) as rocks:
                for cf in rocks.column_families():
                    if cf == "$meta":
                        continue
                    for key, value in rocks.items(cf):
                        if check_partition:
                            (k,), _ = decode_key(grouping_key(cf, key, 1), 1)
                            assert partition_of(k, n) == p, (cf, k, p)
                        out.append((cf, key, value))
    return out


def assert_clean(url: str) -> None:
    """Past every pending TTL, ``gc --full`` leaves only what the retained versions reference, and
    ``verify --checksums`` finds nothing wrong."""
    with open_blob_store(url) as store:
        gc_checkpoint(store, full=True, now=time.time() + 60 * 86400)
        log = CommitLog(store)
        referenced = referenced_by_retained(store, log.latest_commit())
        state = set(store.list("state/")) | set(store.list("blobs/"))
        assert state == referenced
        report = verify(store, checksums=True)
        assert report.problems == [], [str(p) for p in report.problems]


@pytest.mark.parametrize(
    ("m", "n", "on_spark"),
    [pytest.param(2, 4, True, marks=pytest.mark.spark), (4, 2, False), (3, 7, False), (7, 1, False)],
)
def test_rescale_keeps_every_state_kind(
    request: pytest.FixtureRequest, tmp_path: Path, m: int, n: int, on_spark: bool
) -> None:
    """One rescale as a Spark job; the others run the same tasks in this process (no shuffle service)."""
    spark = request.getfixturevalue("spark") if on_spark else None
    url, local = str(tmp_path / "ckpt"), tmp_path / "local"
    data = batches(6, seed=10 * m + n)
    run_batches(url, data[:4], local, m)
    records_before = Counter(raw_records(url, 4))

    result = rescale_checkpoint(spark, url, n)

    assert (result.previous_version, result.version, result.old_partitions, result.new_partitions) == (
        4,
        5,
        m,
        n,
    )
    before, after = read_state(url, 4), read_state(url, 5)  # version 4 is still readable
    assert after == before
    assert without_expiry(after) == expected_state(data[:4])
    assert Counter(raw_records(url, 5)) == records_before
    with open_blob_store(url) as store:
        commit = CommitLog(store).read_commit(5)
        assert (commit.num_partitions, commit.layout_from, commit.batch_id) == (n, 5, 3)
        assert commit.watermark_ms == watermark_of(4) and commit.retained_from == 2
        assert verify(store, checksums=True).problems == []

    run_batches(url, data[4:], local, n)  # versions 6 and 7 on the new layout

    assert without_expiry(read_state(url, 7)) == expected_state(data)
    with open_blob_store(url) as store:
        assert CommitLog(store).read_commit(7).retained_from == 5
        versions = {int(name.split("/")[-1].split("_")[0]) for name in store.list("state/")}
        assert min(versions) >= 5, "the old layout's objects outlived its retention"
        partitions = {int(name.split("/")[2]) for name in store.list("state/") + store.list("blobs/")}
        assert partitions == set(range(n))
    assert_clean(url)


class Killed(Exception):
    """The rescale was killed here (a test fault)."""


def killer(marker: Path, step: str) -> Any:
    """A fault hook that leaves ``marker`` and raises at ``step`` (on the driver or in a task)."""

    def fault(name: str) -> None:
        if name == step:
            marker.write_text(step)
            raise Killed(step)

    return fault


def test_a_rescale_killed_at_each_step_leaves_one_layout_and_a_rerun_finishes(
    spark: Any, tmp_path: Path
) -> None:
    url, local = str(tmp_path / "ckpt"), tmp_path / "local"
    data = batches(4, seed=1)
    run_batches(url, data, local, 2)
    expected = read_state(url, 4)
    fired = []
    for step in ["split:0/1", "build:0/2", *STEPS[:2]]:
        marker = tmp_path / f"killed-{step.replace('/', '-')}"
        with pytest.raises(Exception) as caught:
            rescale_checkpoint(spark, url, 3, fault=killer(marker, step))
        assert marker.read_text() == step and "Killed" in repr(caught.value) + str(caught.value)
        fired.append(step)
        with open_blob_store(url) as store:
            newest = CommitLog(store).latest_commit()
            assert (newest.version, len(newest.checkpoints["0"])) == (4, 2), step
            assert verify(store).problems == [], step
        assert read_state(url, 4) == expected

    marker = tmp_path / "killed-committed"
    with pytest.raises(Killed):
        rescale_checkpoint(spark, url, 3, fault=killer(marker, "committed"))
    fired.append(marker.read_text())
    with open_blob_store(url) as store:
        newest = CommitLog(store).latest_commit()
        assert (newest.version, len(newest.checkpoints["0"])) == (5, 3)
        report = verify(store)
        # the newest commit's cleanup not run yet is information, not a problem
        assert report.problems == [] and report.cleanup_pending, "the kill after the commit left no cleanup"
    again = rescale_checkpoint(spark, url, 3)
    assert again.already and again.version == 5
    assert read_state(url, 5) == expected

    marker = tmp_path / "killed-cleaned"
    with pytest.raises(Killed):
        rescale_checkpoint(spark, url, 2, fault=killer(marker, "cleaned"))
    fired.append(marker.read_text())
    assert fired == ["split:0/1", "build:0/2", *STEPS]
    assert read_state(url, 6) == expected
    assert Counter(raw_records(url, 6)) == Counter(raw_records(url, 4))
    assert_clean(url)
