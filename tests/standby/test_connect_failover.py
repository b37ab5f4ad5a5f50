"""Host affinity and standby failover of a query started from a Spark Connect client, on the real
multi-host cluster: a Connect server (with blobstate's plugin) whose master is the cluster runs the
query's driver; steady batches reuse each executor's working store (the plugin's preferred locations),
and the loss of a whole host between batches moves its partitions to their standby replicas without a
snapshot restored, with outputs equal to a plain-Python reference."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import MultiHostCluster
from connect_server import connect_server

HERE = Path(__file__).resolve().parent
ENGINE_TESTS = HERE.parent / "engine"
sys.path.insert(0, str(ENGINE_TESTS))

from failure_jobs import make_batches, read_output_dir, reference_outputs, write_inputs  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PAUSE = 2


def _report(control: Path, batch: int, client: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """Batch ``batch``'s report, as the job's ``on_batch`` wrote it in the server's Python."""
    path = control / f"batch-{batch}.json"
    deadline = time.monotonic() + 300
    while not path.exists():
        assert client.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
        time.sleep(0.2)
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def test_host_affinity_and_a_standby_failover_over_connect_on_the_multihost_cluster(
    multihost_cluster: MultiHostCluster, tmp_path: Path
) -> None:
    cluster = multihost_cluster
    tables = make_batches(6, rows=300, keys=40, seed=3)
    write_inputs(tables, tmp_path / "in")
    env = cluster.driver_env([str(HERE), str(ENGINE_TESTS)])
    conf = {
        **cluster.driver_conf(),
        "spark.shuffle.io.retryWait": "1s",
        "spark.shuffle.io.maxRetries": "1",
        "spark.executorEnv.PYTHONPATH": env["PYTHONPATH"],  # the executors import the job's modules
    }
    with connect_server(tmp_path / "server", plugin=True, conf=conf, env=env) as server:
        log = tmp_path / "client.log"
        with log.open("w") as out:
            client = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "connect_standby_job.py"),
                    server.url,
                    str(tmp_path),
                    cluster.host_disk,
                    str(PAUSE),
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            control = tmp_path / "control"
            paused = _report(control, PAUSE, client, log)
            # Host affinity: after the first batch, every partition reopens its executor's working store.
            for batch in range(1, PAUSE + 1):
                rules = {
                    p: m["load_rule"] for p, m in _report(control, batch, client, log)["partitions"].items()
                }
                assert set(rules.values()) == {"working"}, (batch, rules)
            commit = json.loads((tmp_path / "ckpt" / "commits" / f"{PAUSE + 1}.json").read_text())
            placement = commit["placement"]
            assert all(len(a["standbys"]) == 1 for a in placement.values()), placement
            for a in placement.values():  # each standby on another host than its active
                assert a["standbys"][0]["host"] != a["host"], placement
            victim = placement["0"]["host"]
            lost = sorted(p for p, a in placement.items() if a["host"] == victim)
            assert paused["partitions"]["0"]["host"] == victim
            cluster.kill_host(cluster.hosts.index(victim))
            (control / f"resume-{PAUSE}").touch()
            assert client.wait(600) == 0, log.read_text(errors="replace")[-4000:]
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(30)
    after = json.loads((control / f"batch-{PAUSE + 1}.json").read_text())
    standby = after["standby"]
    assert standby["failovers"] == len(lost) and standby["failovers_without_standby"] == 0, standby
    for p in lost:
        metrics = after["partitions"][p]
        assert metrics["host"] != victim, (p, metrics)
        assert metrics["snapshot_restore_bytes"] == 0, (p, metrics)
        assert metrics["load_rule"] in ("standby", "standby+deltas"), (p, metrics)
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)
