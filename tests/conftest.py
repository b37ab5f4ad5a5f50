"""Shared fixtures: one real S3-protocol server (moto), one SparkSession and one multi-host Spark cluster
per test session."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstate.blobstore import BlobStore, open_blob_store
from cluster import ClusterUnavailableError, MultiHostCluster


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


class SilentEndpoint:
    """A TCP server on 127.0.0.1 that accepts connections, reads what it is sent and never answers."""

    def __init__(self) -> None:
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.settimeout(0.05)
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                pass
            else:
                self.connections += 1
                conn.setblocking(False)
                self._held.append(conn)
            for held in self._held:  # drain, so a client's upload never blocks on a full buffer
                try:
                    while held.recv(65536):
                        pass
                except (BlockingIOError, OSError):
                    pass

    def close(self) -> None:
        """Stop accepting and drop every connection held open."""
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._listener.close()


@pytest.fixture
def silent_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentEndpoint]:
    """An endpoint that accepts connections and never answers (counts the connections it got)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "testing"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))
    server = SilentEndpoint()
    yield server
    server.close()


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


# ---------------------------------------------------------------------------------------------- cluster
@pytest.fixture(scope="session")
def cluster_session() -> Iterator[MultiHostCluster]:
    """One real multi-host Spark cluster per test session (standby and adjunct tests): a master plus three
    workers on 127.0.0.2-4, each with a private disk and two cores (executors have one, but for the
    Invariant 2 test); stopped at session end."""
    cluster = MultiHostCluster(workers=3, worker_cores=2)
    try:
        cluster.start()
    except ClusterUnavailableError as error:
        pytest.skip(f"no multi-host cluster here: {error}")
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def multihost_cluster(cluster_session: MultiHostCluster) -> MultiHostCluster:
    """The session's cluster with every host up (a previous test may have killed some)."""
    for i in range(cluster_session.workers):
        cluster_session.start_host(i)
    return cluster_session
