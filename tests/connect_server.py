"""A real Spark Connect server on 127.0.0.1 for the tests: PySpark's own ``SparkConnectServer`` class run
by ``spark-submit`` (what ``sbin/start-connect-server.sh`` runs), in ``local[2]``, with or without
blobstate's plugin (``blobstate connect-server-args``). Started in its own process group and stopped with
it, so no JVM or Python worker is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ConnectServer:
    """A running Connect server: its ``sc://`` URL and its process group."""

    url: str
    pgid: int

    def kill(self) -> None:
        """SIGKILL the server with its Python processes (a crash of the host running it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)


@contextlib.contextmanager
def connect_server(
    work: Path,
    *,
    plugin: bool,
    timeout: float = 180.0,
    conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[ConnectServer]:
    """Run a Connect server until the block ends (or it is killed). ``conf``: Spark conf of its driver
    (``spark.master`` replaces ``local[2]``: a cluster's master); ``env``: its environment (default: this
    process's, with this Python for the workers and this ``sys.path``)."""
    import pyspark

    from blobstate.cli.connect_cmd import server_args

    spark_home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "connect-server.log"
    if env is None:
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = sys.executable  # the server's Python: foreachBatch and the workers
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env = {**env, "SPARK_HOME": spark_home}
    conf = dict(conf or {})
    master = conf.pop("spark.master", "local[2]")
    command = [
        os.path.join(spark_home, "bin", "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        master,
        "--driver-memory",
        "1g",
        *(server_args() if plugin else []),
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
        "spark-internal",
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Connect server did not start:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        yield ConnectServer(f"sc://127.0.0.1:{port}", process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
