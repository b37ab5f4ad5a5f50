"""Standby replicas and failover on a real multi-host Spark cluster.

The driver is a subprocess (``standby_jobs.py``) against the session's cluster: three workers on
127.0.0.2-4 with private disks, two executors (one core each), one spare worker for replacements. The
test kills whole hosts (worker, executors, Python workers) between batches and during a batch, and
checks every batch's outputs against a plain-Python reference, Invariant 1 against the executors' real
hosts, and that moved partitions restored no snapshot (only the deltas their replica missed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cluster import MultiHostCluster

HERE = Path(__file__).resolve().parent
ENGINE_TESTS = HERE.parent / "engine"
sys.path.insert(0, str(ENGINE_TESTS))

from failure_jobs import make_batches, read_output_dir, reference_outputs, write_inputs  # noqa: E402
from standby_jobs import SLOW_KEY  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4


RUNNING: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_leftover_jobs() -> Iterator[None]:
    """A test that fails half-way leaves no paused driver behind."""
    yield
    while RUNNING:
        proc = RUNNING.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


class Job:
    """A running ``standby_jobs.py`` driver: its JSON lines as they come, and its control directory."""

    def __init__(
        self,
        cluster: MultiHostCluster,
        tmp: Path,
        *args: str,
        name: str = "job",
        partitions: int = PARTITIONS,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.control = tmp / "control"
        self.control.mkdir(exist_ok=True)
        self.out = tmp / f"{name}.out"
        self.log = tmp / f"{name}.log"
        conf = {**cluster.driver_conf(), **cluster.fast_recovery_conf(), **(conf or {})}
        command = [
            sys.executable,
            str(HERE / "standby_jobs.py"),
            *(f"--conf={k}={v}" for k, v in conf.items()),
            "--input",
            str(tmp / "in"),
            "--checkpoint",
            str(tmp / "ckpt"),
            "--output",
            str(tmp / "out"),
            "--local-dir",
            cluster.host_disk,
            "--control",
            str(self.control),
            f"--partitions={partitions}",
            *args,
        ]
        env = cluster.driver_env([str(HERE), str(ENGINE_TESTS)])
        with self.out.open("w") as stdout, self.log.open("w") as stderr:
            self.proc = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, cwd=tmp)
        RUNNING.append(self.proc)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.startswith("{")]

    def wait_for(self, predicate: Any, what: str, timeout: float = 300.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines():
                if predicate(line):
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"job never reached {what}:\n{self.log.read_text(errors='replace')[-4000:]}")

    def resume(self, batch: int) -> None:
        (self.control / f"resume-{batch}").touch()

    def finish(self, timeout: float = 600.0) -> list[dict[str, Any]]:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert code == 0, self.log.read_text(errors="replace")[-6000:]
        return self.lines()


def batches_of(lines: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {line["batch_id"]: line for line in lines if "batch_id" in line and not line.get("skipped")}


def check_invariant_1(line: dict[str, Any], lost_host: str | None = None) -> None:
    """Every standby on a live executor of another host than its active's (there are two hosts or more).

    ``lost_host`` died during this batch: a partition whose task had finished there before may commit
    with it as its active (its outputs came back with its metadata, so nothing ran again); the next
    batch's check, without ``lost_host``, sees it moved."""
    alive = {tuple(e) for e in line["alive"]}
    hosts = {h for _, h in alive}
    for p, a in line["assignment"].items():
        active = (a["active"]["executor_id"], a["active"]["host"])
        if active[1] == lost_host:
            continue
        assert active in alive, f"batch {line['batch_id']}: partition {p} active on a dead executor"
        for s in a["standbys"]:
            standby = (s["executor_id"], s["host"])
            assert standby != active
            if len(hosts) > 1:
                assert s["host"] != a["active"]["host"], f"batch {line['batch_id']}: partition {p}: {a}"


def host_index(cluster: MultiHostCluster, host: str) -> int:
    return cluster.hosts.index(host)


def inputs(tmp: Path, count: int, slow_batch: int | None = None) -> list[pa.Table]:
    tables = make_batches(count, rows=300, keys=40, seed=3)
    if slow_batch is not None:
        extra = pa.table({"k": [SLOW_KEY], "v": [7]}, schema=tables[0].schema)
        tables[slow_batch] = pa.concat_tables([tables[slow_batch], extra])
    write_inputs(tables, tmp / "in")
    return tables


