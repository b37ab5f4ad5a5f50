"""A broadcast adjunct store on a real multi-host cluster: one copy per executor, one writer, all rows
seen by every task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from adjunct_jobs import clicks, discounts, profiles, reference, write_files

from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import state_prefix
from blobstate.lineage.commitlog import CommitLog
from cluster import MultiHostCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).parent
USERS = [f"u{i}" for i in range(24)]
TIERS = ["gold", "silver", "bronze"]


def test_each_executor_keeps_one_copy_written_by_one_writer_and_every_task_sees_every_row(
    multihost_cluster: MultiHostCluster, tmp_path: Path
) -> None:
    cluster = multihost_cluster
    click_files = [clicks([(u, 10 * b + i) for i, u in enumerate(USERS)]) for b in range(3)]
    profile_files = [profiles([(u, TIERS[(i + b) % 3]) for i, u in enumerate(USERS)]) for b in range(3)]
    discount_files = [discounts([(t, 5 * (j + 1) + b) for j, t in enumerate(TIERS)]) for b in range(3)]
    write_files(tmp_path / "clicks", click_files)
    write_files(tmp_path / "profiles", profile_files)
    write_files(tmp_path / "discounts", discount_files)
    checkpoint = str(tmp_path / "ckpt")
    conf = cluster.driver_conf()
    command = [
        sys.executable,
        str(HERE / "adjunct_jobs.py"),
        "--base",
        str(tmp_path),
        "--checkpoint",
        checkpoint,
        "--output",
        str(tmp_path / "out"),
        "--master",
        conf.pop("spark.master"),
        "--local-dir",
        cluster.host_disk,
        "--partitions",
        "4",
        "--executors",
        conf["spark.cores.max"],
        *(f"--conf={k}={v}" for k, v in conf.items()),
    ]
    done = subprocess.run(
        command,
        env=cluster.driver_env([str(HERE)]),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    # Every task saw every discount of its batch: the outputs are the reference's.
    expected = reference(click_files, profile_files, discount_files)
    got = {b: json.loads((tmp_path / "out" / f"batch-{b}.json").read_text()) for b in expected}
    assert got == {b: [list(r) for r in rows] for b, rows in expected.items()}

    log = CommitLog(open_blob_store(checkpoint))
    latest = log.latest_commit()
    operator = "adjunct-discounts"
    hosts_ran = {
        m["host"]
        for c in (log.read_commit(v) for v in range(1, latest.version + 1))
        for m in c.metrics["partitions"].values()
    }
    assert len(hosts_ran) == 2  # two executors, on two hosts
    # Every task of a batch read the broadcast store at that batch's version.
    for v in range(1, latest.version + 1):
        parts = log.read_commit(v).metrics["partitions"].values()
        assert {p["adjuncts"]["discounts"]["version"] for p in parts} == {v}
    # One writer: exactly one delta per version in the blob store, the committed one.
    store = open_blob_store(checkpoint)
    deltas = sorted(n for n in store.list(state_prefix(operator, 0)) if n.endswith(".delta"))
    committed = [
        f"{v}_{log.read_commit(v).checkpoints[operator][0]}.delta" for v in range(1, latest.version + 1)
    ]
    assert [Path(n).name for n in deltas] == committed
    # One copy per executor, each on its own host's disk, at the last version its tasks read.
    last = CheckpointId(latest.version, latest.checkpoints[operator][0])
    copies = []
    for i, host in enumerate(cluster.hosts):
        found = list(cluster.host_dir(i).glob(f"*/{operator}/0/standby/CHECKPOINT-ID"))
        if host in hosts_ran:
            assert len(found) == 1, f"host {host}: {found}"
            copies.append(found[0].read_text().strip())
        else:
            assert found == []
    assert copies == [last.name] * 2
