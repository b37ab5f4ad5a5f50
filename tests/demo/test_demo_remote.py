"""``blobstate demo --remote`` without Spark: the job commands the demo runs, the line saying where it
runs (never a Connect URL's parameters), and the job's stop line in the table."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from blobstate.demo import run
from blobstate.demo.clickstream import StreamShape
from blobstate.demo.job import STOPPED_KEY, report_from_progress
from blobstate.engine.driver import BatchReport

URL = "sc://spark.example:15002/;token=s3cr3t-t0ken;user_id=someone"


def _paths(workdir: Path) -> list[str]:
    return [
        "--input",
        str(workdir / "input"),
        "--profiles",
        str(workdir / "profiles"),
        "--checkpoint",
        str(workdir / "checkpoint"),
        "--output",
        str(workdir / "output"),
        "--local-dir",
        str(workdir / "local"),
    ]


def test_the_local_job_command_is_unchanged_and_the_remote_one_names_the_server_and_absolute_paths() -> None:
    relative = Path("blobstate-demo")
    job = [sys.executable, "-m", "blobstate.demo.job"]
    assert run.job_command(relative, 4) == [*job, *_paths(relative), "--partitions", "4"]
    absolute = relative.resolve()  # the server opens the files itself, from its own directory
    assert run.job_command(relative, 2, URL) == [
        *job,
        *_paths(absolute),
        "--partitions",
        "2",
        "--remote",
        URL,
    ]
    assert run.job_command(relative, 2, URL, 5)[-4:] == ["--remote", URL, "--stop-after", "5"]
    with pytest.raises(ValueError, match="stop_after needs remote"):
        run.job_command(relative, 2, None, 5)


def test_a_connect_url_is_shown_without_its_parameters() -> None:
    assert run.connect_location(URL) == "sc://spark.example:15002/"
    assert run.connect_location("sc://localhost:15002") == "sc://localhost:15002"
    assert run.connect_location("sc://user:password@host:15002/;x=1") == "sc://***@host:15002/"


def test_the_table_shows_a_batch_from_the_progress_and_the_jobs_stop_line(tmp_path: Path) -> None:
    report = BatchReport(
        batch_id=3,
        version=4,
        input_rows=10_000,
        output_rows=214,
        seconds=0.69,
        max_load_seconds=0.036,
        restore_bytes=0,
        bytes_uploaded=30_720,
        snapshots=0,
    )
    lines = [json.dumps(report_from_progress(report.progress_metrics())), json.dumps({STOPPED_KEY: 1})]
    job = [sys.executable, "-c", f"print({chr(10).join(lines)!r})"]
    out = io.StringIO()
    assert run._run_job(job, Console(file=out, width=200), "first", None, tmp_path / "job.log") == 1
    table = out.getvalue()
    assert (
        "first            3       10,000          214         0.69        0.036           30        delta"
        in table
    )
    assert "stopped the query mid-batch after 1 batches" in table and "SIGKILL" not in table


def _demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], workdir: Path, remote: str | None
) -> tuple[list[tuple[list[str], int | None]], str]:
    """Run the demo with its job replaced: the jobs it would run (command, kill_after) and what it
    printed."""
    jobs: list[tuple[list[str], int | None]] = []

    def fake_job(
        command: list[str], console: Console, attempt: str, kill_after: int | None, log: Path
    ) -> int:
        jobs.append((command, kill_after))
        return 0

    monkeypatch.setattr(run, "_run_job", fake_job)
    run.run_demo(workdir, StreamShape(batches=2, events_per_batch=20, users=10), 2, 3, remote=remote)
    return jobs, capsys.readouterr().out


def test_over_connect_the_first_job_stops_its_query_itself_and_the_url_shown_has_no_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    jobs, printed = _demo(monkeypatch, capsys, tmp_path / "demo", URL)
    workdir = tmp_path / "demo"
    assert jobs == [(run.job_command(workdir, 2, URL, 3), None), (run.job_command(workdir, 2, URL), None)]
    assert "on the Spark Connect server sc://spark.example:15002/" in " ".join(printed.split())
    assert "s3cr3t" not in printed and "someone" not in printed


def test_on_local_spark_the_first_job_is_killed_as_before(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    jobs, printed = _demo(monkeypatch, capsys, tmp_path / "demo", None)
    command = run.job_command(tmp_path / "demo", 2)
    assert jobs == [(command, 3), (command, None)]
    assert "--remote" not in command and "on local Spark" in " ".join(printed.split())
