"""References that prove what they reference: the size and SHA-256 of a stored object.

A commit records one :class:`ObjectRef` for every delta and snapshot index it makes part of a version
(:class:`PartitionObjects`), and a snapshot index records a size and CRC-32 for every blob chunk. So any
object a committed version reaches can be checked against the commit that reaches it: a changed,
truncated, swapped or emptied object is detected on load and by ``blobstate verify``, even when it is
still well-formed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes | memoryview) -> str:
    """The lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ObjectRef:
    """The size in bytes and the SHA-256 (lowercase hex) of one stored object."""

    size: int
    sha256: str

    @classmethod
    def of(cls, data: bytes | memoryview) -> ObjectRef:
        """The reference of ``data``."""
        return cls(len(data), sha256_hex(data))

    def problem(self, data: bytes | memoryview) -> str | None:
        """Why ``data`` is not the referenced object (None when it is): a size or a checksum mismatch.

        ``data`` may be a read cut one byte past the recorded size (``BlobStore.get(max_bytes=)``): a
        longer object is then told as "more than" the size, which is all that was read of it."""
        if len(data) > self.size:
            return f"more than {self.size} bytes where the commit recorded {self.size}"
        if len(data) != self.size:
            return f"{len(data)} bytes where the commit recorded {self.size}"
        digest = sha256_hex(data)
        if digest != self.sha256:
            return f"SHA-256 {digest[:16]}... where the commit recorded {self.sha256[:16]}..."
        return None

    def to_json(self) -> dict[str, Any]:
        """``{"size": ..., "sha256": ...}``."""
        return {"size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, raw: object) -> ObjectRef:
        """Parse ``{"size": int >= 0, "sha256": 64 lowercase hex digits}``; raises ValueError."""
        if not isinstance(raw, dict) or set(raw) != {"size", "sha256"}:
            raise ValueError(f"expected an object with exactly size and sha256, found {raw!r}")
        size, digest = raw["size"], raw["sha256"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"size must be an integer >= 0, found {size!r}")
        if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, found {digest!r}")
        return cls(size, digest)


@dataclass(frozen=True)
class LateSnapshot:
    """A snapshot of an earlier version ``version`` (committed uid ``uid``), uploaded in the background
    and complete: a later commit names it here, with its index's reference, so that loads may use it."""

    version: int
    uid: str
    index: ObjectRef

    @property
    def checkpoint_name(self) -> str:
        """``<version>_<uid>``: the checkpoint the snapshot is of."""
        return f"{self.version}_{self.uid}"

    def to_json(self) -> dict[str, Any]:
        """``{"version": v, "uid": uid, "index": ref}``."""
        return {"version": self.version, "uid": self.uid, "index": self.index.to_json()}

    @classmethod
    def from_json(cls, raw: object) -> LateSnapshot:
        """Parse the JSON written by :meth:`to_json`; raises ValueError naming what is wrong."""
        from blobstate.ids import InvalidIdError, validate_uid

        if not isinstance(raw, dict) or set(raw) != {"version", "uid", "index"}:
            raise ValueError(f"expected an object with exactly version, uid and index, found {raw!r}")
        version, uid = raw["version"], raw["uid"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"version must be an integer >= 1, found {version!r}")
        try:
            validate_uid(uid)
        except (InvalidIdError, TypeError) as error:
            raise ValueError(f"uid: {error}") from None
        try:
            index = ObjectRef.from_json(raw["index"])
        except ValueError as error:
            raise ValueError(f"index: {error}") from None
        return cls(version, uid, index)


@dataclass(frozen=True)
class PartitionObjects:
    """What one commit makes part of a partition's version: its delta and, when one was taken, its
    snapshot index (None: no snapshot of this version exists, so loading never looks for one).

    ``late_snapshot`` is a snapshot of an earlier version of the partition whose background upload
    finished after that version's commit: this commit names it (the key is absent when None)."""

    delta: ObjectRef
    snapshot: ObjectRef | None = None
    late_snapshot: LateSnapshot | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"delta": ref, "snapshot": ref | null}`` (and ``"late_snapshot"`` when there is one)."""
        out: dict[str, Any] = {
            "delta": self.delta.to_json(),
            "snapshot": None if self.snapshot is None else self.snapshot.to_json(),
        }
        if self.late_snapshot is not None:
            out["late_snapshot"] = self.late_snapshot.to_json()
        return out

    @classmethod
    def from_json(cls, raw: object) -> PartitionObjects:
        """Parse the JSON written by :meth:`to_json`; raises ValueError naming what is wrong."""
        allowed = {"delta", "snapshot", "late_snapshot"}
        if not isinstance(raw, dict) or "delta" not in raw or not set(raw) <= allowed:
            raise ValueError(f"expected an object with delta and snapshot, found {raw!r}")
        snapshot = raw.get("snapshot")
        try:
            delta = ObjectRef.from_json(raw["delta"])
        except ValueError as error:
            raise ValueError(f"delta: {error}") from None
        try:
            snap = None if snapshot is None else ObjectRef.from_json(snapshot)
        except ValueError as error:
            raise ValueError(f"snapshot: {error}") from None
        late = None
        if raw.get("late_snapshot") is not None:
            try:
                late = LateSnapshot.from_json(raw["late_snapshot"])
            except ValueError as error:
                raise ValueError(f"late_snapshot: {error}") from None
        return cls(delta, snap, late)


__all__ = ["LateSnapshot", "ObjectRef", "PartitionObjects", "sha256_hex"]
