"""The local side of a partition: clean/dirty markers, lineage info files, hard-link materialization.

A directory holding a RocksDB store (the working store, a local checkpoint, a standby replica) carries
two small files besides RocksDB's own:

* ``CHECKPOINT-ID`` (working store and standby only): ``<v>_<uid>``, present only while the store is
  clean, i.e. holds exactly the state of that checkpoint. Removed before the store is opened for writing.
* ``BLOBSTATE-LINEAGE``: JSON with the checkpoint id and the lineage record a delta built on this
  checkpoint must carry, so the next commit can write its delta without reading anything remotely.

Both are written atomically (temporary file, fsync, rename, fsync of the directory).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blobstate.durable import fsync_dir
from blobstate.ids import CheckpointId, InvalidIdError, validate_uid
from blobstate.layout import CHECKPOINT_ID_FILE

LINEAGE_INFO_FILE = "BLOBSTATE-LINEAGE"
INFO_FORMAT = 1

_LINKED_SUFFIXES = (".sst", ".blob")
"""RocksDB files that are immutable once written: safe to share between directories by hard link."""

_NEVER_COPIED = {CHECKPOINT_ID_FILE, "LOCK", "LOG"}


@dataclass(frozen=True)
class LineageInfo:
    """What a commit on top of a checkpoint needs to know about it, kept next to the store's files.

    ``next_lineage`` is the lineage record of a delta built on ``checkpoint_id``: its uid first, then the
    uids of older versions back to the newest presumed snapshot (empty for version 0).
    ``deltas_since_snapshot`` and ``delta_bytes_since_snapshot`` count the deltas (and their bytes) since
    that snapshot, for the snapshot policy (approximate when the checkpoint was rebuilt from elsewhere).
    """

    checkpoint_id: CheckpointId | None
    next_lineage: tuple[str, ...] = ()
    deltas_since_snapshot: int = 0
    delta_bytes_since_snapshot: int = 0

    @property
    def version(self) -> int:
        """The version of the checkpoint (0 for the empty store)."""
        return 0 if self.checkpoint_id is None else self.checkpoint_id.version

    def validate(self) -> LineageInfo:
        """Check internal consistency; raises ``InvalidIdError`` naming the problem."""
        cid = self.checkpoint_id
        if cid is None:
            if self.next_lineage:
                raise InvalidIdError("lineage info of version 0 must have an empty lineage")
            return self
        for i, uid in enumerate(self.next_lineage):
            validate_uid(uid, f"lineage uid #{i}")
        if not self.next_lineage or self.next_lineage[0] != cid.uid:
            raise InvalidIdError(f"lineage info of {cid} does not start with its own uid")
        if len(self.next_lineage) > cid.version:
            raise InvalidIdError(
                f"lineage info of {cid} has {len(self.next_lineage)} uids, more than its version"
            )
        return self

    def to_json(self) -> bytes:
        """Serialize to the ``BLOBSTATE-LINEAGE`` file format."""
        return json.dumps(
            {
                "format": INFO_FORMAT,
                "checkpoint_id": None if self.checkpoint_id is None else self.checkpoint_id.name,
                "next_lineage": list(self.next_lineage),
                "deltas_since_snapshot": self.deltas_since_snapshot,
                "delta_bytes_since_snapshot": self.delta_bytes_since_snapshot,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LineageInfo:
        """Parse and validate; raises ``ValueError`` (or ``InvalidIdError``) when malformed."""
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("format") != INFO_FORMAT:
            raise ValueError(
                f"unknown lineage info format {raw.get('format') if isinstance(raw, dict) else raw!r}"
            )
        name = raw.get("checkpoint_id")
        lineage = raw.get("next_lineage")
        count = raw.get("deltas_since_snapshot", 0)
        nbytes = raw.get("delta_bytes_since_snapshot", 0)
        if not isinstance(lineage, list) or not isinstance(nbytes, int) or not isinstance(count, int):
            raise ValueError("malformed lineage info")
        cid = None if name is None else CheckpointId.parse(name)
        return cls(cid, tuple(lineage), count, nbytes).validate()


# ---------------------------------------------------------------------------------------------- markers
def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_checkpoint_id(directory: Path) -> CheckpointId | None:
    """The ``CHECKPOINT-ID`` of a store directory, or None when absent or unreadable (= dirty)."""
    try:
        text = (directory / CHECKPOINT_ID_FILE).read_text(encoding="ascii").strip()
        return CheckpointId.parse(text)
    except (OSError, UnicodeDecodeError, InvalidIdError):
        return None


def mark_dirty(directory: Path) -> None:
    """Remove ``CHECKPOINT-ID`` durably: from now on the directory is not trusted to match any checkpoint."""
    try:
        (directory / CHECKPOINT_ID_FILE).unlink()
    except FileNotFoundError:
        return
    fsync_dir(directory)


def mark_clean(directory: Path, info: LineageInfo) -> None:
    """Write the lineage info, then ``CHECKPOINT-ID`` (last: it is what makes the directory trusted)."""
    if info.checkpoint_id is None:
        raise ValueError("the empty version 0 is never marked clean")
    write_atomic(directory / LINEAGE_INFO_FILE, info.to_json())
    write_atomic(directory / CHECKPOINT_ID_FILE, info.checkpoint_id.name.encode("ascii"))


def write_info(directory: Path, info: LineageInfo) -> None:
    """Write the ``BLOBSTATE-LINEAGE`` file of a directory."""
    write_atomic(directory / LINEAGE_INFO_FILE, info.to_json())


def read_info(directory: Path, expected: CheckpointId) -> LineageInfo | None:
    """The lineage info of a directory if present, well-formed and about ``expected``; else None."""
    try:
        info = LineageInfo.from_json((directory / LINEAGE_INFO_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return info if info.checkpoint_id == expected else None


# ---------------------------------------------------------------------------------------------- files
def _walk_files(root: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            yield Path(dirpath) / name


def remove_tree(path: Path) -> None:
    """Remove a directory tree if it exists."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


