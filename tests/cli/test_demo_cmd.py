"""``blobstate demo``'s options reach :func:`blobstate.demo.run.run_demo` (replaced here: no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from blobstate.cli.main import app
from blobstate.demo import run
from blobstate.demo.clickstream import StreamShape


def _invoke(monkeypatch: pytest.MonkeyPatch, *args: str, matches: bool = True) -> tuple[int, dict[str, Any]]:
    """Run ``blobstate demo ARGS`` with ``run_demo`` replaced; its exit code and what ``run_demo`` got."""
    calls: list[dict[str, Any]] = []

    def fake_run_demo(
        workdir: Path, shape: StreamShape, partitions: int, kill_after: int, remote: str | None = None
    ) -> run.DemoResult:
        calls.append(
            {
                "workdir": workdir,
                "shape": shape,
                "partitions": partitions,
                "kill_after": kill_after,
                "remote": remote,
            }
        )
        return run.DemoResult(1, 1, 0, 0, matches, 0.0)

    monkeypatch.setattr(run, "run_demo", fake_run_demo)
    result = CliRunner().invoke(app, ["demo", *args])
    assert len(calls) == 1, result.output
    return result.exit_code, calls[0]


def test_remote_reaches_run_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = "sc://localhost:15002"
    code, got = _invoke(monkeypatch, "--workdir", str(tmp_path), "--remote", url, "--kill-after", "3")
    assert code == 0
    assert got["remote"] == url and got["kill_after"] == 3 and got["workdir"] == tmp_path


def test_without_remote_the_demo_runs_on_local_spark_and_a_mismatch_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, got = _invoke(monkeypatch, "--batches", "3", matches=False)
    assert code == 1
    assert got["remote"] is None and got["shape"] == StreamShape(
        batches=3, events_per_batch=10_000, users=10_000
    )


def test_the_help_says_what_the_connect_server_needs() -> None:
    result = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--remote sc://HOST:PORT" in text and "blobstate connect-server-args" in text
