"""The state reader on a real query checkpoint: every retained version read through Spark equals the
plain-Python reference state of that version, on a local and on an S3 checkpoint, and reading changes
nothing in the checkpoint."""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from reader_jobs import OUTPUT, TTL_MS, EveryState, batches, reference

import blobstate
from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog
from blobstate.reader import StateReadError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_helpers import kv_table, run_blobstate, spark_conf, write_batch_files

pytestmark = pytest.mark.spark

BATCHES = 6
RETAIN = 3


def fingerprint(url: str) -> dict[str, str]:
    """Every object under ``url`` with the SHA-256 of its bytes."""
    with open_blob_store(url) as store:
        return {name: hashlib.sha256(store.get(name)).hexdigest() for name in store.list("")}


def run_query(spark: Any, tmp_path: Path, checkpoint: str) -> list[dict[str, Any]]:
    """Run :class:`EveryState` over :data:`BATCHES` batches; return the reference state per version."""
    data = batches(BATCHES)
    write_batch_files(tmp_path / "in", [kv_table(b) for b in data])
    # ProcessingTime asks for a batch after every batch (timers, TTL): only the input's batches here
    with spark_conf(spark, {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}):
        run_blobstate(
            spark, tmp_path / "in", checkpoint, EveryState(), output_schema=OUTPUT, num_partitions=3,
            local_dir=tmp_path / "local", time_mode="ProcessingTime", snapshot_every=2,
            min_versions_to_retain=RETAIN, spark_checkpoint=str(tmp_path / "spark"),
        )  # fmt: skip
    return reference(data)


def read_versions(spark: Any, url: str, versions: range, **kw: Any) -> dict[int, list[Any]]:
    """The rows of each version, read in one Spark job (a union of one read per version)."""
    from functools import reduce

    from pyspark.sql import functions as F

    frames = [blobstate.read_state(spark, url, version=v, **kw).withColumn("v", F.lit(v)) for v in versions]
    out: dict[int, list[Any]] = {v: [] for v in versions}
    for row in reduce(lambda a, b: a.union(b), frames).collect():
        out[row.v].append(row)
    return out


def check_every_retained_version(
    spark: Any, url: str, expected: list[dict[str, Any]], started_ms: int
) -> None:
    latest = CommitLog(open_blob_store(url)).latest_commit()
    assert latest is not None and latest.version == BATCHES
    retained = range(latest.retained_from, BATCHES + 1)
    assert list(retained) == [4, 5, 6]
    names = ("totals", "recent", "buckets", "visits")
    reads = {name: read_versions(spark, url, retained, state_var=name) for name in names}
    reads["$timers"] = read_versions(spark, url, retained, timers=True)
    for version in retained:
        want = expected[version - 1]
        rows = reads["totals"][version]
        assert {r.key.key: tuple(r.value) for r in rows} == want["totals"]
        assert len(rows) == len(want["totals"])

        rows = reads["recent"][version]
        got: dict[str, list] = {}
        for r in rows:
            got.setdefault(r.key.key, []).append(tuple(r.list_element))
        assert got == want["recent"]

        rows = reads["buckets"][version]
        assert {(r.key.key, r.user_map_key.bucket): tuple(r.user_map_value) for r in rows} == want["buckets"]
        assert len(rows) == len(want["buckets"])

        rows = reads["visits"][version]
        assert {r.key.key: tuple(r.value) for r in rows} == want["visits"]
        assert all(
            started_ms + TTL_MS <= r.expiration_timestamp_ms <= time.time() * 1000 + TTL_MS for r in rows
        )

        rows = reads["$timers"][version]
        assert sorted((r.key.key, r.expiration_timestamp_ms) for r in rows) == want["$timers"]


