"""Background snapshot uploads: a thread of the worker process, and their hand-off state on the host.

With ``snapshot_upload="background"`` a due snapshot's local hard-link checkpoint is still taken inside
the commit, but its files are uploaded by a daemon thread while the next batches run. The next task of
the partition may run in another Python worker process of the same host, so everything a later task
needs to know is kept under the partition's local directory, never in process memory::

    <partition root>/snapshots/
        <v>_<uid>.json      the upload of checkpoint (v, uid): uploading | done | failed (with the
                            process id, start time, incremental base, and when done the index reference)
        <v>_<uid>.named     the attempts ([version, uid], one per line) that named it in their commit
        <v>_<uid>.files/    a hard-link copy of the local checkpoint being uploaded (removed when done)
        UPLOAD.lock         flock held by the uploading thread: one upload per partition per host at a time

A status still ``uploading`` whose process is gone was killed mid-upload: it was never named, its
objects stay pending and expire. What the commit does with these files is in
:mod:`blobstate.state.partition` (``PartitionState._late_snapshot``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from blobstate import defaults
from blobstate.ids import CheckpointId, InvalidIdError
from blobstate.lineage.refs import ObjectRef
from blobstate.state.localdirs import materialize, remove_tree, write_atomic
from blobstate.state.locking import PartitionLock

log = logging.getLogger(__name__)

SNAPSHOT_UPLOAD_MODES = defaults.SNAPSHOT_UPLOADS
"""``inline``: a due snapshot is uploaded inside the commit; ``background``: by a thread, named later."""

UPLOADING, DONE, FAILED = "uploading", "done", "failed"
UPLOAD_LOCK_WAIT_SECONDS = 24 * 3600.0
"""How long a background upload waits for an earlier one of the same partition on this host."""


def validate_mode(mode: str) -> str:
    """Return ``mode`` if it is a snapshot upload mode, else raise ``ValueError`` naming the choices."""
    if mode not in SNAPSHOT_UPLOAD_MODES:
        raise ValueError(f"snapshot_upload must be one of {', '.join(SNAPSHOT_UPLOAD_MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class UploadStatus:
    """The hand-off record of one background upload (``<v>_<uid>.json``)."""

    checkpoint_id: CheckpointId
    state: str
    pid: int
    started_ms: int
    base: str | None = None
    """The snapshot index it is incremental against (None: a full snapshot)."""
    index: ObjectRef | None = None
    bytes_uploaded: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> bytes:
        """The file's bytes."""
        return json.dumps(
            {
                "checkpoint_id": self.checkpoint_id.name,
                "state": self.state,
                "pid": self.pid,
                "started_ms": self.started_ms,
                "base": self.base,
                "index": None if self.index is None else self.index.to_json(),
                "bytes_uploaded": self.bytes_uploaded,
                "seconds": self.seconds,
                "error": self.error,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> UploadStatus:
        """Parse a status file; raises ValueError when it is not one."""
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("state") not in (UPLOADING, DONE, FAILED):
            raise ValueError(f"not an upload status: {raw!r}")
        try:
            cid = CheckpointId.parse(raw["checkpoint_id"])
        except (InvalidIdError, KeyError, TypeError) as error:
            raise ValueError(str(error)) from None
        index = None if raw.get("index") is None else ObjectRef.from_json(raw["index"])
        if raw["state"] == DONE and index is None:
            raise ValueError("a finished upload without its index reference")
        return cls(
            cid,
            raw["state"],
            int(raw["pid"]),
            int(raw["started_ms"]),
            raw.get("base"),
            index,
            int(raw.get("bytes_uploaded") or 0),
            float(raw.get("seconds") or 0.0),
            raw.get("error"),
        )

    def process_alive(self) -> bool:
        """Whether the process that started the upload still runs (it runs on this host)."""
        if self.pid == os.getpid():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class UploadDir:
    """The ``snapshots/`` directory of one partition on this host."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def status_file(self, cid: CheckpointId) -> Path:
        """``<v>_<uid>.json``."""
        return self.path / f"{cid.name}.json"

    def files(self, cid: CheckpointId) -> Path:
        """``<v>_<uid>.files/``: the checkpoint's files while they are uploaded."""
        return self.path / f"{cid.name}.files"

    def write(self, status: UploadStatus) -> None:
        """Write (atomically) the status of an upload."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.status_file(status.checkpoint_id), status.to_json())

    def read(self, cid: CheckpointId) -> UploadStatus | None:
        """The status of ``cid``'s upload, None when there is none (or it is unreadable)."""
        try:
            status = UploadStatus.from_json(self.status_file(cid).read_bytes())
        except (OSError, ValueError) as error:
            if not isinstance(error, FileNotFoundError):
                log.warning("ignoring unreadable upload status %s: %s", self.status_file(cid), error)
            return None
        return status if status.checkpoint_id == cid else None

    def statuses(self) -> list[UploadStatus]:
        """Every readable status, oldest version first."""
        out = []
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                cid = CheckpointId.parse(name.removesuffix(".json"))
            except InvalidIdError:
                continue
            status = self.read(cid)
            if status is not None:
                out.append(status)
        return sorted(out, key=lambda s: s.checkpoint_id.version)

    def named_by(self, cid: CheckpointId) -> list[CheckpointId]:
        """The attempts that named ``cid``'s snapshot in their commit (committed or not)."""
        try:
            lines = (self.path / f"{cid.name}.named").read_text().split()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(CheckpointId.parse(line))
            except InvalidIdError:
                continue
        return out

    def add_named_by(self, cid: CheckpointId, attempt: CheckpointId) -> None:
        """Record that ``attempt`` names ``cid``'s snapshot (the task holds the partition lock)."""
        names = [c.name for c in self.named_by(cid)] + [attempt.name]
        write_atomic(self.path / f"{cid.name}.named", ("\n".join(names) + "\n").encode())

    def forget(self, cid: CheckpointId) -> None:
        """Remove everything about ``cid``'s upload (its objects in the store stay, pending, to expire)."""
        for suffix in (".json", ".named"):
            (self.path / f"{cid.name}{suffix}").unlink(missing_ok=True)
        remove_tree(self.files(cid))


@dataclass(frozen=True)
class UploadJob:
    """One background upload: the checkpoint, its local files, and how to back it up.

    ``backup(files_dir) -> (index reference, bytes uploaded, base used)`` runs on the upload thread; the
    base it used (None: it fell back to a full snapshot) replaces ``base`` in the finished status.
    """

    checkpoint_id: CheckpointId
    checkpoint_dir: Path
    base: str | None
    backup: Callable[[Path], tuple[ObjectRef, int, str | None]]


_VIEWS: dict[int, tuple[Any, Any]] = {}
_VIEWS_LOCK = threading.Lock()


def background_store(store: Any) -> Any:
    """This process's view of ``store`` with its own I/O pool (:meth:`BlobStore.with_own_pool`), made
    once per store: background uploads never queue ahead of a batch's I/O."""
    with _VIEWS_LOCK:
        entry = _VIEWS.get(id(store))
        if entry is None or entry[0] is not store:
            entry = _VIEWS[id(store)] = (store, store.with_own_pool())
        return entry[1]


_THREADS: list[threading.Thread] = []
_THREADS_LOCK = threading.Lock()


def start_upload(uploads: UploadDir, job: UploadJob) -> UploadStatus:
    """Record the upload as ``uploading``, link the checkpoint's files aside and start the thread."""
    cid = job.checkpoint_id
    status = UploadStatus(cid, UPLOADING, os.getpid(), time.time_ns() // 1_000_000, job.base)
    uploads.write(status)
    materialize(job.checkpoint_dir, uploads.files(cid))
    thread = threading.Thread(
        target=_run, args=(uploads, job, status), name=f"blobstate-snapshot-{cid.name}", daemon=True
    )
    with _THREADS_LOCK:
        _THREADS[:] = [t for t in _THREADS if t.is_alive()]
        _THREADS.append(thread)
    thread.start()
    return status


def _run(uploads: UploadDir, job: UploadJob, status: UploadStatus) -> None:
    started = time.monotonic()
    lock = PartitionLock(uploads.path / "UPLOAD.lock")
    try:
        lock.acquire(timeout=UPLOAD_LOCK_WAIT_SECONDS, poll=0.05)
        index, nbytes, base = job.backup(uploads.files(job.checkpoint_id))
        seconds = time.monotonic() - started
        done = replace(status, state=DONE, base=base, index=index, bytes_uploaded=nbytes, seconds=seconds)
        uploads.write(done)
    except BaseException as error:  # reported in the next commit's metrics, never fatal
        log.warning("background snapshot upload of %s failed: %s", job.checkpoint_id, error)
        uploads.write(
            replace(
                status,
                state=FAILED,
                error=f"{type(error).__name__}: {error}",
                seconds=time.monotonic() - started,
            )
        )
    finally:
        lock.release()
        remove_tree(uploads.files(job.checkpoint_id))


def wait_for_uploads(timeout: float | None = None) -> bool:
    """Wait for this process's background uploads to finish; whether they all did within ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _THREADS_LOCK:
        threads = list(_THREADS)
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def uploads_in_flight() -> int:
    """Background uploads of this process still running."""
    with _THREADS_LOCK:
        return sum(1 for t in _THREADS if t.is_alive())


__all__ = [
    "SNAPSHOT_UPLOAD_MODES",
    "UploadDir",
    "UploadJob",
    "UploadStatus",
    "background_store",
    "start_upload",
    "uploads_in_flight",
    "validate_mode",
    "wait_for_uploads",
]
