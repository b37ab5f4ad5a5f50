"""Remove the local copies of partitions a host no longer uses, after a grace period, never while in use.

A partition's local directory ``<local_dir>/<query-id>/<op>/<p>/`` holds its working store, local
checkpoints, background snapshot uploads, standby replica, or (operators ``adjunct-<name>``) the
executor's copy of a broadcast store. Once the partition runs elsewhere, or its query is gone, nothing
on this host opens it again, and it would stay on disk for the executor's lifetime. Everything in it is
a copy of committed state, so removing it is always safe for correctness: the next user rebuilds it
from the blob store.

Last use is the newest modification time of the directory's lock files (taking or releasing a
:class:`~blobstate.state.locking.PartitionLock` sets it, and broadcast readers set theirs), or of the
directory itself when it has none. :func:`sweep_local_dir` removes a directory whose last use is older
than the grace period only while it holds, taken without waiting, every lock that guards it: the
partition's ``LOCK`` (processing tasks, standby syncs, broadcast catch-ups), ``snapshots/UPLOAD.lock``
(a background snapshot upload) and ``ADJUNCT-READERS.lock`` (broadcast readers); and only when no
background upload of a live process is queued. Holding them, it renames the directory aside (one atomic
step) and deletes it in the background. Anyone who was waiting for one of those locks finds, once it
holds it, that the file it locked no longer has its name, and locks the new one
(:class:`~blobstate.state.locking.PartitionLock`).

Processing tasks and standby sync tasks (an executor may hold only standby replicas) call
:func:`sweep_idle`, at most every ``min(grace / 4, 60)`` seconds per Python worker. It covers every
query's directories under the local directory, not only the running query's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from blobstate import defaults
from blobstate.ids import InvalidIdError, validate_operator, validate_uid
from blobstate.state.localdirs import discard_tree, sweep_trash

log = logging.getLogger(__name__)

DEFAULT_LOCAL_DIR_GRACE_SECONDS = defaults.LOCAL_DIR_GRACE_SECONDS

MAX_SWEEP_INTERVAL_SECONDS = 60.0
"""A Python worker sweeps at most this often (more often when the grace period is short)."""

LOCK_FILE = "LOCK"
UPLOAD_LOCK = Path("snapshots") / "UPLOAD.lock"
READERS_LOCK = "ADJUNCT-READERS.lock"
STOP_FILE = "STANDBY-STOP"
USE_FILES = (LOCK_FILE, str(UPLOAD_LOCK), READERS_LOCK, STOP_FILE)
"""Files whose modification time records a use of the partition on this host."""


@dataclass
class SweepReport:
    """What one sweep found: the partition directories it removed and those it kept, by reason."""

    removed: list[Path] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)
    """Idle for longer than the grace period, but a lock was held or an upload was queued."""
    recent: int = 0
    """Directories used within the grace period."""
    errors: list[str] = field(default_factory=list)


def last_use(root: Path, *, ignore: tuple[str, ...] = (), default: float | None = None) -> float:
    """When the partition directory ``root`` was last used on this host (seconds since the epoch): the
    newest modification time of its ``USE_FILES`` but those in ``ignore``; without any, ``default``
    or else the directory's own."""
    times = []
    for name in USE_FILES:
        if name in ignore:
            continue
        try:
            times.append((root / name).stat().st_mtime)
        except FileNotFoundError:
            continue
    if times:
        return max(times)
    return root.stat().st_mtime if default is None else default


def partition_roots(local_dir: Path) -> list[Path]:
    """Every ``<query-id>/<op>/<p>`` directory under ``local_dir`` (names that are not blobstate's are
    left alone)."""
    roots: list[Path] = []
    for query in _subdirs(local_dir):
        try:
            validate_uid(query.name.replace("-", ""), "query id")
        except InvalidIdError:
            continue
        for op in _subdirs(query):
            try:
                validate_operator(op.name)
            except InvalidIdError:
                continue
            roots.extend(p for p in _subdirs(op) if p.name.isdigit())
    return roots


def _subdirs(path: Path) -> list[Path]:
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))


def _upload_queued(root: Path) -> bool:
    """Whether a live process has a background snapshot upload of this partition started or queued."""
    from blobstate.state.uploads import UPLOADING, UploadDir

    return any(s.state == UPLOADING and s.process_alive() for s in UploadDir(root / "snapshots").statuses())


class _InUse(Exception):
    """A lock of the directory is held by someone else."""


