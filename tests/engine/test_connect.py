"""blobstate from a Spark Connect client: a real Connect server (PySpark's own, started by the fixture)
with blobstate's plugin runs the README's running count with the pandas, row and arrow APIs, with the
same outputs, batch by batch, as the same job on the tests' classic session and as a model of it; a
query stopped and started again over Connect goes on from its checkpoint; a server without the plugin
is refused in one line that names what is missing. The client is a process of its own
(``connect_job.py``) whose only session is the Connect one, as a notebook's or an IDE's is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from connect_job import INITIAL_STATE, start_running_count

import blobstate
from connect_server import connect_server

JOB = Path(__file__).with_name("connect_job.py")

pytestmark = pytest.mark.spark

BATCHES = [
    {"key": ["a", "b", "a"], "value": [1, 2, 3]},
    {"key": ["b", "c"], "value": [10, 20]},
    {"key": ["c", "a", "d"], "value": [5, 6, 7]},
]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Connect server with blobstate's plugin for this module."""
    with connect_server(tmp_path_factory.mktemp("connect"), plugin=True) as server:
        yield server.url


def _write_input(directory: Path, batches: list[dict[str, list[Any]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(batches):
        pd.DataFrame(batch).to_parquet(directory / f"part-{i}.parquet")
        os.utime(directory / f"part-{i}.parquet", (1_600_000_000 + i, 1_600_000_000 + i))


def _run(session: Any, work: Path, api: str, **options: Any) -> None:
    """The README's running count on the classic ``session``, as ``connect_job.py`` runs it over Connect
    (``options``: its flags)."""
    query = start_running_count(session, work, api, **options)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def _run_remote(url: str, work: Path, api: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``connect_job.py`` against ``url``: the same job from a Connect client process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, str(JOB), url, str(work), api, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _outputs(work: Path) -> list[tuple[int, str, int, int]]:
    """Every batch's output rows, read with pyarrow (not Spark), sorted."""
    rows = []
    for part in sorted((work / "out").glob("batch=*")):
        batch = int(part.name.split("=")[1])
        for r in pq.read_table(part).to_pylist():
            rows.append((batch, r["key"], r["count"], r["total"]))
    return sorted(rows)


def _model(batches: list[dict[str, list[Any]]]) -> list[tuple[int, str, int, int]]:
    """What the running count emits: per batch, each key seen with its counters so far."""
    counts: dict[str, tuple[int, int]] = {}
    rows = []
    for b, batch in enumerate(batches):
        for key in sorted(set(batch["key"])):
            values = [v for k, v in zip(batch["key"], batch["value"], strict=True) if k == key]
            count, total = counts.get(key, (0, 0))
            counts[key] = (count + len(values), total + sum(values))
            rows.append((b, key, *counts[key]))
    return sorted(rows)


TIERS = [
    {"key": ["a", "b"], "tier": ["gold", "silver"]},
    {"key": ["c"], "tier": ["bronze"]},
    {"key": ["a"], "tier": ["platinum"]},
]


def _tiered_outputs(work: Path) -> list[tuple[int, str, int, int, str | None]]:
    """Every batch's output rows with the tier column, read with pyarrow, sorted."""
    rows = []
    for part in sorted((work / "out").glob("batch=*")):
        batch = int(part.name.split("=")[1])
        for r in pq.read_table(part).to_pylist():
            rows.append((batch, r["key"], r["count"], r["total"], r["tier"]))
    return sorted(rows, key=repr)


def _tiered_model() -> list[tuple[int, str, int, int, str | None]]:
    """The running count seeded by ``INITIAL_STATE``, each key's tier as of its batch (the batch's side
    rows come first)."""
    seeds = {key: (count, total) for key, count, total in INITIAL_STATE}
    tiers: dict[str, str] = {}
    rows = []
    for (b, model_row), tier_batch in zip(_batches_of(_model(BATCHES)), TIERS, strict=True):
        tiers.update(zip(tier_batch["key"], tier_batch["tier"], strict=True))
        for _, key, count, total in model_row:
            seed_count, seed_total = seeds.get(key, (0, 0))
            rows.append((b, key, count + seed_count, total + seed_total, tiers.get(key)))
    return sorted(rows, key=repr)


def _batches_of(rows: list[tuple[int, str, int, int]]) -> list[tuple[int, list[tuple[int, str, int, int]]]]:
    return [(b, [r for r in rows if r[0] == b]) for b in range(len(BATCHES))]


def _write_tiers(directory: Path, batches: list[dict[str, list[Any]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(batches):
        pd.DataFrame(batch).to_parquet(directory / f"part-{i}.parquet")
        os.utime(directory / f"part-{i}.parquet", (1_600_000_000 + i, 1_600_000_000 + i))


def test_a_side_stream_initial_state_and_a_rescale_at_start_over_connect_equal_the_classic_session(
    connect_url: str, spark: Any, tmp_path: Path
) -> None:
    """A query with a side stream (an adjunct store) and Spark's initialState runs two batches, then is
    started again with num_partitions=3 and allow_rescale: over Connect as on the classic session, with
    the same outputs as a model; the server drops its copy of the initial state once a batch committed."""
    remote, classic = tmp_path / "connect", tmp_path / "classic"
    for work in (remote, classic):
        _write_input(work / "in", BATCHES[:2])
        _write_tiers(work / "tiers", TIERS[:2])
    first = _run_remote(connect_url, remote, "pandas", "side", "initial")
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    _run(spark, classic, "pandas", side=True, initial=True)
    for work in (remote, classic):  # the third batch arrives while the query is down
        _write_input(work / "in", BATCHES)
        _write_tiers(work / "tiers", TIERS)
    second = _run_remote(connect_url, remote, "pandas", "side", "initial", "partitions=3", "read")
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    _run(spark, classic, "pandas", side=True, initial=True, partitions=3)
    expected = _tiered_model()
    assert _tiered_outputs(classic) == expected
    assert _tiered_outputs(remote) == expected
    for ran in (first, second):  # the server holds no copy of the initial state after the run
        (views,) = [
            json.loads(x)["global_views"] for x in ran.stdout.splitlines() if x.startswith('{"global')
        ]
        assert not [v for v in views if v.startswith("blobstate_")], views
    newest = max((remote / "checkpoint" / "commits").glob("*.json"), key=lambda p: int(p.stem))
    assert len(json.loads(newest.read_text())["checkpoints"]["0"]) == 3  # rescaled before batch 2
    (read,) = [json.loads(x)["state"] for x in second.stdout.splitlines() if x.startswith('{"state"')]
    classic_read = sorted(repr(r) for r in blobstate.read_state(spark, str(classic / "checkpoint")).collect())
    assert read == classic_read and len(read) == 5  # a, b, c, d and z (initial state only)


@pytest.mark.parametrize("api", ["pandas", "row", "arrow"])
def test_the_running_count_over_connect_equals_the_classic_session(
    api: str, connect_url: str, spark: Any, tmp_path: Path
) -> None:
    _write_input(tmp_path / "connect" / "in", BATCHES)
    ran = _run_remote(connect_url, tmp_path / "connect", api, "read")
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    (read,) = [json.loads(x)["state"] for x in ran.stdout.splitlines() if x.startswith('{"state"')]
    (direct,) = [json.loads(x)["format_state"] for x in ran.stdout.splitlines() if x.startswith('{"format')]
    assert direct == read  # spark.read.format("blobstate") reads the same, with nothing registered first
    (refused,) = [json.loads(x)["batch_reports"] for x in ran.stdout.splitlines() if x.startswith('{"batch_')]
    assert "over Spark Connect" in refused and "progress_metrics" in refused
    _write_input(tmp_path / "classic" / "in", BATCHES)
    _run(spark, tmp_path / "classic", api)
    expected = _model(BATCHES)
    assert _outputs(tmp_path / "classic") == expected
    assert _outputs(tmp_path / "connect") == expected
    # The state reader over Connect reads what the classic session's reader reads, for both checkpoints.
    classic_read = sorted(
        repr(r) for r in blobstate.read_state(spark, str(tmp_path / "classic" / "checkpoint")).collect()
    )
    connect_read = sorted(
        repr(r) for r in blobstate.read_state(spark, str(tmp_path / "connect" / "checkpoint")).collect()
    )
    assert len(classic_read) == 4  # a, b, c, d
    assert read == connect_read == classic_read


def test_persisted_outputs_reach_the_sink_through_the_committed_only_view_over_connect(
    connect_url: str, tmp_path: Path
) -> None:
    """Outputs too large to come back with the tasks' metadata stay persisted on the executors and the
    sink reads the plugin's committed-only view of them: the stage must not run again for that view (a
    new attempt's outputs would be refused as another attempt's)."""
    _write_input(tmp_path / "in", BATCHES)
    ran = _run_remote(connect_url, tmp_path, "arrow", "persisted")
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert _outputs(tmp_path) == _model(BATCHES)
    commits = sorted((tmp_path / "checkpoint" / "commits").glob("*.json"))
    assert len(commits) == len(BATCHES)
    for path in commits:  # every batch's outputs came through the persisted stage, in one attempt
        metrics = json.loads(path.read_text())["metrics"]
        assert metrics["inlined_partitions"] == 0, metrics
        assert metrics["stage_attempts"] == 1, metrics


def test_a_query_stopped_and_started_again_over_connect_goes_on_from_its_checkpoint(
    connect_url: str, tmp_path: Path
) -> None:
    _write_input(tmp_path / "in", BATCHES[:2])
    first = _run_remote(connect_url, tmp_path, "pandas")
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    _write_input(tmp_path / "in", BATCHES)  # the third file arrives while the query is down
    second = _run_remote(connect_url, tmp_path, "pandas")
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert _outputs(tmp_path) == _model(BATCHES)


def test_a_connect_server_killed_during_the_query_loses_nothing_and_a_new_one_goes_on(tmp_path: Path) -> None:
    """SIGKILL the Connect server (its JVM, the query's Python driver, the workers) once the first batch's
    outputs are written; a new server and the same client job finish the input: the outputs and the state
    equal the model, and the commit log holds every batch once."""
    _write_input(tmp_path / "in", BATCHES)
    with connect_server(tmp_path / "server-1", plugin=True) as server:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        client = subprocess.Popen(
            [sys.executable, str(JOB), server.url, str(tmp_path), "pandas"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        while not (tmp_path / "out" / "batch=0" / "_SUCCESS").exists():
            assert client.poll() is None and time.monotonic() < deadline, "batch 0 never finished"
            time.sleep(0.05)
        server.kill()
        try:
            client.wait(60)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait(10)
    killed_at = len(list((tmp_path / "checkpoint" / "commits").glob("*.json")))
    assert killed_at < len(BATCHES), "the kill came after the whole input: it tested nothing"
    with connect_server(tmp_path / "server-2", plugin=True) as server:
        ran = _run_remote(server.url, tmp_path, "pandas", "read")
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert _outputs(tmp_path) == _model(BATCHES)
    (state,) = [json.loads(x)["state"] for x in ran.stdout.splitlines() if x.startswith('{"state"')]
    assert len(state) == 4  # a, b, c, d
    commits = sorted(int(p.stem) for p in (tmp_path / "checkpoint" / "commits").glob("*.json"))
    assert commits == list(range(1, len(BATCHES) + 1))


def test_await_input_drained_returns_over_connect_in_processing_time_mode(
    connect_url: str, tmp_path: Path
) -> None:
    """Time mode ProcessingTime runs a batch every trigger, so Spark's processAllAvailable never returns;
    the query's awaitInputDrained does, from blobstate's figures in the query's progress."""
    _write_input(tmp_path / "in", BATCHES)
    ran = _run_remote(connect_url, tmp_path, "pandas", "drain")
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    # No-data batches may run between the input's: compare the rows, not the batch ids.
    assert sorted(r[1:] for r in _outputs(tmp_path)) == sorted(r[1:] for r in _model(BATCHES))


def test_a_processor_failure_in_the_server_reaches_the_client_cause_first(
    connect_url: str, tmp_path: Path
) -> None:
    _write_input(tmp_path / "in", BATCHES)
    ran = _run_remote(connect_url, tmp_path, "pandas", "fail")
    assert ran.returncode == 4, ran.stdout + ran.stderr[-3000:]
    (failed,) = [json.loads(x) for x in ran.stdout.splitlines() if x.startswith('{"failed"')]
    assert failed["failed"] == "ProcessorQueryError", failed
    assert (
        "ValueError: the processor refuses key c (in handleInputRows for grouping key ('c',))"
        in failed["first"]
    )
    assert "batch 1" in failed["first"]


def test_a_server_without_the_plugin_is_refused_in_one_line(tmp_path: Path) -> None:
    with connect_server(tmp_path / "server", plugin=False) as server:
        _write_input(tmp_path / "in", BATCHES[:1])
        ran = _run_remote(server.url, tmp_path, "pandas")
    assert ran.returncode == 3, ran.stdout + ran.stderr[-3000:]
    (message,) = [line for line in ran.stdout.splitlines() if line.startswith("refused: ")]
    assert message.startswith("refused: ConnectPluginMissingError: ")
    assert "blobstate needs its Spark Connect server plugin" in message
    assert "spark.connect.extensions.relation.classes=org.apache.spark.sql.blobstate.ConnectPlugin" in message
    assert not (tmp_path / "checkpoint" / "commits").exists()  # refused before any commit


def test_blobstate_demo_runs_over_connect_stopped_and_restarted(connect_url: str, tmp_path: Path) -> None:
    """``blobstate demo --remote``: the demo's query (event time, timers, the profile side stream) runs
    in the Connect server, is stopped mid-stream, restarted, and its sessions equal the reference."""
    from typer.testing import CliRunner

    from blobstate.cli.main import app

    result = CliRunner().invoke(
        app,
        [
            "demo",
            "--remote",
            connect_url,
            "--workdir",
            str(tmp_path / "demo"),
            "--batches",
            "5",
            "--events",
            "600",
            "--users",
            "300",
            "--partitions",
            "2",
            "--kill-after",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "stopped the query mid-batch after" in result.output
    assert "identical to the reference" in result.output
    restarted = [line for line in result.output.splitlines() if line.strip().startswith("restarted")]
    assert len(restarted) >= 4, result.output  # the restart ran the rest of the stream
