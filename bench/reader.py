"""The state reader's cost without Spark: restore one partition at a version and decode its rows; prints JSON.

A one-partition local checkpoint holds ``--keys`` grouping keys of the running count (value state), written
in ``--batches`` batches by the real partition and commit code. Measured: planning (one restore on the
driver to read the declaration), then restoring and decoding every row (what one Spark task does).

Usage: .venv/bin/python bench/reader.py [--keys N] [--batches B]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa

from blobstate.blobstore import open_blob_store
from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, RunningCount
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.processor import RunSpec, run_partition
from blobstate.reader.plan import plan_read
from blobstate.reader.rows import partition_rows
from blobstate.state.partition import open_partition


def build(url: str, local: Path, keys: int, batches: int) -> None:
    """Write ``batches`` versions, each touching every key."""
    with open_blob_store(url) as store:
        log = CommitLog(store)
        log.write_metadata(QueryMetadata(str(uuid.uuid4()), 1, {"0": {"key_columns": ["key"]}}))
        previous = None
        table = pa.table({"key": [f"user-{i:09d}" for i in range(keys)], "value": list(range(keys))})
        for version in range(1, batches + 1):
            committed = None if previous is None else previous.checkpoint_id("0", 0)
            with open_partition(store, local, log.read_metadata().query_id, "0", 0, committed) as state:
                for _ in run_partition(
                    RunningCount(),
                    state.store,
                    table,
                    RunSpec(key_columns=("key",), output_schema=RUNNING_COUNT_OUTPUT),
                ):
                    pass
                result = state.commit()
            previous = Commit(
                version=version,
                checkpoints={"0": {0: result.checkpoint_id.uid}},
                objects={"0": {0: result.objects}},
                retained_from=1,
                writer="bench",
            )
            log.write_commit(previous)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = str(Path(tmp) / "ckpt")
        build(url, Path(tmp) / "local", args.keys, args.batches)
        started = time.perf_counter()
        plan = plan_read(url, state_var="agg")
        planned = time.perf_counter()
        rows = sum(
            1 for _ in partition_rows(url, plan.version, plan.operator, 0, plan.state_var, plan.schema)
        )
        done = time.perf_counter()
    assert rows == args.keys
    print(
        json.dumps(
            {
                "keys": args.keys,
                "versions": args.batches,
                "plan_seconds": round(planned - started, 3),
                "read_seconds": round(done - planned, 3),
                "rows_per_second": round(rows / (done - planned)),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
