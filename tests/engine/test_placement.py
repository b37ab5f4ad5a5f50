"""Executor placement: the JVM helper compiled from source, preferred locations, executor identity.

Run as a script (``python test_placement.py``), this module starts its own ``local-cluster`` session
and prints the placement of repeated runs as JSON; the cluster test below does exactly that, because
a local-cluster SparkContext cannot share a JVM with the shared local[2] session.

local-cluster with the pip ``pyspark`` package needs no SPARK_HOME: its launcher sets SPARK_HOME to
the package directory (which holds ``bin/`` and ``jars/``) for the driver JVM, and the in-process
master and workers start executor JVMs from it. Executors start Python workers with the driver's
``PYSPARK_PYTHON`` (sent with each Python function), so only that must name this venv's python.
All executors of a local-cluster share one host, so after ``spark.locality.wait.process`` (default
3s) a task may run on the other executor; the test raises the wait so a slow machine stays exact.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blobstate.batch.executor import ExecutorIdentity, current_executor, location_string, wait_for_hosts
from blobstate.engine.jvm.classic import PlacementHelper
from blobstate.engine.placement import HELPER_CLASS, build_jar

CLUSTER_RUNS = 5
CLUSTER_PARTITIONS = 4

RESULT_SCHEMA = "partition long, executor_id string, host string, rows long, key_sum long"


def _partition_reporter() -> Callable[[Iterator], Iterator]:
    """A mapInArrow function: one row per task with its partition, executor identity and input.

    Built in a closure so cloudpickle ships it by value (workers cannot import this test module).
    """

    def report(batches: Iterator) -> Iterator:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        rows = 0
        key_sum = 0
        for batch in batches:
            rows += batch.num_rows
            key_sum += pc.sum(batch.column("k")).as_py() or 0
        me = current_executor()
        yield pa.RecordBatch.from_pydict(
            {
                "partition": [TaskContext.get().partitionId()],
                "executor_id": [me.executor_id],
                "host": [me.host],
                "rows": [rows],
                "key_sum": [key_sum],
            }
        )

    return report


@pytest.mark.spark
def test_preferred_locations_keep_partitions_and_tasks_see_their_executor(spark) -> None:
    from pyspark.sql import functions as F

    helper = PlacementHelper.get(spark)
    assert helper is not None
    with zipfile.ZipFile(helper.jar) as jar:
        assert HELPER_CLASS.replace(".", "/") + ".class" in jar.namelist()
    executors = helper.executors()
    assert [e.executor_id for e in executors] == ["driver"]
    (driver,) = executors

    df = spark.range(1000).select((F.col("id") * 7 % 101).alias("k")).repartition(4, "k")
    expected = {
        r.p: (r.n, r.s)
        for r in df.groupBy(F.spark_partition_id().alias("p"))
        .agg(F.count("*").alias("n"), F.sum("k").alias("s"))
        .collect()
    }
    located = helper.with_preferred_locations(
        df, [location_string(driver), None, location_string(driver), None]
    )

    report = located.mapInArrow(_partition_reporter(), RESULT_SCHEMA).collect()
    assert sorted(r.partition for r in report) == [0, 1, 2, 3]
    # Every partition holds exactly the rows the hash repartitioning put there.
    assert {r.partition: (r.rows, r.key_sum) for r in report if r.rows} == expected
    # Tasks learn the identity Spark uses, with or without a preference of their own.
    assert {ExecutorIdentity(r.executor_id, r.host) for r in report} == {driver}


@pytest.mark.spark
def test_the_helpers_state_partitioning_is_the_dataframe_operations(spark) -> None:
    """``by_state_partition`` built by the JVM in one call puts every row in the partition, with the
    partition column, that the DataFrame operations give (keys of several types, a null key)."""
    from pyspark.sql import functions as F

    from blobstate.batch.jvm import by_state_partition

    helper = PlacementHelper.get(spark)
    assert helper is not None
    df = spark.range(500).select(
        F.when(F.col("id") % 50 == 0, None).otherwise(F.concat(F.lit("k"), F.col("id") % 37)).alias("s"),
        (F.col("id") % 11).cast("decimal(10,2)").alias("d"),
        F.col("id").alias("v"),
    )

    def placed(frame) -> list[tuple]:
        return sorted(
            frame.select(F.spark_partition_id().alias("p"), "p_col", "s", "d", "v").collect(),
            key=lambda r: r.v,
        )

    ours = helper.by_state_partition(df, ["s", "d"], "p_col", 7)
    reference = by_state_partition(df, ["s", "d"], "p_col", 7)
    assert ours.columns == reference.columns == ["s", "d", "v", "p_col"]
    rows = placed(ours)
    assert rows == placed(reference)
    assert len(rows) == 500
    assert all(r.p == r.p_col for r in rows)  # the column names the partition the row is in
    assert len({r.p for r in rows}) > 1


@pytest.mark.spark
def test_wrong_number_of_locations_is_rejected(spark) -> None:
    helper = PlacementHelper.get(spark)
    assert helper is not None
    df = spark.range(10).repartition(3, "id")
    with pytest.raises(Exception, match="2 preferred locations given for a DataFrame with 3 partitions"):
        helper.with_preferred_locations(df, ["executor_h_1", None])


@pytest.mark.spark
def test_unavailable_placement_returns_none_and_warns_once(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "no-such-javac"
    monkeypatch.setenv("BLOBSTATE_JAVAC", str(missing))
    monkeypatch.setenv("BLOBSTATE_CACHE_DIR", str(tmp_path / "cache"))  # nothing prebuilt here
    with caplog.at_level(logging.WARNING, logger="blobstate.engine.placement"):
        assert PlacementHelper.get(spark) is None
        assert PlacementHelper.get(spark) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(missing) in warnings[0].getMessage()


def test_concurrent_first_builds_publish_one_complete_jar(tmp_path: Path) -> None:
    """Two processes compiling at once into an empty cache both end up with the same valid jar."""
    import pyspark

    classpath = str(Path(pyspark.__file__).parent / "jars" / "*")
    script = (
        "import sys; from pathlib import Path; from blobstate.engine.placement import build_jar; "
        "print(build_jar(sys.argv[1], sys.argv[2], cache_dir=Path(sys.argv[3])))"
    )
    args = [sys.executable, "-c", script, pyspark.__version__, classpath, str(tmp_path)]
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    jar = Path(paths.pop())
    with zipfile.ZipFile(jar) as z:
        assert z.testzip() is None
        assert HELPER_CLASS.replace(".", "/") + ".class" in z.namelist()
    # Only the published build remains; the loser's temporary directory is gone.
    assert [p.name for p in tmp_path.iterdir()] == [jar.parent.name]
    assert build_jar(pyspark.__version__, classpath, cache_dir=tmp_path, javac="/nonexistent") == jar


def test_current_executor_outside_a_task_is_a_stable_fallback() -> None:
    first = current_executor()
    assert first.is_fallback
    assert first == current_executor()
    assert first.host


@pytest.mark.spark
@pytest.mark.slow
def test_local_cluster_tasks_run_on_their_preferred_executor(tmp_path: Path) -> None:
    """Two executors; each run assigns the 4 partitions alternately (swapped every run)."""
    env = dict(os.environ)
    # Python workers are started with the driver's PYSPARK_PYTHON (this venv, which has blobstate).
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    proc = subprocess.run(
        [sys.executable, __file__],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    executors = result["executors"]
    assert len(executors) == 2 and "driver" not in {e["executor_id"] for e in executors}
    assert len(result["runs"]) == CLUSTER_RUNS
    for run in result["runs"]:
        assert run["ran_on"] == run["assigned"]
        assert run["rows"] == 1000
    # The assignment moved every partition between runs, so the scheduler really followed it.
    assert result["runs"][0]["assigned"] != result["runs"][1]["assigned"]


def _cluster_main() -> None:
    """Run the processing stage CLUSTER_RUNS times on local-cluster[2,1,1024]; print JSON."""
    import time

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("blobstate-placement-cluster-test")
        .config("spark.ui.enabled", "false")
        # Generous on a shared 2-core machine: a slow task must not let its successor move away.
        .config("spark.locality.wait", "30s")
        .getOrCreate()
    )
    try:
        helper = PlacementHelper.get(spark)
        assert helper is not None, "placement helper unavailable"
        deadline = time.monotonic() + 120
        while len(executors := helper.executors()) < 2:
            assert time.monotonic() < deadline, f"executors did not register: {executors}"
            time.sleep(0.5)
        ready = time.monotonic()
        runs = []
        for run in range(CLUSTER_RUNS):
            run_started = time.monotonic()
            df = spark.range(1000).select(F.col("id").alias("k")).repartition(CLUSTER_PARTITIONS, "k")
            assigned = [executors[(p + run) % 2] for p in range(CLUSTER_PARTITIONS)]
            located = helper.with_preferred_locations(df, [location_string(e) for e in assigned])
            report = located.mapInArrow(_partition_reporter(), RESULT_SCHEMA).collect()
            runs.append(
                {
                    "assigned": {str(p): dataclasses.asdict(e) for p, e in enumerate(assigned)},
                    "ran_on": {
                        str(r.partition): {"executor_id": r.executor_id, "host": r.host} for r in report
                    },
                    "rows": sum(r.rows for r in report),
                    "seconds": round(time.monotonic() - run_started, 2),
                }
            )
        result = {
            "executors": [dataclasses.asdict(e) for e in executors],
            "startup_seconds": round(ready - started, 2),
            "runs": runs,
        }
        print(json.dumps(result))
    finally:
        spark.stop()


if __name__ == "__main__":
    _cluster_main()


def test_a_restarted_driver_waits_for_the_recorded_hosts_then_plans_with_what_is_alive() -> None:
    """``wait_for_hosts`` returns as soon as every recorded host has an executor, and at the deadline
    with the executors alive then (a host that never comes is planned without)."""
    a, b = ExecutorIdentity("1", "host-a"), ExecutorIdentity("2", "host-b")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def registering(times: dict[ExecutorIdentity, float]):  # each executor registers at its time
        return lambda: [e for e, t in times.items() if now[0] >= t]

    assert wait_for_hosts(
        ["host-a", "host-b"], registering({a: 0, b: 3}), 10, clock=lambda: now[0], sleep=sleep
    ) == [
        a,
        b,
    ]
    assert 3 <= now[0] < 3.5
    now[0] = 0.0
    alive = wait_for_hosts(["host-a", "host-b"], registering({a: 1}), 10, clock=lambda: now[0], sleep=sleep)
    assert alive == [a] and 10 <= now[0] < 10.5
    now[0] = 0.0
    assert wait_for_hosts(["host-b"], registering({a: 0, b: 0}), 10, clock=lambda: now[0], sleep=sleep) == [
        a,
        b,
    ]
    assert now[0] == 0.0  # nothing to wait for
