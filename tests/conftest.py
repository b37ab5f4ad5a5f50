"""Shared fixtures: one real S3-protocol server (moto), one Azure Blob server (azurite), one SparkSession
and one multi-host Spark cluster per test session."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import BlobStore, open_blob_store
from cluster import ClusterUnavailableError, MultiHostCluster
from faultproxy import FaultProxy
from server_stores import azure_url_through, s3_url_through


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


REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_PREFIX = REPO_ROOT / ".ci"
"""Where CI (and the fixture, on first use) installs azurite from .ci/package-lock.json."""
AZURITE_BIN = NODE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _azurite_missing(why: str) -> None:
    """Skip on a developer machine without Node; fail where azurite is required (CI sets the variable)."""
    if os.environ.get("BLOBSTATE_REQUIRE_AZURITE") == "1":
        pytest.fail(f"azurite is required (BLOBSTATE_REQUIRE_AZURITE=1) but {why}", pytrace=False)
    pytest.skip(f"azurite not available: {why}")


def _install_azurite() -> None:
    if AZURITE_BIN.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        _azurite_missing("npm is not installed (Node 20 and npm install it: npm ci --prefix .ci)")
    done = subprocess.run(
        [npm, "ci", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not AZURITE_BIN.exists():
        _azurite_missing(f"`npm ci --prefix .ci` failed: {done.stderr.strip()[-2000:]}")


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Azure Blob server (azurite 3.35.0, in memory) on 127.0.0.1, for the whole session.

    Installed from .ci/package-lock.json on first use. Sets AZURE_STORAGE_CONNECTION_STRING, so stores
    opened by URL alone (also in spawned processes) reach it.
    """
    _install_azurite()
    port = _free_port()
    workdir = tmp_path_factory.mktemp("azurite")
    log = (workdir / "azurite.log").open("wb")
    process = subprocess.Popen(
        [
            str(AZURITE_BIN),
            *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *("--skipApiVersionCheck", "--silent", "--inMemoryPersistence"),
        ],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed whole at the end
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"azurite exited with {process.returncode}: {(workdir / 'azurite.log').read_text()}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("azurite did not listen within 60 s")
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};"
        )
        yield endpoint
    finally:
        os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def azure_url(azurite_endpoint: str) -> str:
    """A fresh container on the test azurite server, as an ``az://container/prefix`` URL."""
    from azure.storage.blob import BlobServiceClient

    container = f"test-{uuid.uuid4().hex[:12]}"
    with BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]) as service:
        service.create_container(container)
    return f"az://{container}/root"


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


@pytest.fixture(params=["local", "memory", "s3", "azure"])
def blob_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh, empty store on each backend in turn."""
    if request.param == "local":
        return str(tmp_path / "blobs")
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "azure":
        return request.getfixturevalue("azure_url")
    return request.getfixturevalue("s3_url")


@pytest.fixture
def blob_store(blob_store_url: str) -> Iterator[BlobStore]:
    """A fresh, empty store on each backend in turn (local directory, memory, S3, Azure)."""
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


# ---------------------------------------------------------------------------------------------- cut responses
@pytest.fixture(scope="session")
def s3_fault_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the test S3 server (forwards unchanged until armed)."""
    host, port = s3_endpoint.removeprefix("http://").split(":")
    proxy = FaultProxy(host, int(port))
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def azure_fault_proxy(azurite_endpoint: str) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the test azurite server (forwards unchanged until armed)."""
    host, port = azurite_endpoint.removeprefix("http://").split("/")[0].split(":")
    proxy = FaultProxy(host, int(port))
    yield proxy
    proxy.close()


@pytest.fixture
def s3_cut_url(s3_url: str, s3_fault_proxy: FaultProxy) -> str:
    """A fresh bucket on the test S3 server, reached through the cutting proxy."""
    s3_fault_proxy.disarm()
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    return s3_url_through(s3_fault_proxy, bucket, prefix)


@pytest.fixture
def azure_cut_url(azure_url: str, azure_fault_proxy: FaultProxy) -> str:
    """A fresh container on the test azurite server, reached through the cutting proxy."""
    azure_fault_proxy.disarm()
    container, prefix = azure_url.removeprefix("az://").split("/", 1)
    return azure_url_through(azure_fault_proxy, container, prefix)


@pytest.fixture(scope="module")
def cutting_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any, Any]]:
    """One backend (``request.param``: ``s3`` or ``azure``) on its test server behind the cutting proxy:
    its name, a function giving the URL of a prefix in a fresh bucket or container, the proxy. For the
    crash models' server variants (indirect; ``server_stores.cutting_answers`` drops the bucket or
    container after each history)."""
    from server_stores import azure_url_through, new_bucket, new_container, s3_url_through

    proxy = request.getfixturevalue(f"{request.param}_fault_proxy")
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        yield "s3", lambda prefix: s3_url_through(proxy, new_bucket(endpoint), prefix), proxy
    else:
        request.getfixturevalue("azurite_endpoint")
        yield "azure", lambda prefix: azure_url_through(proxy, new_container(), prefix), proxy
    proxy.disarm()


BARE_BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
"""The interpreter the bare environment is made from (this Python's version, as PySpark requires of
its workers)."""


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python without blobstate or any of its dependencies: a fresh venv without pip or site-packages,
    run by a wrapper that keeps only Spark's own zips (pyspark's and py4j's, what Spark puts on every
    Python worker's path) on ``PYTHONPATH`` (the shared session's workers inherit a ``PYTHONPATH``
    holding this checkout and its venv)."""
    import shlex

    import pyspark

    zips = sorted(str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))
    root = tmp_path_factory.mktemp("bare-python")
    subprocess.run([BARE_BASE_PYTHON, "-m", "venv", "--without-pip", root / "venv"], check=True)
    python = root / "venv" / "bin" / "python"
    wrapper = root / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(os.pathsep.join(zips))} exec {python} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


# ------------------------------------------------------------------------------------- parallel runs
SPARK_FIXTURES = frozenset({"spark", "cluster_session", "multihost_cluster", "bare_python"})
"""Fixtures of tests that run Spark (the shared session, the multi-host cluster, a worker's Python)."""

ONE_WORKER_MODULES = frozenset({"test_crash_model.py", "test_repository_crash_model.py"})
"""Modules whose last tests check what the earlier ones counted (that the random faults fired)."""

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    # Each worker (and the Spark workers and subprocesses it starts) gets a temporary directory of its
    # own, so a test that checks it left no scratch directory behind sees only its worker's.
    _worker_tmp = Path(tempfile.gettempdir()) / f"blobstate-tests-{XDIST_WORKER}-{os.getpid()}"
    _worker_tmp.mkdir()
    os.environ["TMPDIR"] = str(_worker_tmp)
    tempfile.tempdir = None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the worker's temporary directory."""
    if XDIST_WORKER:
        shutil.rmtree(_worker_tmp, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the README's command), keep every Spark test on
    one worker, in the order they were collected, and let the other worker run the rest beside them:
    two Spark sessions at once on two cores slow each other until Spark's own timeouts fire. A test
    that starts Spark without one of :data:`SPARK_FIXTURES` (``request.getfixturevalue``, a Spark of
    its own in a subprocess) carries the ``spark`` marker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            fixtures & SPARK_FIXTURES
            or item.get_closest_marker("spark") is not None
            or item.get_closest_marker("slow") is not None
        ):
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif item.path.name in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