def _try_lock(path: Path) -> tuple[int, bool]:
    """Lock ``path`` exclusively without waiting; returns the descriptor and whether this created the
    file. Raises :class:`_InUse` when someone holds (or is just creating) the lock."""
    created = False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            raise _InUse from None
        created = True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _InUse from None
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def remove_if_idle(root: Path, grace_seconds: float, now: float | None = None) -> str:
    """Remove the partition directory ``root`` if unused for longer than ``grace_seconds`` and not in use.

    Returns ``removed``, ``recent`` (used within the grace period) or ``in-use`` (a lock is held or an
    upload queued); ``gone`` when the directory no longer exists.
    """
    clock = time.time() if now is None else now
    try:
        used = last_use(root)
    except FileNotFoundError:
        return "gone"
    if clock - used <= grace_seconds:
        return "recent"
    paths = [root / LOCK_FILE]
    if (root / UPLOAD_LOCK).parent.is_dir():  # without it no upload ran; one starts only under LOCK
        paths.append(root / UPLOAD_LOCK)
    paths.append(root / READERS_LOCK)  # made when missing: a reader that comes now waits for it
    held: list[int] = []
    created: list[str] = []  # lock files this sweep made: their times are no use
    try:
        for path in paths:
            fd, made = _try_lock(path)
            held.append(fd)
            if made:
                created.append(str(path.relative_to(root)))
        # Used between the first look and the locks: keep it.
        if clock - last_use(root, ignore=tuple(created), default=used) <= grace_seconds:
            return "recent"
        if _upload_queued(root):
            return "in-use"
        discard_tree(root)
        return "removed"
    except _InUse:
        return "in-use"
    except FileNotFoundError:  # removed meanwhile by another sweep
        return "gone"
    finally:
        for fd in reversed(held):
            os.close(fd)


def sweep_local_dir(
    local_dir: str | os.PathLike[str],
    grace_seconds: float,
    *,
    keep: tuple[Path, ...] = (),
    now: float | None = None,
) -> SweepReport:
    """Remove every partition directory under ``local_dir`` unused for longer than ``grace_seconds`` and
    not in use (never those in ``keep``), then empty operator and query directories as old as that."""
    if grace_seconds < 0:
        raise ValueError(f"local_dir_grace_seconds must not be negative, got {grace_seconds!r}")
    base = Path(local_dir)
    report = SweepReport()
    kept = {Path(k) for k in keep}
    for root in partition_roots(base):
        if root in kept:
            continue
        try:
            outcome = remove_if_idle(root, grace_seconds, now)
        except OSError as error:
            report.errors.append(f"{root}: {type(error).__name__}: {error}")
            continue
        if outcome == "removed":
            report.removed.append(root)
        elif outcome == "in-use":
            report.in_use.append(root)
        elif outcome == "recent":
            report.recent += 1
    clock = time.time() if now is None else now
    for query in _subdirs(base):
        if query.name.startswith("."):
            continue
        for op in _subdirs(query):
            sweep_trash(op)
            _rmdir_if_old(op, grace_seconds, clock)
        _rmdir_if_old(query, grace_seconds, clock)
    return report


def _rmdir_if_old(path: Path, grace_seconds: float, now: float) -> None:
    """Remove ``path`` if it is an empty directory not changed within the grace period."""
    try:
        if now - path.stat().st_mtime <= grace_seconds:
            return
        path.rmdir()
    except OSError:  # not empty, or removed meanwhile
        return


_last_sweep: dict[tuple[str, float], float] = {}


def sweep_idle(
    local_dir: str | os.PathLike[str], grace_seconds: float, *, keep: tuple[Path, ...] = ()
) -> int:
    """:func:`sweep_local_dir`, at most every ``min(grace / 4, 60)`` seconds in this process (per local
    directory and grace period); returns how many partition directories it removed. Never raises: a
    failed sweep is logged and retried later."""
    key = (str(local_dir), grace_seconds)  # another query's grace period sweeps on its own schedule
    clock = time.monotonic()
    previous = _last_sweep.get(key)
    if previous is not None and clock - previous < min(grace_seconds / 4, MAX_SWEEP_INTERVAL_SECONDS):
        return 0
    _last_sweep[key] = clock
    try:
        report = sweep_local_dir(local_dir, grace_seconds, keep=keep)
    except Exception as error:
        log.warning("sweeping idle partition directories under %s failed: %s", local_dir, error)
        return 0
    for problem in report.errors:
        log.warning("sweeping idle partition directories: %s", problem)
    if report.removed:
        log.info(
            "removed %d partition directories unused for %gs: %s",
            len(report.removed),
            grace_seconds,
            ", ".join(str(r) for r in report.removed),
        )
    return len(report.removed)
