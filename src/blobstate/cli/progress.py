"""Progress on stderr for the commands that can run for minutes, one helper for all of them (``rich``).

Drawn only when stderr is a terminal and never with ``--json`` (:func:`shown`), and transient: it is
erased when the command ends, so what the command prints (on stdout, and its ``error:`` lines) is the
same with or without it. Three forms:

- :func:`byte_bar`: a bar of bytes moved against a known total (``backup``, ``restore`` of a backup);
- :func:`step_bars`: one bar per kind of item read or drawn (``report``: commits, snapshot indexes,
  plots);
- :func:`store_activity`: a spinner with what this process's blob stores did so far (objects read,
  written, deleted, names listed; :mod:`blobstate.blobstore.activity`) and, for a Spark job, its running
  stages' tasks (``verify``, ``gc``, ``rescale``, ``inspect`` and ``restore`` of a query checkpoint),
  where no total is known in advance.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

StepProgress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: ``done`` of ``total`` items of kind ``what`` (``report``)."""


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def shown(as_json: bool) -> bool:
    """Whether a command draws progress: only on a terminal (stderr), never with ``--json``."""
    return not as_json and _stderr_is_terminal()


def _console() -> Any:
    """The console progress draws on: stderr (made only once it is known to be a terminal)."""
    from rich.console import Console

    return Console(stderr=True, force_terminal=True)


@contextmanager
def byte_bar(description: str, total: int, on: bool) -> Iterator[Callable[[int], None]]:
    """A bar of bytes moved (``callback(nbytes)`` as they move) against ``total``; a no-op when off."""
    if not on:
        yield lambda n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=_console(),
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def step_bars(on: bool) -> Iterator[StepProgress | None]:
    """One bar per kind of item (``reading commits``, ``drawing plots``), as ``progress(done, total,
    what)`` reports them; None when off."""
    if not on:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(
        *columns, console=_console(), transient=True, redirect_stdout=False, redirect_stderr=False
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(done: int, total: int, what: str) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(
                    f"reading {what}" if what != "plots" else "drawing plots", total=total
                )
            bar.update(tasks[what], completed=done, total=total)

        yield update


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n //= 1024
    raise AssertionError("unreachable")


class Activity:
    """What the blob stores of this process did since the command started, and the phase it is in;
    updated from any thread, read by the display as it refreshes."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        """Whether it is shown (when not, :meth:`follow_spark` polls nothing)."""
        self._lock = threading.Lock()
        self.read = self.read_bytes = self.written = self.written_bytes = self.deleted = self.listed = 0
        self.phase = ""
        """Set by the command (``starting Spark``) or by :meth:`follow_spark` (the running tasks)."""
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def add(self, kind: str, amount: int) -> None:
        """Count one blob store operation (the :mod:`blobstate.blobstore.activity` observer)."""
        with self._lock:
            if kind == "read":
                self.read += 1
                self.read_bytes += amount
            elif kind == "write":
                self.written += 1
                self.written_bytes += amount
            elif kind == "delete":
                self.deleted += amount
            elif kind == "list":
                self.listed += amount

    def text(self) -> str:
        """``read 12 objects (3.1 MiB), deleted 4, listed 1,024 names; Spark tasks 3/8``."""
        with self._lock:
            parts = []
            if self.read:
                objects = "object" if self.read == 1 else "objects"
                parts.append(f"read {self.read:,} {objects} ({_size(self.read_bytes)})")
            if self.written:
                parts.append(f"wrote {self.written:,} ({_size(self.written_bytes)})")
            if self.deleted:
                parts.append(f"deleted {self.deleted:,}")
            if self.listed:
                parts.append(f"listed {self.listed:,} names")
        done = ", ".join(parts)
        return "; ".join(p for p in (done, self.phase) if p) or "starting"

    def follow_spark(self, spark: Any) -> None:
        """Show the tasks of the Spark stages running on ``spark`` (polled twice a second until the
        display ends)."""
        if not self.on or spark is None or self._poller is not None:
            return

        def poll() -> None:
            while not self._stop.wait(0.5):
                try:
                    tracker = spark.sparkContext.statusTracker()
                    done = total = 0
                    for stage in tracker.getActiveStageIds():
                        info = tracker.getStageInfo(stage)
                        if info is not None:
                            done += info.numCompletedTasks
                            total += info.numTasks
                    self.phase = f"Spark tasks {done:,}/{total:,}" if total else ""
                except Exception:  # the session stopped, or a display detail: never fail the command
                    return

        self._poller = threading.Thread(target=poll, name="blobstate-progress-spark", daemon=True)
        self._poller.start()

    def _close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join()


@contextmanager
def store_activity(description: str, on: bool) -> Iterator[Activity]:
    """A spinner ``description: read 12 objects (3.1 MiB), ...`` with the time elapsed, counting every
    blob store operation of this process while the block runs; when off, the :class:`Activity` is
    still yielded (its calls do nothing visible) and nothing is observed."""
    activity = Activity(on)
    if not on:
        yield activity
        return
    from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from blobstate.blobstore.activity import observe

    class _Counts(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(activity.text())

    try:
        with (
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}:"),
                _Counts(),
                TimeElapsedColumn(),
                console=_console(),
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as bar,
            observe(activity.add),
        ):
            bar.add_task(description, total=None)
            yield activity
    finally:
        activity._close()


__all__ = ["Activity", "StepProgress", "byte_bar", "shown", "step_bars", "store_activity"]