def check_partitions(spark: Any, url: str) -> None:
    """Each key's rows carry the partition Spark's hash assigns it; one partition reads only its own."""
    from pyspark.sql import functions as F

    rows = blobstate.read_state(spark, url, state_var="totals").collect()
    keys = spark.createDataFrame([(r.key.key,) for r in rows], "key STRING")
    spark_partition = {
        r.key: r.p for r in keys.select("key", F.expr("pmod(hash(key), 3)").alias("p")).collect()
    }
    assert {r.key.key: r.partition_id for r in rows} == spark_partition
    one = blobstate.read_state(spark, url, state_var="totals", partition=1).collect()
    assert sorted(r.key.key for r in one) == sorted(k for k, p in spark_partition.items() if p == 1)
    assert {r.partition_id for r in one} == {1}


def test_reader_returns_the_reference_state_of_every_retained_version_local(
    spark: Any, tmp_path: Path
) -> None:
    url = str(tmp_path / "ckpt")
    started_ms = int(time.time() * 1000)
    expected = run_query(spark, tmp_path, url)
    before = fingerprint(url)
    leftovers = set(glob.glob(os.path.join(tempfile.gettempdir(), "blobstate-read-*")))
    check_every_retained_version(spark, url, expected, started_ms)
    check_partitions(spark, url)

    # the format directly, with Spark's option names; the schema comes from the recorded declaration
    blobstate.register_reader(spark)
    df = spark.read.format("blobstate").option("stateVarName", "buckets").option("version", 5).load(url)
    assert df.schema.simpleString() == (
        "struct<key:struct<key:string>,user_map_key:struct<bucket:string>,"
        "user_map_value:struct<n:bigint,max:bigint>,partition_id:int>"
    )
    assert len(df.collect()) == len(expected[4]["buckets"])
    timers = spark.read.format("blobstate").option("readRegisteredTimers", "true").load(url)
    assert timers.columns == ["key", "expiration_timestamp_ms", "partition_id"]

    # errors: one line naming what exists
    with pytest.raises(
        StateReadError, match=r"no state variable 'nope'.*'buckets', 'recent', 'totals', 'visits'"
    ):
        blobstate.read_state(spark, url, state_var="nope")
    with pytest.raises(
        StateReadError, match=r"version 2 .* no longer retained \(versions 4\.\.6 are retained"
    ):
        blobstate.read_state(spark, url, version=2, state_var="totals")
    with pytest.raises(StateReadError, match=r"version 9 .* not committed \(the latest is 6"):
        blobstate.read_state(spark, url, version=9, state_var="totals")
    with pytest.raises(StateReadError, match=r"no partition 3: it has partitions 0\.\.2"):
        blobstate.read_state(spark, url, partition=3, state_var="totals")
    with pytest.raises(StateReadError, match=r"state variables are 'buckets', 'recent', 'totals', 'visits'"):
        blobstate.read_state(spark, url)
    with pytest.raises(Exception, match="no state variable 'nope'"):
        spark.read.format("blobstate").option("stateVarName", "nope").load(url).collect()

    assert fingerprint(url) == before, "reading changed the checkpoint"
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "blobstate-read-*"))) == leftovers


@pytest.fixture
def s3_workers(s3_endpoint: str, spark: Any) -> Any:
    """The test S3 endpoint and credentials for Python workers started from now on."""
    environment = spark.sparkContext.environment
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "BLOBSTATE_S3_ENDPOINT")
    previous = {n: environment.get(n) for n in names}
    environment.update({n: os.environ[n] for n in names})
    yield
    for n, v in previous.items():
        if v is None:
            environment.pop(n, None)
        else:
            environment[n] = v


def test_reader_returns_the_reference_state_of_every_retained_version_s3(
    s3_workers: None, spark: Any, s3_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    started_ms = int(time.time() * 1000)
    expected = run_query(spark, tmp_path, s3_url)
    # the bucket has no lifecycle rule for pending objects: the query's start said so, once
    bucket = s3_url.split("/")[2]
    (warning,) = [
        r for r in caplog.records if r.name.startswith("blobstate") and "lifecycle" in r.getMessage()
    ]
    assert warning.levelname == "WARNING" and f"bucket {bucket!r}" in warning.getMessage()
    before = fingerprint(s3_url)
    check_every_retained_version(spark, s3_url, expected, started_ms)
    assert fingerprint(s3_url) == before, "reading changed the checkpoint"
