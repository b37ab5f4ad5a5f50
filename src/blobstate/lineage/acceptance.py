"""An operator's acceptance of lost newest commits: the create-only ``accepted-loss/<v>_<uid>.json``.

Written by ``blobstate accept-loss`` (:func:`blobstate.state.lost.accept_loss`) when the commits above
version ``v``, the newest readable one, are lost for good. It names the lost attempts (no evidence of a
lost commit any more) and changes what version ``v``'s commit retains: the lost commit's post-commit
cleanup was free to delete every version below its own retained window and to prune the commits below its
horizon, so from the acceptance on only version ``v`` is retained (``retained_from == v``) and the
commits below the recorded ``horizon`` count as pruned (:meth:`Acceptance.apply`). The commit log applies
it whenever it reads the newest commit its listing found (:class:`~blobstate.lineage.commitlog.CommitLog`),
so retention, ``verify``, ``gc``, start-up and the next commit's own ``retained_from`` all honour it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from blobstate.errors import CorruptionError
from blobstate.ids import InvalidIdError, validate_uid
from blobstate.jsonfields import JsonFields, check_record_size, load_strict_json
from blobstate.layout import ACCEPTED_LOSS_PREFIX, accepted_loss_name

if TYPE_CHECKING:
    from blobstate.blobstore import BlobStore
    from blobstate.lineage.commitlog import Commit

ACCEPTANCE_FORMAT_VERSION = 2
"""The ``accepted-loss/<v>_<uid>.json`` format version this build writes (2: with ``commit`` and
``horizon``: the acceptance moves that commit's retained window up to its version)."""

ACCEPTANCE_FORMATS_READ = (1, 2)
"""The ``accepted-loss/<v>_<uid>.json`` format versions this build reads."""

MAX_ACCEPTANCE_BYTES = 16 * 1024 * 1024
"""The largest ``accepted-loss/<v>_<uid>.json`` a reader parses (one names the lost attempts of a few
versions of up to 10,000 partitions: a few MB at most)."""

ACCEPTANCE_NAME_RE = re.compile(re.escape(ACCEPTED_LOSS_PREFIX) + r"([0-9]+)_([0-9a-f]+)\.json")


class AcceptanceFormatError(CorruptionError, ValueError):
    """An ``accepted-loss/<v>_<uid>.json`` record that is malformed: names the object, field and problem."""

    def __init__(self, name: str, field: str, problem: str) -> None:
        where = f" field {field}" if field else ""
        super().__init__(f"invalid {name}:{where}: {problem}")
        self.name = name
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Acceptance:
    """An operator's acceptance of lost commits: ``accepted-loss/<version>_<uid>.json``.

    ``version`` is the newest readable version the checkpoint continues from; ``lost`` maps each lost
    version to the uids of the attempts whose permanent objects were the evidence. ``commit`` is the
    :meth:`~blobstate.lineage.commitlog.Commit.attempts_digest` of the readable commit (None: no commit
    was left), and ``horizon`` the oldest version from which every commit up to it exists (the lost
    commit's cleanup may have pruned the ones below). Format 1 records have neither and change no
    commit."""

    version: int
    uid: str
    lost: dict[int, tuple[str, ...]]
    reason: str | None = None
    created_time_ms: int = 0
    format_version: int = ACCEPTANCE_FORMAT_VERSION
    commit: str | None = None
    horizon: int | None = None

    @property
    def name(self) -> str:
        """``accepted-loss/<version>_<uid>.json``."""
        return accepted_loss_name(self.version, self.uid)

    def covers(self, version: int, uid: str) -> bool:
        """Whether this acceptance names the attempt ``<version>_<uid>``."""
        return uid in self.lost.get(version, ())

    def apply(self, commit: Commit) -> Commit:
        """The commit this acceptance continues from as it stands after the loss: retaining only its own
        version, with the commits below ``horizon`` counted as pruned. Other commits (another version, or
        a later commit of this version after this one was lost too) are returned as they are."""
        if (
            commit.version != self.version
            or self.horizon is None
            or self.commit is None
            or commit.attempts_digest() != self.commit
        ):
            return commit
        horizon = max(commit.horizon, min(self.horizon, self.version))
        if (commit.retained_from, commit.horizon) == (self.version, horizon):
            return commit
        return dataclasses.replace(commit, retained_from=self.version, horizon=horizon)

    def to_json(self) -> dict[str, object]:
        """The JSON object stored (before its digest)."""
        obj: dict[str, object] = {
            "format_version": self.format_version,
            "version": self.version,
            "lost": {str(v): list(uids) for v, uids in sorted(self.lost.items())},
            "reason": self.reason,
            "created_time_ms": self.created_time_ms,
        }
        if self.format_version >= 2:
            obj["commit"] = self.commit
            obj["horizon"] = self.horizon
        return obj

    def dump(self) -> bytes:
        """The bytes stored: :meth:`to_json` with its digest."""
        from blobstate.lineage.commitlog import DIGEST_FIELD, content_digest

        obj = self.to_json()
        return json.dumps({**obj, DIGEST_FIELD: content_digest(obj)}, indent=1).encode("utf-8")


def parse_acceptance(data: bytes, name: str) -> Acceptance:
    """Read and validate ``accepted-loss/<v>_<uid>.json``; raises :class:`AcceptanceFormatError`."""
    from blobstate.lineage.commitlog import DIGEST_FIELD, content_digest

    def fail(field_: str, problem: str) -> NoReturn:
        raise AcceptanceFormatError(name, field_, problem)

    match = ACCEPTANCE_NAME_RE.fullmatch(name)
    if match is None:
        fail("", f"not a name of the form {ACCEPTED_LOSS_PREFIX}<version>_<uid>.json")
    check_record_size(len(data), MAX_ACCEPTANCE_BYTES, fail, read=True)
    f = JsonFields(load_strict_json(data, fail), fail)
    format_version = f.integer("format_version", minimum=1)
    if format_version not in ACCEPTANCE_FORMATS_READ:
        fail(
            "format_version",
            f"format {format_version} was written by a newer blobstate; this build reads "
            f"{', '.join(map(str, ACCEPTANCE_FORMATS_READ))}",
        )
    version = f.integer("version", minimum=0)
    if version != int(match.group(1)):
        fail("version", f"{version} is not the version {match.group(1)} of the object's name")
    raw = f.mapping("lost")
    assert raw is not None
    if not raw:
        fail("lost", "names no lost version")
    lost: dict[int, tuple[str, ...]] = {}
    for key, uids in raw.items():
        if not key.isdigit() or int(key) <= version or str(int(key)) != key:
            fail(f"lost[{key!r}]", f"expected a version above {version}")
        if not isinstance(uids, list) or not uids:
            fail(f"lost[{key!r}]", f"expected a non-empty list of uids, found {uids!r}")
        for uid in uids:
            try:
                validate_uid(uid)
            except InvalidIdError as error:
                fail(f"lost[{key!r}]", str(error))
        lost[int(key)] = tuple(uids)
    reason = f.get("reason", lambda v: isinstance(v, str), "a string", optional=True)
    created = f.integer("created_time_ms", minimum=0)
    horizon = commit = None
    if format_version >= 2:
        commit = f.get("commit", _is_digest, "a SHA-256 hex string", optional=True)
        if (commit is None) != (version == 0):
            fail("commit", "expected a SHA-256 hex string, or null with version 0 (no commit was left)")
        horizon = f.integer("horizon", minimum=1)
        if horizon > max(version, 1):
            fail("horizon", f"{horizon} is above the version {version}")
    stored = f.get(DIGEST_FIELD, lambda v: isinstance(v, str), "a SHA-256 hex string")
    if stored != content_digest(f.obj):
        fail(DIGEST_FIELD, "content does not match its checksum: the object was changed after it was written")
    return Acceptance(version, match.group(2), lost, reason, created, format_version, commit, horizon)


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch("[0-9a-f]{64}", value) is not None


def read_acceptances(store: BlobStore) -> list[Acceptance]:
    """Every acceptance recorded in ``accepted-loss/`` (one listing, then each read and checked)."""
    names = [n for n in store.list(ACCEPTED_LOSS_PREFIX) if ACCEPTANCE_NAME_RE.fullmatch(n)]
    return [parse_acceptance(store.get(n), n) for n in names]


def apply_acceptances(commit: Commit, acceptances: list[Acceptance]) -> Commit:
    """``commit`` after every acceptance of its version (:meth:`Acceptance.apply`)."""
    for acceptance in acceptances:
        commit = acceptance.apply(commit)
    return commit


__all__ = [
    "ACCEPTANCE_FORMATS_READ",
    "ACCEPTANCE_FORMAT_VERSION",
    "MAX_ACCEPTANCE_BYTES",
    "Acceptance",
    "AcceptanceFormatError",
    "apply_acceptances",
    "parse_acceptance",
    "read_acceptances",
]
