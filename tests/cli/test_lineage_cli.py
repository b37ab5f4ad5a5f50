"""``blobstate lineage``: each version's time and batch metrics from its commit, one version in detail."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.ids import new_uid
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.lineage.refs import ObjectRef, PartitionObjects

T0 = 1_763_816_742_000  # 2025-11-22 13:05:42 UTC


def _checkpoint(root: Path) -> tuple[str, dict[int, dict[int, str]]]:
    """Versions 1..3 of two partitions; version 1 predates the metrics; partition 1 snapshots at 3."""
    url = str(root / "checkpoint")
    uids: dict[int, dict[int, str]] = {}
    with open_blob_store(url) as store:
        log = CommitLog(store)
        log.write_metadata(QueryMetadata.new(2, {"0": {"key_columns": ["k"]}}))
        for v in (1, 2, 3):
            uids[v] = {p: new_uid() for p in (0, 1)}
            metrics: dict[str, Any] | None = None
            if v > 1:
                metrics = {
                    "seconds": 1.25 * v,
                    "partitions": {
                        p: {
                            "input_rows": 1000 * v + p,
                            "output_rows": 10 * v + p,
                            "bytes_uploaded": 2048 * (p + 1),
                            "load_seconds": 0.5 * p + 0.125,
                            "load_rule": "working",
                            "state_keys": 7,
                        }
                        for p in (0, 1)
                    },
                }
            snap = {1: ObjectRef.of(b"index")} if v == 3 else {}
            log.write_commit(
                Commit(
                    version=v,
                    checkpoints={"0": uids[v]},
                    writer="w",
                    objects={"0": {p: PartitionObjects(ObjectRef.of(b"x" * v), snap.get(p)) for p in (0, 1)}},
                    retained_from=1,
                    metrics=metrics,
                    created_time_ms=T0 + 60_000 * v,
                )
            )
    return url, uids


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        main(args)
    except SystemExit as exited:
        assert exited.code in (None, 0), capsys.readouterr().err
    return capsys.readouterr().out


def _line(out: str, version: int) -> list[str]:
    """The table row of ``version``: it starts with the batch id, then the version."""
    row = [str(version - 1), str(version)]
    return next(line.split()[1:] for line in out.splitlines() if line.split()[:2] == row)


def test_each_version_shows_time_rows_seconds_upload_restore_and_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = _checkpoint(tmp_path)
    out = _run(["lineage", url], capsys)
    assert "newest committed version: 3 (the state after batch 2)" in out
    assert out.splitlines()[1].split()[:3] == ["batch", "version", "committed"]
    assert _line(out, 3) == [
        "3",
        "2025-11-22",
        "13:08:42",
        "6,001",
        "61",
        "3.750",
        "6.0",
        "KiB",
        "0.625",
        "snapshot",
        "1/2",
    ]
    assert _line(out, 2)[3:] == ["4,001", "41", "2.500", "6.0", "KiB", "0.625", "delta"]
    # version 1 was committed before the metrics existed
    assert _line(out, 1) == ["1", "2025-11-22", "13:06:42", "-", "-", "-", "-", "-", "delta"]


def test_one_version_shows_each_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, uids = _checkpoint(tmp_path)
    out = _run(["lineage", url, "--version", "2"], capsys)
    assert _line(out, 2)[3] == "4,001"
    assert not any(line.split()[:2] == ["2", "3"] for line in out.splitlines())
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if uids[2][0] in line or uids[2][1] in line
    }
    assert rows["0"][1:6] == [uids[2][0], "2,000", "20", "0.125", "working"]
    assert rows["1"][1:6] == [uids[2][1], "2,001", "21", "0.625", "working"]


def test_json_keeps_the_partitions_and_adds_the_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, uids = _checkpoint(tmp_path)
    result = json.loads(_run(["lineage", url, "--json"], capsys))
    assert result["latest"] == 3
    assert [v["version"] for v in result["versions"]] == [3, 2, 1]
    assert result["versions"][0]["seconds"] == 3.75 and result["versions"][0]["checkpoint"] == "snapshot 1/2"
    assert result["versions"][2]["seconds"] is None and result["versions"][2]["input_rows"] is None
    parts = {p["partition"]: p for p in result["partitions"]}
    assert [r["uid"] for r in parts[1]["versions"]] == [uids[3][1], uids[2][1], uids[1][1]]
    assert [r["snapshot"] for r in parts[1]["versions"]] == [True, False, False]

    one = json.loads(_run(["lineage", url, "--json", "--version", "2"], capsys))
    assert [v["version"] for v in one["versions"]] == [2]
    assert one["versions"][0]["partitions"]["1"]["restore_seconds"] == 0.625
    assert [[r["uid"] for r in p["versions"]] for p in one["partitions"]] == [[uids[2][0]], [uids[2][1]]]


def test_a_partition_lists_its_versions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, uids = _checkpoint(tmp_path)
    out = _run(["lineage", url, "--partition", "1"], capsys)
    assert "operator 0 partition 1:" in out and "partition 0:" not in out
    assert [line.split()[:3] for line in out.splitlines() if line.startswith("  ")] == [
        ["batch", str(v - 1), f"{v}_{uids[v][1]}"] for v in (3, 2, 1)
    ]


def test_an_uncommitted_version_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = _checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["lineage", url, "--version", "9"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "version 9" in err[0] and "commits/9.json" in err[0] and "is 3" in err[0]


@pytest.mark.parametrize("where", ["mistyped", "spark"])
def test_a_location_without_a_checkpoint_is_refused_like_every_other_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    url, _ = _checkpoint(tmp_path)
    if where == "spark":  # Spark's own checkpoint inside the query's location: no metadata.json
        target = Path(url) / "_spark"
        for name in ("metadata", "offsets/0", "commits/0"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_text("v1\n{}")
    else:
        target = tmp_path / "checkpont"
    lineage, report = ["lineage", str(target)], ["report", str(target), "--out", str(tmp_path / "report")]
    for args in (lineage, [*lineage, "--json"], report, ["verify", str(target)]):
        with pytest.raises(SystemExit) as exited:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        if args[0] in ("lineage", "report"):
            assert exited.value.code == 1
            # a mistyped path does not exist: said so, not "metadata.json is missing" (issue 33)
            said = "is not a query checkpoint" if where == "spark" else "does not exist"
            assert len(err) == 1 and err[0].startswith(f"error: {target} {said}"), err
            # Spark's own checkpoint inside the query's location names the location to give instead
            assert (f"give {url} " in err[0]) == (where == "spark"), err
        else:
            assert exited.value.code == 1  # verify refuses it too
    assert where == "spark" or not target.exists()


@pytest.mark.parametrize(
    ("command", "flags"), [("lineage", ["--json"]), ("verify", ["--json", "--checksums"])]
)
def test_help_shows_flags_as_flags(
    command: str, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run([command, "--help"], capsys)
    for flag in flags:
        line = next(line for line in out.splitlines() if line.strip().startswith(flag + " "))
        assert "<bool>" not in line and "/--no-" not in line, line
    assert "<bool>" not in out


def _failover_checkpoint(root: Path) -> str:
    """Version 1, then version 2: partition 0 failed over to its standby's host, which has a new standby."""
    url = str(root / "failover")
    placements = {
        1: {
            0: {
                "executor_id": "1",
                "host": "10.0.0.2",
                "standbys": [{"executor_id": "2", "host": "10.0.0.3"}],
            },
            1: {
                "executor_id": "2",
                "host": "10.0.0.3",
                "standbys": [{"executor_id": "1", "host": "10.0.0.2"}],
            },
        },
        2: {
            0: {
                "executor_id": "2",
                "host": "10.0.0.3",
                "standbys": [{"executor_id": "4", "host": "10.0.0.4", "version": 0}],
            },
            1: {
                "executor_id": "2",
                "host": "10.0.0.3",
                "standbys": [{"executor_id": "4", "host": "10.0.0.4", "version": 1}],
                "warmup": {"executor_id": "5", "host": "10.0.0.5", "version": 1},
            },
        },
    }
    moves = [
        {
            "partition": 0,
            "from": "1",
            "to": "2",
            "reason": "standby",
            "from_host": "10.0.0.2",
            "to_host": "10.0.0.3",
        },
        {"partition": 1, "to": "2", "reason": "during-batch"},  # as recorded before moves named hosts
    ]
    with open_blob_store(url) as store:
        log = CommitLog(store)
        log.write_metadata(QueryMetadata.new(2, {"0": {"key_columns": ["k"]}}))
        for v in (1, 2):
            log.write_commit(
                Commit(
                    version=v,
                    checkpoints={"0": {p: new_uid() for p in (0, 1)}},
                    writer="w",
                    objects={"0": {p: PartitionObjects(ObjectRef.of(b"x" * v)) for p in (0, 1)}},
                    retained_from=1,
                    placement=placements[v],  # type: ignore[arg-type]
                    metrics={
                        "seconds": 1.0,
                        "partitions": {
                            p: {"load_rule": "standby+deltas" if (v, p) == (2, 0) else "working"}
                            for p in (0, 1)
                        },
                        "standby": {"replicas": 1, "moves": moves if v == 2 else [], "lag_versions": {}},
                    },
                    created_time_ms=T0 + 60_000 * v,
                )
            )
    return url


