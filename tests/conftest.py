"""Shared fixtures: one real S3-protocol server (moto) and one SparkSession per test session."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstate.blobstore import BlobStore, open_blob_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-protocol server (moto's standalone server) listening on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["BLOBSTATE_S3_ENDPOINT"] = endpoint
    yield endpoint
    server.stop()


@pytest.fixture
def s3_url(s3_endpoint: str) -> str:
    """A fresh bucket on the test S3 server, as an ``s3://bucket/prefix`` URL."""
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/root"


@pytest.fixture(params=["local", "memory", "s3"])
def blob_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh, empty store on each backend in turn."""
    if request.param == "local":
        return str(tmp_path / "blobs")
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return request.getfixturevalue("s3_url")


@pytest.fixture
def blob_store(blob_store_url: str) -> Iterator[BlobStore]:
    """A fresh, empty store on each backend in turn (local directory, memory, S3)."""
    store = open_blob_store(blob_store_url)
    yield store
    store.close()


@pytest.fixture(scope="session")
def spark():
    """One local[2,2] SparkSession (2 cores, a failed task is retried once) shared by every Spark test."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers must import what the tests import (test-local processor modules included).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("blobstate-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()
