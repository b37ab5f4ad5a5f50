"""Orchestrates ``blobstate demo``: generate clicks, run the job, kill it, restart it, check the result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console

from blobstate.blobstore.redact import redact
from blobstate.demo.clickstream import (
    SENTINEL_USER,
    StreamShape,
    generate_batches,
    generate_profiles,
    write_batches,
)
from blobstate.demo.job import STOPPED_KEY
from blobstate.demo.sessions import Session, reference_sessions
from blobstate.errors import ConfigurationError


@dataclass
class DemoResult:
    """What the demo saw: batches run per attempt, sessions emitted and expected, and the verdict."""

    batches_first_run: int
    batches_second_run: int
    sessions_emitted: int
    sessions_expected: int
    matches: bool
    seconds: float


def job_command(
    workdir: Path, partitions: int, remote: str | None = None, stop_after: int | None = None
) -> list[str]:
    """The command that runs the demo's job (``python -m blobstate.demo.job``) on ``workdir``'s files.

    With ``remote`` (an ``sc://`` URL) the job runs its query on that Spark Connect server, which opens
    the files itself: their paths are absolute. ``stop_after`` (with ``remote`` only) has the job stop
    the query after that many batches, the demo's kill over Connect.
    """
    if stop_after is not None and remote is None:
        raise ValueError("stop_after needs remote: the demo kills a local job instead")
    if remote is not None:
        workdir = workdir.resolve()
    command = [
        sys.executable,
        "-m",
        "blobstate.demo.job",
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
        "--partitions",
        str(partitions),
    ]
    if remote is not None:
        command += ["--remote", remote]
    if stop_after is not None:
        command += ["--stop-after", str(stop_after)]
    return command


def connect_location(url: str) -> str:
    """A Spark Connect URL as the demo shows it: up to its first ``;`` (the parameters that follow, a
    ``token`` among them, are never shown), with any userinfo masked."""
    return redact(url.split(";", 1)[0])


def _row(cells: list[str]) -> str:
    return "  " + "  ".join(f"{c:>11}" for c in cells)


def snapshot_taken(report: dict[str, Any]) -> bool:
    """Whether the batch snapshotted its state (some partition's), as ``blobstate lineage`` shows it.

    A snapshot uploaded in the background (the default) is named by a later batch's commit, which then
    reports ``snapshots``; ``lineage`` and ``report`` show it at the batch whose state it holds, and so
    does the demo: at the batch whose commit started its upload.
    """
    uploads = [(m.get("snapshot_upload") or {}) for m in report.get("partitions", {}).values()]
    if any(u.get("mode") == "background" for u in uploads):
        return any(u.get("started") for u in uploads)
    return bool(report["snapshots"])


def _run_job(command: list[str], console: Console, attempt: str, kill_after: int | None, log: Path) -> int:
    """Run the job, adding a table row per committed batch; SIGKILL it after ``kill_after`` batches. A
    job that stops its query itself (``--stop-after``, over Spark Connect) says so in a line of its own."""
    committed = 0
    with log.open("ab") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            if not line.startswith("{"):
                continue
            report = json.loads(line)
            if STOPPED_KEY in report:
                console.print(
                    f"  [bold red]stopped the query mid-batch after {report[STOPPED_KEY]} batches[/bold red]"
                    " (over Spark Connect the job runs in the server: a client's kill would leave it"
                    " running)"
                )
                continue
            if report["skipped"]:
                console.print(f"  [dim]batch {report['batch_id']} already committed: skipped[/dim]")
                continue
            committed += 1
            row = [
                attempt,
                str(report["batch_id"]),
                f"{report['input_rows']:,}",
                f"{report['output_rows']:,}",
                f"{report['seconds']:.2f}",
                f"{report['max_load_seconds']:.3f}",
                f"{report['bytes_uploaded'] / 1024:,.0f}",
                "snapshot" if snapshot_taken(report) else "delta",
            ]
            console.print(_row(row), highlight=False, soft_wrap=True)
            if kill_after is not None and committed >= kill_after:
                time.sleep(0.5)  # let the next batch start, so the kill lands mid-batch
                os.kill(process.pid, signal.SIGKILL)
                console.print(f"  [bold red]killed the job (SIGKILL) after {committed} batches[/bold red]")
                break
        process.wait()
    if kill_after is None and process.returncode != 0:
        raise RuntimeError(f"the demo job failed with exit code {process.returncode}; see {log}")
    return committed


DEMO_ENTRIES = frozenset({"checkpoint", "input", "job.log", "local", "output", "profiles"})
"""What the demo writes into its work directory: the only names it deletes there."""


class DemoWorkdirError(ConfigurationError, ValueError):
    """The demo's work directory holds something the demo did not write: it is never deleted."""


def clear_workdir(workdir: Path) -> None:
    """Make ``workdir`` an empty directory, deleting only an earlier demo's files: a directory holding
    anything else (a user's own files, a link) is refused, naming the first foreign entry."""
    if workdir.is_symlink() or (workdir.exists() and not workdir.is_dir()):
        raise DemoWorkdirError(f"demo work directory {workdir} is not a directory: give a new directory")
    if workdir.exists():
        foreign = sorted(e.name for e in workdir.iterdir() if e.name not in DEMO_ENTRIES or e.is_symlink())
        if foreign:
            raise DemoWorkdirError(
                f"demo work directory {workdir} holds {foreign[0]!r}, which the demo did not write: give a"
                " new directory (the demo deletes what an earlier demo left there, nothing else)"
            )
        for entry in workdir.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    workdir.mkdir(parents=True, exist_ok=True)


def run_demo(
    workdir: Path, shape: StreamShape, partitions: int = 4, kill_after: int = 6, remote: str | None = None
) -> DemoResult:
    """Run the whole demo in ``workdir`` (an earlier demo's files there deleted first, anything else
    refused) and return what it found.

    With ``remote`` (``sc://host:port``) the job's query runs on that Spark Connect server (with
    blobstate's plugin, and the work directory at the same path), and the first run stops its query after
    ``kill_after`` batches instead of being killed: a killed client would leave the query running in the
    server.
    """
    console = Console()
    started = time.monotonic()
    clear_workdir(workdir)
    batches = generate_batches(shape)
    profiles = generate_profiles(shape, len(batches))
    write_batches(batches, workdir / "input")
    write_batches(profiles, workdir / "profiles", "profiles")
    where = "local Spark" if remote is None else f"the Spark Connect server {connect_location(remote)}"
    console.print(
        f"[bold]blobstate demo[/bold]: {len(batches)} micro-batches of clicks ({shape.events_per_batch:,}"
        f" events, up to {shape.users:,} users) -> per-user sessions with an event-time timeout, each"
        f" tagged with the user's tier from a profile side stream ({profiles[0].num_rows:,} profiles, then"
        f" ~{profiles[1].num_rows if len(profiles) > 1 else 0:,} changes per batch) kept in an adjunct store;"
        f" {partitions} state partitions, checkpoint {workdir / 'checkpoint'}, on {where}"
    )
    header = ["run", "batch", "rows in", "rows out", "latency s", "restore s", "uploaded KB", "checkpoint"]
    console.print(_row(header), highlight=False, soft_wrap=True)
    log = workdir / "job.log"
    command = job_command(workdir, partitions, remote)
    if remote is None:
        first = _run_job(command, console, "first", kill_after, log)
    else:
        first = _run_job(job_command(workdir, partitions, remote, kill_after), console, "first", None, log)
    console.print("  [bold]restarting the job from its checkpoint[/bold]")
    second = _run_job(command, console, "restarted", None, log)

    emitted = read_sessions(workdir / "output")
    closed, still_open = reference_sessions(batches, profiles)
    expected = Counter(closed)
    matches = emitted == expected and set(still_open) <= {SENTINEL_USER}
    result = DemoResult(
        batches_first_run=first,
        batches_second_run=second,
        sessions_emitted=sum(emitted.values()),
        sessions_expected=sum(expected.values()),
        matches=matches,
        seconds=round(time.monotonic() - started, 1),
    )
    if matches:
        console.print(
            f"[bold green]OK[/bold green]: {result.sessions_emitted:,} sessions emitted across the"
            f" {'kill' if remote is None else 'stop'} and restart, each with the tier its user had when"
            f" it closed, identical to the reference computed without Spark ({result.seconds} s)"
        )
    else:
        missing = expected - emitted
        extra = emitted - expected
        console.print(
            f"[bold red]MISMATCH[/bold red]: {sum(missing.values())} expected sessions missing,"
            f" {sum(extra.values())} unexpected; first missing {list(missing)[:3]},"
            f" first extra {list(extra)[:3]}"
        )
    return result


def read_sessions(output_dir: Path) -> Counter[Session]:
    """Every session the demo's sink wrote to ``output_dir``, counted (as ``reference_sessions`` lists
    them)."""
    sessions: Counter[Session] = Counter()
    for path in sorted(output_dir.glob("batch-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            sessions[(row["user"], row["start_ms"], row["end_ms"], row["clicks"], row["tier"])] += 1
    return sessions