def test_one_version_shows_active_and_standby_hosts_and_the_moves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _failover_checkpoint(tmp_path)
    out = _run(["lineage", url, "--version", "2"], capsys)
    assert "standby+deltas" in out
    hosts = {line.split()[0]: line for line in out.splitlines() if "10.0.0.3 (2)" in line}
    assert hosts["0"].split()[1:] == ["10.0.0.3", "(2)", "10.0.0.4", "(4)", "@", "0"]
    assert hosts["1"].split()[3:] == ["10.0.0.4", "(4)", "@", "1;", "warm-up", "10.0.0.5", "(5)", "@", "1"]
    moves = next(line for line in out.splitlines() if line.strip().startswith("moves:"))
    assert moves.strip() == (
        "moves: partition 0: 1 (10.0.0.2) -> 2 (10.0.0.3), standby; partition 1: ? -> 2, during-batch"
    )

    one = json.loads(_run(["lineage", url, "--json", "--version", "2"], capsys))["versions"][0]
    assert one["partitions"]["0"]["host"] == "10.0.0.3"
    assert one["partitions"]["0"]["standbys"] == [{"executor_id": "4", "host": "10.0.0.4", "version": 0}]
    assert one["partitions"]["1"]["warmup"] == {"executor_id": "5", "host": "10.0.0.5", "version": 1}
    assert one["standby"]["moves"][0] == {
        "partition": 0,
        "source": "1",
        "target": "2",
        "reason": "standby",
        "source_host": "10.0.0.2",
        "target_host": "10.0.0.3",
    }
    assert len(one["standby"]["moves"]) == 2


