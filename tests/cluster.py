"""A real multi-host Spark standalone cluster on one machine.

A master on 127.0.0.1 and one worker per loopback address (127.0.0.2, 127.0.0.3, ...): Spark tells
hosts apart by the address a worker advertises, so executors on distinct workers are on distinct hosts.
Each worker runs in its own mount namespace with its own directory bind-mounted at one common path
(:attr:`MultiHostCluster.host_disk`): the worker, its executors and their Python workers see a private
disk there, as on separate machines. Every daemon starts in its own process group (``setsid``) and is
stopped by group id, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class ClusterUnavailableError(RuntimeError):
    """The cluster cannot run here (no ``unshare``/``mount`` permission, no Java); the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` exists."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class MultiHostCluster:
    """A standalone master and ``workers`` workers on distinct loopback hosts, each with a private disk."""

    def __init__(
        self, workers: int = 3, *, root: Path | None = None, worker_memory: str = "1g", worker_cores: int = 1
    ) -> None:
        self.workers = workers
        self.worker_cores = worker_cores
        self.root = Path(root or tempfile.mkdtemp(prefix="blobstate-cluster-"))
        self.worker_memory = worker_memory
        self.host_disk = str(self.root / "disk")
        """The common path at which every host sees its own private directory."""
        self.master_port = _free_port()
        self.master_url = f"spark://127.0.0.1:{self.master_port}"
        self.hosts = [f"127.0.0.{i + 2}" for i in range(workers)]
        self._groups: dict[str, int] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: dict[str, Path] = {}

    # ------------------------------------------------------------------ layout
    def host_dir(self, i: int) -> Path:
        """The real directory behind host ``i``'s private disk."""
        return self.root / "hosts" / self.hosts[i]

    def driver_conf(self) -> dict[str, str]:
        """What a driver needs to use the cluster, with one worker left spare for replacements."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": "1",
            "spark.executor.memory": "768m",
            "spark.cores.max": str(self.workers - 1),
        }

    @staticmethod
    def fast_recovery_conf() -> dict[str, str]:
        """Spark settings that shorten its own recovery after a host loss, for the tests' sake: the shuffle
        retries as the README advises, and a short locality wait, which the README advises against in
        production (an idle replacement executor then takes partitions cold) but which keeps the tests'
        kills during a stage quick."""
        return {
            "spark.shuffle.io.retryWait": "1s",
            "spark.shuffle.io.maxRetries": "1",
            "spark.locality.wait": "1s",
        }

    @staticmethod
    def driver_env(extra_paths: list[str] | None = None) -> dict[str, str]:
        """Environment of a driver subprocess: its Python for the executors, the repo's code on the path."""
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([*(extra_paths or []), *(p for p in sys.path if p)])
        return env

    # ------------------------------------------------------------------ life cycle
    def start(self) -> MultiHostCluster:
        """Start the master and every worker; raises :class:`ClusterUnavailableError` when impossible."""
        if shutil.which("unshare") is None:
            raise ClusterUnavailableError("no unshare command: cannot give workers private disks")
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True, check=False
        )
        if probe.returncode != 0:
            raise ClusterUnavailableError(f"unshare -m is not permitted here: {probe.stderr.strip()}")
        Path(self.host_disk).mkdir(parents=True, exist_ok=True)
        try:
            self._start_master()
            for i in range(self.workers):
                self.start_host(i)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> int:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logs[name] = log
        with log.open("ab") as out:
            proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._groups[name] = proc.pid  # start_new_session: the pid is the group id
        self._procs.append(proc)
        return proc.pid

    def _wait_for_log(self, name: str, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        log = self._logs[name]
        while time.monotonic() < deadline:
            if log.exists() and text in log.read_text(errors="replace"):
                return
            if not _group_alive(self._groups[name]):
                break
            time.sleep(0.2)
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise ClusterUnavailableError(f"{name} did not report {text!r} within {timeout:g}s:\n{tail}")

    def _env(self, host: str) -> dict[str, str]:
        env = self.driver_env()
        env.update(SPARK_LOCAL_IP=host, SPARK_DAEMON_MEMORY="256m", SPARK_HOME=_spark_home())
        env.pop("SPARK_MASTER_OPTS", None)
        return env

    def _start_master(self) -> None:
        spark_class = os.path.join(_spark_home(), "bin", "spark-class")
        command = [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.master_port),
            "--webui-port",
            str(_free_port()),
        ]
        self._spawn("master", command, self._env("127.0.0.1"))
        self._wait_for_log("master", "I have been elected leader")

    def start_host(self, i: int) -> None:
        """Start (or restart) worker ``i`` on its host, with its private disk; waits until registered."""
        host = self.hosts[i]
        name = f"worker-{i}"
        if name in self._groups and _group_alive(self._groups[name]):
            return
        disk = self.host_dir(i)
        work = self.root / "work" / host
        local = self.root / "spark-local" / host
        for d in (disk, work, local):
            d.mkdir(parents=True, exist_ok=True)
        if name in self._logs:  # a restart: wait for the new registration, not the old line
            self._logs[name].rename(self._logs[name].with_suffix(f".{time.time_ns()}.log"))
        env = self._env(host)
        env["SPARK_LOCAL_DIRS"] = str(local)
        spark_class = os.path.join(_spark_home(), "bin", "spark-class")
        worker = (
            f"exec {spark_class} org.apache.spark.deploy.worker.Worker --host {host}"
            f" --cores {self.worker_cores} --memory {self.worker_memory} --work-dir {work} {self.master_url}"
        )
        command = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount --bind {disk} {self.host_disk} && {worker}",
        ]
        self._spawn(name, command, env)
        self._wait_for_log(name, "Successfully registered with master")

    def host_alive(self, i: int) -> bool:
        """Whether worker ``i``'s process group has a live process."""
        pgid = self._groups.get(f"worker-{i}")
        return pgid is not None and _group_alive(pgid)

    def kill_host(self, i: int, timeout: float = 30.0) -> None:
        """SIGKILL worker ``i`` with its executors and their Python workers (its whole process group,
        plus any descendant that left it, such as PySpark's daemon), and wait until all are gone."""
        pgid = self._groups[f"worker-{i}"]
        pids = self._descendants(pgid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.reap() or _group_alive(pgid) or any(_pid_alive(p) for p in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"processes of host {self.hosts[i]} still alive {timeout:g}s after SIGKILL"
                )
            time.sleep(0.05)

    def executor_pids(self, i: int) -> list[int]:
        """Pids of the executor JVMs running under worker ``i``."""
        out = []
        for pid in self._descendants(self._groups[f"worker-{i}"]):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmd:
                out.append(pid)
        return out

    @staticmethod
    def _descendants(root: int) -> list[int]:
        """``root`` and every process below it, from /proc's parent links."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every daemon (TERM, then KILL) and wait until no process of the cluster is left."""
        groups = list(self._groups.values())
        pids = [p for g in groups if _group_alive(g) for p in self._descendants(g)]
        for g in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        for g in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGKILL)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        while any(_group_alive(g) for g in groups) or any(_pid_alive(p) for p in pids):
            self.reap()
            time.sleep(0.05)

    def reap(self) -> None:
        """Collect exited daemons (so they do not linger as zombies)."""
        for proc in self._procs:
            proc.poll()

    def alive_groups(self) -> list[int]:
        """Process groups of the cluster that still have a live process."""
        return [g for g in self._groups.values() if _group_alive(g)]


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