def test_host_losses_between_and_during_batches_fail_over_to_standbys_with_exact_state(
    multihost_cluster: MultiHostCluster, tmp_path: Path
) -> None:
    cluster = multihost_cluster
    tables = inputs(tmp_path, 12, slow_batch=6)
    job = Job(cluster, tmp_path, "--standby-replicas=1", "--pause-after=2", "--pause-after=4")

    # Between batches: lose the host of partition 0's active.
    paused = job.wait_for(lambda line: line.get("batch_id") == 2, "batch 2")
    job.wait_for(lambda line: line.get("paused") == 2, "the pause after batch 2")
    check_invariant_1(paused)
    assert all(len(a["standbys"]) == 1 for a in paused["assignment"].values())
    # Every assigned standby is at the committed version (a replica no longer assigned may lag behind).
    versions = {(str(p), host): v for p, host, v in paused["replica_versions"]}
    assigned = [(p, s["host"]) for p, a in paused["assignment"].items() for s in a["standbys"]]
    assert all(versions.get(k) == 3 for k in assigned), (assigned, paused["replica_versions"])
    victim = paused["assignment"]["0"]["active"]
    lost = sorted(p for p, a in paused["assignment"].items() if a["active"]["host"] == victim["host"])
    cluster.kill_host(host_index(cluster, victim["host"]))
    job.resume(2)

    after = job.wait_for(lambda line: line.get("batch_id") == 3, "batch 3")
    standby = after["standby"]
    assert standby["failovers"] == len(lost) and standby["failovers_without_standby"] == 0, standby
    assert standby["active_failures"] == len(lost) and standby["standby_failures"] >= 1
    for p in lost:
        metrics = after["partitions"][p]
        assert metrics["host"] != victim["host"]
        assert metrics["snapshot_restore_bytes"] == 0, (p, metrics)
        assert metrics["load_rule"] in ("standby", "standby+deltas"), metrics
    job.wait_for(lambda line: line.get("paused") == 4, "the pause after batch 4")
    # A replacement executor comes up on the spare host before batch 5 (the job waits for it).
    cluster.start_host(host_index(cluster, victim["host"]))  # the spare comes back for the next loss
    job.resume(4)

    # During batch 6: the task holding SLOW_KEY sleeps; kill its host while it does.
    marker = job.control / "in-stage.json"
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert time.monotonic() < deadline and job.proc.poll() is None, job.log.read_text()[-4000:]
        time.sleep(0.1)
    slow = json.loads(marker.read_text())
    cluster.kill_host(host_index(cluster, slow["host"]))
    lines = job.finish()

    batches = batches_of(lines)
    six = batches[6]
    moved = six["partitions"][str(slow["partition"])]
    assert moved["host"] != slow["host"]
    assert moved["snapshot_restore_bytes"] == 0, moved
    assert six["standby"]["failovers"] >= 1, six["standby"]
    # The move names where the partition was planned and where Spark ran it again; that retry is
    # recovery time, which a batch without a failure does not have.
    # The plan of batch 6 may first have moved the partition onto the slow host (a rebalance onto the
    # replacement executor); the move Spark made after the kill is the one that must be reported.
    moves = [m for m in six["standby"]["moves"] if m["partition"] == slow["partition"]]
    assert [(m["reason"], m["from_host"], m["to_host"]) for m in moves if m["reason"] == "during-batch"] == [
        ("during-batch", slow["host"], moved["host"])
    ], moves
    assert all(m["to_host"] == slow["host"] for m in moves if m["reason"] == "rebalance"), moves
    assert six["spark_recovery_seconds"] > 0 and batches[2]["spark_recovery_seconds"] == 0, (six, batches[2])
    for batch_id, line in batches.items():
        check_invariant_1(line, lost_host=slow["host"] if batch_id == 6 else None)
    assert 7 in batches  # checked strictly: nothing active on the host lost in batch 6
    # The replacement executors got partitions (gradual rebalancing), not one executor holding all.
    last = batches[max(batches)]
    actives = {a["active"]["executor_id"] for a in last["assignment"].values()}
    assert len(actives) == 2, last["assignment"]
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)


