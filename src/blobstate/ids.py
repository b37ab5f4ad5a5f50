"""Checkpoint ids: ``(version, uid)`` pairs named ``<v>_<uid>``, and the validation of ids from outside."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from blobstate.errors import ConfigurationError

_UID_RE = re.compile(r"[0-9a-f]{8,64}")
_VERSION_RE = re.compile(r"0|[1-9][0-9]{0,18}")
_OPERATOR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class InvalidIdError(ConfigurationError, ValueError):
    """An id (uid, version, operator, partition or checkpoint name) that is malformed or unsafe."""


def new_uid() -> str:
    """A fresh random uid for one attempt's checkpoint (32 lowercase hex digits)."""
    return uuid.uuid4().hex


def validate_uid(uid: object, what: str = "uid") -> str:
    """Return ``uid`` if it is 8-64 lowercase hex digits, else raise naming ``what``."""
    if not isinstance(uid, str) or not _UID_RE.fullmatch(uid):
        raise InvalidIdError(f"invalid {what} {uid!r}: expected 8-64 lowercase hex digits")
    return uid


def validate_version(version: object, what: str = "version") -> int:
    """Return ``version`` if it is a non-negative int, else raise naming ``what``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidIdError(f"invalid {what} {version!r}: expected a non-negative integer")
    return version


def validate_operator(operator: object) -> str:
    """Return ``operator`` if it is a safe operator id (letters, digits, ``_``, ``-``; 1-64 chars)."""
    if not isinstance(operator, str) or not _OPERATOR_RE.fullmatch(operator):
        raise InvalidIdError(f"invalid operator id {operator!r}: expected [A-Za-z0-9][A-Za-z0-9_-]{{0,63}}")
    return operator


def validate_partition(partition: object, num_partitions: int | None = None) -> int:
    """Return ``partition`` if it is a non-negative int (below ``num_partitions`` when given)."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidIdError(f"invalid partition {partition!r}: expected a non-negative integer")
    if num_partitions is not None and partition >= num_partitions:
        raise InvalidIdError(f"invalid partition {partition}: the query has {num_partitions} partitions")
    return partition


@dataclass(frozen=True, order=True)
class CheckpointId:
    """One attempt's checkpoint of one partition at one version: unique and never overwritten."""

    version: int
    uid: str

    def __post_init__(self) -> None:
        validate_version(self.version)
        validate_uid(self.uid)

    @property
    def name(self) -> str:
        """``<v>_<uid>``, the stem of this checkpoint's delta and snapshot objects."""
        return f"{self.version}_{self.uid}"

    @classmethod
    def parse(cls, name: str) -> CheckpointId:
        """Parse ``<v>_<uid>``; raises :class:`InvalidIdError` naming the bad part."""
        if not isinstance(name, str) or name.count("_") != 1:
            raise InvalidIdError(f"invalid checkpoint id {name!r}: expected <version>_<uid>")
        v, uid = name.split("_")
        if not _VERSION_RE.fullmatch(v):
            raise InvalidIdError(f"invalid checkpoint id {name!r}: bad version {v!r}")
        return cls(int(v), validate_uid(uid, f"uid in checkpoint id {name!r}"))

    def __str__(self) -> str:
        return self.name
