"""The driver of ``test_packed_environment.py``: a reduced ``blobstate demo`` on a multi-host cluster.

Run with ``spark-submit`` of a virtual environment that has the blobstate wheel installed, with
``PYSPARK_PYTHON=./environment/bin/python``: the executors run the Python of the packed environment that
``--archives`` unpacks into their working directory as ``environment``. Imports only blobstate, pyspark,
the standard library and the job's own module ``deployed_sessions`` (beside this script; the executors
get it from ``--py-files``); the test's other modules are not on this Python's path.

First every executor reports where its Python found blobstate, pyspark, rocksdict and the job's module;
then the demo's query runs, with the job's processor, over a small click stream with its profile side
stream, and its sessions are checked against the plain-Python reference, as ``blobstate demo`` checks
them; then the state left open is read back with ``spark.read.format("blobstate")`` (Python workers on
the executors again). Prints one JSON object on stdout, with the seconds each step took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path


def where_imports(_: object) -> list[str]:
    """Runs in an executor's Python worker: where its interpreter and modules come from."""
    import socket

    import deployed_sessions
    import pyspark
    import rocksdict

    import blobstate

    return [
        json.dumps(
            {
                "executable": sys.executable,
                "prefix": sys.prefix,
                "cwd": os.getcwd(),
                "host": socket.gethostname(),
                "blobstate": blobstate.__file__,
                "pyspark": pyspark.__file__,
                "rocksdict": rocksdict.__file__,
                "job_module": os.path.abspath(deployed_sessions.__file__),
            }
        )
    ]


def main() -> int:
    """Run the probe and the demo's query (Spark settings from spark-submit); print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--local-dir", required=True, help="blobstate's local_dir (the hosts' private disk)")
    args = parser.parse_args()

    from deployed_sessions import DeployedSessions
    from pyspark.sql import SparkSession

    from blobstate.demo.clickstream import (
        SENTINEL_USER,
        StreamShape,
        generate_batches,
        generate_profiles,
        write_batches,
    )
    from blobstate.demo.job import start_query
    from blobstate.demo.run import read_sessions
    from blobstate.demo.sessions import reference_sessions

    started = time.monotonic()
    spark = SparkSession.builder.appName("blobstate-packed-environment").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    report: dict[str, object] = {
        "executor_python": spark.sparkContext.pythonExec,
        "session_seconds": round(time.monotonic() - started, 1),
    }
    try:
        shape = StreamShape(batches=3, events_per_batch=800, users=300)
        batches = generate_batches(shape)
        profiles = generate_profiles(shape, len(batches))
        write_batches(batches, args.workdir / "input")
        write_batches(profiles, args.workdir / "profiles", "profiles")
        checkpoint = str(args.workdir / "checkpoint")
        seconds: dict[str, float] = {}
        report["seconds"] = seconds

        started = time.monotonic()
        # Both executors registered first, so that the probe's first wave of tasks reaches both hosts.
        tracker = spark.sparkContext.statusTracker()
        while len(tracker.getExecutorInfos()) < 3 and time.monotonic() - started < 120:  # + the driver
            time.sleep(0.2)
        # An executor whose first Python worker is still unpacking the archive may see its share of a
        # wave taken by the other: probe again (up to a minute) until every executor has answered.
        found: set[str] = set()
        while True:
            found |= set(spark.sparkContext.parallelize(range(8), 8).mapPartitions(where_imports).collect())
            if len({json.loads(e)["cwd"] for e in found}) >= 2 or time.monotonic() - started > 180:
                break
            time.sleep(1)
        report["executors"] = sorted(found)
        seconds["probe"] = round(time.monotonic() - started, 1)

        started = time.monotonic()
        query = start_query(
            spark,
            args.workdir / "input",
            checkpoint,
            args.workdir / "output",
            args.local_dir,
            4,
            profiles_dir=args.workdir / "profiles",
            processor=DeployedSessions(),
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        seconds["demo"] = round(time.monotonic() - started, 1)
        emitted = read_sessions(args.workdir / "output")
        closed, still_open = reference_sessions(batches, profiles)
        report["sessions_emitted"] = sum(emitted.values())
        report["matches"] = emitted == Counter(closed) and set(still_open) <= {SENTINEL_USER}
        started = time.monotonic()
        state = (
            spark.read.format("blobstate")
            .option("stateVarName", "session")
            .load(checkpoint)
            .selectExpr("key.user AS user", "value.start_ms", "value.last_ms", "value.clicks")
            .collect()
        )
        report["open_sessions_read"] = {row[0]: list(row[1:]) for row in state}
        report["open_sessions_expected"] = {user: list(s) for user, s in still_open.items()}
        seconds["read"] = round(time.monotonic() - started, 1)
    finally:
        spark.stop()
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