def test_a_background_snapshot_shows_at_the_batch_whose_state_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The snapshot of version 2 (batch 1), uploaded in the background and named by the commit of version
    3, is shown at version 2 in the table, in ``--version 2`` and in the partition's lineage alike."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from report_helpers import write_background_checkpoint

    url = str(tmp_path / "checkpoint")
    commits = write_background_checkpoint(url, tmp_path / "local", versions=5, every=2)
    assert commits[2].objects["0"][0].late_snapshot is not None  # the commit of 3 names 2's snapshot

    out = _run(["lineage", url], capsys)
    assert {v: _line(out, v)[-1] for v in range(1, 6)} == {
        1: "delta",
        2: "snapshot",
        3: "delta",
        4: "snapshot",
        5: "delta",
    }
    one = _run(["lineage", url, "--version", "2"], capsys)
    assert _line(one, 2)[-1] == "snapshot" and "yes (named in version 3)" in one
    assert _line(_run(["lineage", url, "--version", "3"], capsys), 3)[-1] == "delta"
    listing = _run(["lineage", url, "--partition", "0"], capsys)
    row = next(line.split() for line in listing.splitlines() if line.split()[:2] == ["batch", "1"])
    assert row[2] == f"2_{commits[1].checkpoints['0'][0]}" and "snapshot" in row

    as_json = json.loads(_run(["lineage", url, "--json", "--version", "2"], capsys))
    assert as_json["versions"][0]["checkpoint"] == "snapshot"
    assert as_json["versions"][0]["partitions"]["0"]["snapshot_named_in"] == 3


def test_restore_chains_read_as_counted_deltas_from_their_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One delta is "1 delta", and a version rebuilt from nothing says so: "1 delta from empty"."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from report_helpers import write_background_checkpoint

    url = str(tmp_path / "checkpoint")
    commits = write_background_checkpoint(url, tmp_path / "local", versions=4, every=2)
    snapshot = f"2_{commits[1].checkpoints['0'][0]}.snapshot"
    listing = _run(["lineage", url, "--partition", "0"], capsys)
    restores = {
        int(line.split()[1]) + 1: line.split("restore: ")[1]
        for line in listing.splitlines()
        if "restore: " in line
    }
    assert restores[1] == "1 delta from empty"
    assert restores[2] == snapshot  # named by the commit of 3, which is durable: what a reader restores
    assert restores[3] == f"{snapshot} + 1 delta"
    assert restores[4] == f"{snapshot} + 2 deltas"
    one = _run(["lineage", url, "--version", "1"], capsys)
    row = next(line for line in one.splitlines() if commits[0].checkpoints["0"][0] in line)
    assert row.endswith("1 delta from empty") and "deltas" not in row
