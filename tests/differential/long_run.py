"""The long differential run, by hand: ``python tests/differential/long_run.py --start S --count N``.

Runs the generated jobs of seeds ``S .. S+N-1`` (:mod:`differential`) on one local Spark session, one at
a time, and prints one JSON line per job (seed, job, seconds, disagreements or the error) and a summary
line at the end; ``--out FILE`` appends the lines to FILE as well, so a run stopped part-way keeps what
it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    """Run the jobs (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=1000)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    from differential import generate_job, run_job

    done = failed = errors = 0
    started = time.monotonic()

    def emit(record: dict[str, object]) -> None:
        line = json.dumps(record, default=str)
        print(line, flush=True)
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(line + "\n")

    for seed in range(args.start, args.start + args.count):
        job = generate_job(seed)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                verdict = run_job(spark, job, Path(tmp))
                record: dict[str, object] = {
                    "seed": seed,
                    "job": job.describe(),
                    "seconds": round(verdict.seconds, 1),
                    "ok": verdict.ok,
                    "disagreements": verdict.disagreements,
                }
                failed += not verdict.ok
            except Exception as error:  # a job that could not run is a finding too
                errors += 1
                record = {
                    "seed": seed,
                    "job": job.describe(),
                    "ok": False,
                    "error": f"{type(error).__name__}: {error}"[:2000],
                }
        done += 1
        emit(record)
    emit(
        {
            "summary": True,
            "start": args.start,
            "jobs": done,
            "disagreeing": failed,
            "errors": errors,
            "seconds": round(time.monotonic() - started),
        }
    )


if __name__ == "__main__":
    main()