TRASH_PREFIX = ".trash-"


def discard_tree(path: Path) -> None:
    """Remove a directory tree without waiting for it: rename it aside, delete it on a daemon thread.

    Deleting a large store's files (the last links of gigabytes of SSTs) takes about a second; renaming
    takes microseconds. A process that dies first leaves a ``.trash-*`` directory that
    :func:`sweep_trash` removes later.
    """
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    trash = path.with_name(f"{TRASH_PREFIX}{uuid.uuid4().hex}")
    os.replace(path, trash)
    threading.Thread(target=shutil.rmtree, args=(trash, True), name="blobstate-discard", daemon=True).start()


def sweep_trash(directory: Path) -> None:
    """Delete (in the background) ``.trash-*`` directories a dead process left in ``directory``."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(TRASH_PREFIX)]
    except FileNotFoundError:
        return
    for entry in entries:
        threading.Thread(
            target=shutil.rmtree, args=(entry.path, True), name="blobstate-discard", daemon=True
        ).start()


def materialize(source: Path, target: Path) -> int:
    """Make ``target`` a private copy of the store in ``source``; returns the bytes copied (not linked).

    Immutable RocksDB files (``*.sst``, ``*.blob``) are hard-linked; the few small mutable ones
    (MANIFEST, CURRENT, OPTIONS, WAL) are copied so that opening ``target`` can never modify ``source``.
    Markers and RocksDB's LOCK/LOG are not carried over. ``target`` is replaced (the old one is
    discarded in the background).
    """
    discard_tree(target)
    tmp = target.with_name(f".{target.name}.materializing")
    remove_tree(tmp)
    tmp.mkdir(parents=True)
    copied = 0
    for path in _walk_files(source):
        rel = path.relative_to(source)
        if rel.name in _NEVER_COPIED or rel.name == LINEAGE_INFO_FILE or rel.name.startswith("LOG.old"):
            continue
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.name.endswith(_LINKED_SUFFIXES):
            os.link(path, dest)
        else:
            shutil.copyfile(path, dest)
            copied += dest.stat().st_size
    os.replace(tmp, target)
    return copied


def list_checkpoints(checkpoints_dir: Path) -> list[CheckpointId]:
    """The complete local checkpoints (directories named ``<v>_<uid>``), oldest version first."""
    found: list[tuple[int, float, CheckpointId]] = []
    try:
        entries = list(os.scandir(checkpoints_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            cid = CheckpointId.parse(entry.name)
        except InvalidIdError:
            continue
        found.append((cid.version, entry.stat().st_mtime, cid))
    found.sort()
    return [cid for _, _, cid in found]


def prune_checkpoints(
    checkpoints_dir: Path, keep: int, protect: CheckpointId | None = None
) -> list[CheckpointId]:
    """Discard all but the newest ``keep`` local checkpoints (never ``protect``) and stale temporaries."""
    sweep_trash(checkpoints_dir)  # left by a process that died; before adding our own
    removed = []
    cids = list_checkpoints(checkpoints_dir)
    for cid in cids[: max(0, len(cids) - keep)]:
        if cid != protect:
            discard_tree(checkpoints_dir / cid.name)
            removed.append(cid)
    if checkpoints_dir.exists():
        for entry in os.scandir(checkpoints_dir):
            if entry.name.startswith(".") and entry.name.endswith((".tmp", ".materializing")):
                remove_tree(Path(entry.path))
    return removed
