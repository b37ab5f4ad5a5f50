"""A process-level lock per partition, so two Python workers never open the same local partition at once.

The lock is ``fcntl.flock`` on ``<local_dir>/<query-id>/<op>/<p>/LOCK``. ``flock`` locks belong to an
open file description, so a second open in the same process conflicts too, and the kernel releases the
lock when the holder dies: a crashed worker never leaves a partition locked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from blobstate.errors import BlobstateError

DEFAULT_LOCK_TIMEOUT_SECONDS = 60.0


class PartitionLockedError(BlobstateError, TimeoutError):
    """Another process (or another open in this process) holds the partition's lock."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(
            f"partition lock {str(path)!r} is held by another worker: gave up after {timeout:g}s "
            "(is another task or standby sync running this partition on this executor?)"
        )
        self.path = path
        self.timeout = timeout


class PartitionLock:
    """An exclusive ``flock`` on one file, taken with a timeout and released by :meth:`release`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object currently holds the lock."""
        return self._fd is not None

    def acquire(self, timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS, poll: float = 0.02) -> PartitionLock:
        """Take the lock, waiting up to ``timeout`` seconds; raises :class:`PartitionLockedError`."""
        if self._fd is not None:
            raise RuntimeError(f"partition lock {str(self.path)!r} is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout
        delay = poll
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as error:
                    if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                    if time.monotonic() >= deadline:
                        raise PartitionLockedError(self.path, timeout) from None
                    time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, 0.5)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
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