def test_a_restarted_driver_resumes_the_assignment_and_two_host_losses_in_a_row_keep_state_exact(
    multihost_cluster: MultiHostCluster, tmp_path: Path
) -> None:
    """Tasks run partition groups here (``partitions_per_task=2``): partitions with the same active and
    standby executors share a task, and a host loss moves each of them on its own."""
    cluster = multihost_cluster
    tables = inputs(tmp_path, 9)
    groups = {"spark.blobstate.partitions_per_task": "2"}
    first = Job(cluster, tmp_path, "--standby-replicas=1", "--stop-after=2", name="first", conf=groups)
    first.finish()
    recorded = batches_of(first.lines())[2]["assignment"]

    job = Job(
        cluster,
        tmp_path,
        "--standby-replicas=1",
        "--pause-after=3",
        "--pause-after=7",
        name="second",
        conf=groups,
    )
    resumed = job.wait_for(lambda line: line.get("batch_id") == 3, "batch 3")
    alive_hosts = {h for _, h in resumed["alive"]}
    for p, a in recorded.items():
        metrics = resumed["partitions"][p]
        if a["active"]["host"] in alive_hosts:
            # The new application's executor on the recorded host finds the working store on its disk.
            assert (metrics["host"], metrics["load_rule"]) == (a["active"]["host"], "working"), (p, metrics)
        assert metrics["snapshot_restore_bytes"] == 0, (p, metrics)
    check_invariant_1(resumed)

    for pause in (3, 7):
        job.wait_for(lambda line, b=pause: line.get("paused") == b, f"the pause after batch {pause}")
        line = batches_of(job.lines())[pause]
        # The replacement executor of the first loss got its standbys (and partitions) meanwhile.
        assert all(len(a["standbys"]) == 1 for a in line["assignment"].values()), line["assignment"]
        victim = line["assignment"]["0"]["active"]["host"]
        survivors = {p for p, a in line["assignment"].items() if a["active"]["host"] != victim}
        lost = set(line["assignment"]) - survivors
        # A replica the planner can fail over to has reported a synced version. With the tests' 1 s
        # locality wait a new standby's first sync task may run on another executor (``misplaced``) and
        # sync at the next commit only; such a partition moves cold, and its state stays exact.
        versions = {(str(p), host): v for p, host, v in line["replica_versions"]}
        synced = {
            p
            for p in lost
            if any(versions.get((p, s["host"]), 0) > 0 for s in line["assignment"][p]["standbys"])
        }
        assert synced, (lost, line["replica_versions"])  # the failover path itself is exercised
        cluster.kill_host(host_index(cluster, victim))
        job.resume(pause)
        after = job.wait_for(lambda line, b=pause + 1: line.get("batch_id") == b, f"batch {pause + 1}")
        assert after["standby"]["failovers"] == len(synced), (synced, after["standby"])
        assert after["standby"]["failovers_without_standby"] == len(lost - synced), (synced, after["standby"])
        assert after["standby"]["standby_failures"] >= len(survivors), after["standby"]
        for p in synced:
            assert after["partitions"][p]["snapshot_restore_bytes"] == 0, after["partitions"][p]
        for p in survivors:  # their standby died with the host: the active is not disturbed
            assert after["partitions"][p]["host"] == line["assignment"][p]["active"]["host"]
            assert after["partitions"][p]["load_rule"] == "working"
        cluster.start_host(host_index(cluster, victim))
    lines = job.finish()
    for line in batches_of(lines).values():
        check_invariant_1(line)
    tasks = [line["stage_tasks"] for line in batches_of(first.lines() + lines).values()]
    assert min(tasks) < PARTITIONS and max(tasks) <= PARTITIONS, tasks
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)


def test_invariant_2_a_failover_task_waits_for_the_standby_sync_running_on_its_executor(
    multihost_cluster: MultiHostCluster, tmp_path: Path
) -> None:
    """Two-core executors, so a sync task and a processing task can run at once on one executor. From
    batch 4's commit on, syncs read deltas slowly; the active host of partition 0 is killed while the
    sync of partition 0's replica (on the other host) still runs. The failover task of partition 0
    starts while that sync runs, and opens the partition only after the sync released it."""
    cluster = multihost_cluster
    tables = inputs(tmp_path, 7)
    conf = {"spark.executor.cores": "2", "spark.cores.max": "4"}
    job = Job(
        cluster,
        tmp_path,
        "--standby-replicas=1",
        "--pause-after=4",
        "--slow-sync-from=4",
        partitions=2,
        conf=conf,
    )
    job.wait_for(lambda line: line.get("paused") == 4, "the pause after batch 4")
    four = batches_of(job.lines())[4]
    victim = four["assignment"]["0"]["active"]["host"]
    standby = four["assignment"]["0"]["standbys"][0]
    cluster.kill_host(host_index(cluster, victim))
    job.resume(4)
    lines = job.finish()
    batches = batches_of(lines)
    failover = batches[5]["partitions"]["0"]
    assert (failover["executor_id"], failover["host"]) == (standby["executor_id"], standby["host"])
    syncs = [
        r
        for line in batches.values()
        for round_ in line["standby"]["sync"]
        for r in round_["replicas"]
        if r["partition"] == 0
        and (r["executor_id"], r["host"]) == (standby["executor_id"], standby["host"])
        and r["started_at"]
    ]
    overlapping = [r for r in syncs if r["started_at"] < failover["started_at"] < r["finished_at"]]
    assert overlapping, f"no sync of partition 0 was running when its failover task started: {syncs}"
    for r in overlapping:  # waited for, never raced
        assert r["finished_at"] <= failover["opened_at"], (r, failover)
    assert failover["snapshot_restore_bytes"] == 0
    assert read_output_dir(tmp_path / "out") == reference_outputs(tables)
