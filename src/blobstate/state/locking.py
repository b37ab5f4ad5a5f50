"""A process-level lock per partition, so two Python workers never open the same local partition at once.

The lock is ``fcntl.flock`` on ``<local_dir>/<query-id>/<op>/<p>/LOCK``. ``flock`` locks belong to an
open file description, so a second open in the same process conflicts too, and the kernel releases the
lock when the holder dies: a crashed worker never leaves a partition locked.

A partition's directory may be removed while others wait for its lock (the idle-directory sweep,
:mod:`blobstate.state.sweep`, removes it holding the lock). A waiter then holds a lock on a file that no
longer has a name, which protects nothing: every lock taken here is checked, once held, to still be the
file at its path, and taken again on the new file when it is not (:class:`PartitionLock`).

Taking and releasing a :class:`PartitionLock` set the lock file's modification time: it records when
the partition was last used on this host, which the sweep reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from blobstate.errors import StateError

DEFAULT_LOCK_TIMEOUT_SECONDS = 60.0

T = TypeVar("T")


class PartitionLockedError(StateError, TimeoutError):
    """Another process (or another open in this process) holds the partition's lock."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(
            f"partition lock {str(path)!r} is held by another worker: gave up after {timeout:g}s "
            "(is another task or standby sync running this partition on this executor?)"
        )
        self.path = path
        self.timeout = timeout


def create_despite_sweeps(path: Path, create: Callable[[Path], T]) -> T:
    """``create(path)`` after making ``path``'s directory, again while a sweep keeps removing the directory.

    The idle-directory sweep may remove the directory at any moment between making it and creating
    ``path`` in it (even inside ``mkdir``: it finds the directory, which is gone when it checks that it is
    one). A file in the way of the directory is an error, not a removal.
    """
    for _ in range(100):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return create(path)
        except FileNotFoundError:  # a directory on the way was removed meanwhile: make it again
            continue
        except FileExistsError:
            # a non-directory in the way is an error; gone, or made again meanwhile by another opener: retry
            if os.path.lexists(path.parent) and not os.path.isdir(path.parent):
                raise
            continue
    raise FileNotFoundError(f"cannot create {str(path)!r}: its directory keeps disappearing")


def _open_lock_file(path: Path) -> int:
    """Open (creating it and its directory) the lock file at ``path``."""
    return create_despite_sweeps(path, lambda p: os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))


def is_current(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed or replaced since)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def record_use(fd: int) -> None:
    """Set the lock file's modification time to now: the partition was used (see the module docstring)."""
    with contextlib.suppress(OSError):
        os.utime(fd)


class PartitionLock:
    """A ``flock`` on one file, exclusive or shared, taken with a timeout and released by :meth:`release`.

    The one lock of the package: the partition's ``LOCK``, a broadcast copy's readers' lock and the
    background upload's lock are all taken here, so each is checked, once held, to still be the file at
    its path (see the module docstring). ``record_use`` (the default) sets the file's modification time
    when the lock is taken and released; the sweep takes its locks without it, so looking at a partition
    does not count as using it.
    """

    def __init__(self, path: str | os.PathLike[str], *, record_use: bool = True) -> None:
        self.path = Path(path)
        self.record_use = record_use
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object currently holds the lock."""
        return self._fd is not None

    def acquire(
        self,
        timeout: float | None = DEFAULT_LOCK_TIMEOUT_SECONDS,
        poll: float = 0.02,
        *,
        shared: bool = False,
    ) -> PartitionLock:
        """Take the lock (``shared``: with other shared holders), waiting up to ``timeout`` seconds (None:
        as long as it takes); raises :class:`PartitionLockedError` when the time is up."""
        if self._fd is not None:
            raise RuntimeError(f"partition lock {str(self.path)!r} is already held by this object")
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = _open_lock_file(self.path)
        try:
            while True:
                if not _flock(fd, mode, deadline, poll):
                    raise PartitionLockedError(self.path, 0.0 if timeout is None else timeout)
                if is_current(fd, self.path):
                    break
                # The directory was removed while we waited: lock the file that has the name now.
                os.close(fd)
                fd = -1
                fd = _open_lock_file(self.path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        self._fd = fd
        if self.record_use:
            record_use(fd)
        return self

    def change(self, *, shared: bool) -> bool:
        """Turn the held lock shared or exclusive, waiting as long as it takes. False when the file was
        removed meanwhile (a change is a release and a take, so the sweep can come between them): the
        lock is then released, and the caller starts again from :meth:`acquire`."""
        fd = self._fd
        if fd is None:
            raise RuntimeError(f"partition lock {str(self.path)!r} is not held by this object")
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        if is_current(fd, self.path):
            return True
        self.release()
        return False

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            if self.record_use:
                record_use(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> PartitionLock:
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock(fd: int, mode: int, deadline: float | None, poll: float) -> bool:
    """``flock`` ``fd`` with ``mode``, blocking until ``deadline`` (None: without a limit); False when the
    deadline passed first."""
    if deadline is None:
        fcntl.flock(fd, mode)
        return True
    delay = poll
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)
