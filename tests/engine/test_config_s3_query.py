"""A query on an S3 checkpoint whose store options (here the endpoint) reach the driver and every task.

The S3 server is started by this test on its own port and named only in ``blob_store_options``: neither
``BLOBSTATE_S3_ENDPOINT`` nor anything else points at it, so a task that opened the store without the
options could not find the bucket.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from engine_helpers import (
    RUNNING_COUNT_OUTPUT,
    RunningCount,
    kv_table,
    reference_running_count,
    run_blobstate,
    write_batch_files,
)

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark


@pytest.fixture
def private_s3() -> Iterator[str]:
    """A second moto server, known only to the test."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def worker_credentials(spark: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Test credentials for this process and for the Python workers of tasks started from now on."""
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    for name, value in credentials.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    environment = spark.sparkContext.environment
    previous = {name: environment.get(name) for name in credentials}
    environment.update({name: os.environ[name] for name in credentials})
    yield
    for name, value in previous.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value


def test_blob_store_options_reach_the_tasks(
    spark: Any, worker_credentials: None, private_s3: str, tmp_path: Path
) -> None:
    bucket = f"query-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=private_s3, region_name="us-east-1").create_bucket(Bucket=bucket)
    batches = [[("a", 1), ("b", 2)], [("a", 3)]]
    write_batch_files(tmp_path / "in", [kv_table(b) for b in batches])
    out, _ = run_blobstate(
        spark,
        tmp_path / "in",
        f"s3://{bucket}/ckpt",
        RunningCount(),
        output_schema=RUNNING_COUNT_OUTPUT,
        num_partitions=2,
        local_dir=tmp_path / "local",
        spark_checkpoint=str(tmp_path / "spark"),
        blob_store_options={"endpoint_url": private_s3, "max_attempts": 2},
    )
    assert out.rows == reference_running_count(batches)
    with open_blob_store(f"s3://{bucket}/ckpt", endpoint_url=private_s3) as store:
        commit = CommitLog(store).latest_commit()
        assert commit is not None and commit.version == 2
        assert store.list("state/")  # the tasks wrote their deltas there
