"""Executors remove the local directories of partitions nobody uses any more, never one in use
(``local-cluster[2,1,1024]``, each executor with its own local directory).

Run as a script, this module is the job: one application runs query A (4 partitions over both
executors), then query B on the same executors. Between them, partitions 0 and 1 of A are made to look
unused for two hours (their use times set back), and the job's driver holds partition 0's lock as a
task would. Query B runs with ``spark.blobstate.local_dir_grace_seconds=300``: its tasks must remove
A's partition 1 on its executor, keep A's partition 0 (in use) and A's partitions 2 and 3 (used
minutes ago), and never touch B's own partitions.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
PARTITIONS = 4
LOCAL_DIR = "blobstate-local"
"""Relative: each executor resolves it in its own work directory, so the two have separate disks."""
USE_FILES = ("LOCK", "snapshots/UPLOAD.lock", "ADJUNCT-READERS.lock", "STANDBY-STOP")


def _work_dir(app: str) -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "work" / app


def _query_id(checkpoint: Path) -> str:
    from blobstate.blobstore import open_blob_store
    from blobstate.lineage.commitlog import CommitLog

    return CommitLog(open_blob_store(str(checkpoint))).read_metadata().query_id


def _partition_dirs(app: str, query_id: str, partition: int) -> list[Path]:
    """The partition's directories on every executor of the application."""
    return sorted(_work_dir(app).glob(f"*/{LOCAL_DIR}/{query_id}/0/{partition}"))


def _run_query(spark: Any, base: Path, name: str) -> None:
    import failure_jobs
    from pyspark.sql.pandas.types import from_arrow_schema

    import blobstate

    frames = (
        spark.readStream.schema(from_arrow_schema(failure_jobs.INPUT_SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(base / f"in-{name}"))
    )
    query = blobstate.transform_with_state(
        frames,
        key="k",
        processor=failure_jobs.TotalsProcessor(),
        output_schema=failure_jobs.OUTPUT_SCHEMA,
        checkpoint=str(base / f"ckpt-{name}"),
        sink=failure_jobs.overwrite_by_batch_sink(base / f"out-{name}"),
        num_partitions=PARTITIONS,
        local_dir=LOCAL_DIR,
        async_cleanup=False,
    )
    query.processAllAvailable()
    query.stop()


def main(base: Path) -> None:
    """The job: query A, then A's partitions 0 and 1 set back two hours and partition 0 locked, then
    query B with a 300 s grace period; prints one JSON line."""
    import failure_jobs

    from blobstate.engine.jvm.classic import PlacementHelper

    spark = failure_jobs.build_spark("local-cluster[2,1,1024]")
    app = spark.sparkContext.applicationId
    print(json.dumps({"started": app}), flush=True)
    helper = PlacementHelper.get(spark)
    assert helper is not None, "placement helper unavailable"
    deadline = time.monotonic() + 300
    while len(helper.executors()) < 2:
        assert time.monotonic() < deadline, "executors did not register"
        time.sleep(0.5)
    _run_query(spark, base, "a")
    query_a = _query_id(base / "ckpt-a")
    two_hours_ago = time.time() - 7200
    for partition in (0, 1):
        for root in _partition_dirs(app, query_a, partition):
            for name in USE_FILES:
                if (root / name).exists():
                    os.utime(root / name, (two_hours_ago, two_hours_ago))
            os.utime(root, (two_hours_ago, two_hours_ago))
    held = [os.open(root / "LOCK", os.O_RDWR) for root in _partition_dirs(app, query_a, 0)]
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a task of partition 0 would, while B's tasks sweep
    spark.conf.set("spark.blobstate.local_dir_grace_seconds", "300")
    try:
        _run_query(spark, base, "b")
    finally:
        for fd in held:
            os.close(fd)
    print(json.dumps({"app": app, "query_a": query_a, "query_b": _query_id(base / "ckpt-b")}), flush=True)
    spark.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_stale_partition_directories_are_removed_and_those_in_use_or_recent_kept(tmp_path: Path) -> None:
    from failure_jobs import make_batches, read_output_dir, reference_outputs, write_inputs

    from blobstate.blobstore import open_blob_store
    from blobstate.lineage.commitlog import CommitLog

    tables = {"a": make_batches(2, seed=11), "b": make_batches(2, seed=12)}
    for name, batches in tables.items():
        write_inputs(batches, tmp_path / f"in-{name}")
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *(p for p in sys.path if p)])
    out, log = tmp_path / "job.out", tmp_path / "job.log"
    with out.open("w") as stdout, log.open("wb") as stderr:
        proc = subprocess.run(
            [sys.executable, __file__, str(tmp_path)],
            env=env,
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            timeout=900,
        )
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    apps = [line["started"] for line in lines if "started" in line]
    try:
        assert proc.returncode == 0, log.read_text(errors="replace")[-5000:]
        (result,) = [line for line in lines if "app" in line]
        app, query_a, query_b = result["app"], result["query_a"], result["query_b"]

        for name, batches in tables.items():
            assert read_output_dir(tmp_path / f"out-{name}") == reference_outputs(batches), name

        def executors(name: str) -> dict[int, set[str]]:
            commits = CommitLog(open_blob_store(str(tmp_path / f"ckpt-{name}")))
            ran: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
            for version in commits.versions():
                for p, m in commits.read_commit(version).metrics["partitions"].items():
                    ran[int(p)].add(m["executor_id"])
            return ran

        ran_a, ran_b = executors("a"), executors("b")
        b_executors = set().union(*ran_b.values())
        assert ran_a[1] <= b_executors, (ran_a, ran_b)  # B ran tasks where A's partition 1 lived
        # A's partition 1, unused for longer than the grace period, is gone; partition 0 was as old but
        # locked; partitions 2 and 3 were used within the grace period.
        assert _partition_dirs(app, query_a, 1) == []
        for partition in (0, 2, 3):
            (root,) = _partition_dirs(app, query_a, partition)
            assert (root / "working" / "CURRENT").is_file(), root
        # B's partitions were all kept: after its first batch every task found its clean working store.
        for partition in range(PARTITIONS):
            assert len(_partition_dirs(app, query_b, partition)) == 1
        commits = CommitLog(open_blob_store(str(tmp_path / "ckpt-b")))
        for version in commits.versions()[1:]:
            metrics = commits.read_commit(version).metrics["partitions"]
            assert {m["load_rule"] for m in metrics.values()} == {"working"}, (version, metrics)
    finally:
        for app_id in apps:
            shutil.rmtree(_work_dir(app_id), ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(Path(sys.argv[1]))
