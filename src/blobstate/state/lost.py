"""Lost commits: a checkpoint whose newest commits are known lost is read-only for every writer.

**The evidence** (the one ``blobstate verify`` reports as "newer commits were lost"): a state object
(``state/<op>/<p>/<v>_<uid>.delta`` or ``.snapshot``) of a version ``v`` above the newest commit that is
*permanent*. Only a post-commit cleanup removes an object's TTL, and only for what a commit references, so
such an object was committed by a ``commits/<v>.json`` that is gone. Attempts that never committed, and a
running query's batch in flight, leave only pending objects: they are no evidence. Finding it costs one
listing of ``state/``, one TTL look-up per attempt (``<v>_<uid>``) above the newest commit, and, only when
evidence is found, one listing of ``commits/`` again (a commit that landed meanwhile covers its version:
a running query is not taken for a loss) and one of ``accepted-loss/``.

**The rule.** While such evidence is not accepted, every command that writes refuses the checkpoint
with one :class:`LostCommitError` line (:func:`check_not_lost`): ``rescale`` (its plan), ``gc`` in all its
forms and a query's start. A writer would otherwise commit its own version under the lost commit's
number, after which the lost commit can never be put back, or sweep the objects the lost commit
references. Readers (``lineage``, ``inspect``, ``restore``, ``read_state``) say it first
(:meth:`LossScan.warnings`): the version they show as the newest is not.

**The way out**, an operator's decision:

- put the lost commits back (``commits/<v>.json`` from a backup, or an earlier version of the object on
  a versioned bucket): the evidence is then below the newest commit and everything works again;
- or accept the loss (:func:`accept_loss`, ``blobstate accept-loss URL --version N`` with ``N`` the newest
  readable version): a create-only record ``accepted-loss/<N>_<uid>.json`` names every attempt
  (version and uid) whose permanent objects were the evidence. Those attempts are no evidence any more;
  writers continue from version ``N`` and the next commit takes the number ``N + 1``, so the lost commits
  can no longer be put back. Evidence of any other attempt (a later loss) is refused again. ``gc --full``
  sweeps the accepted attempts' objects once the newest commit passes their versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.errors import CorruptionError, StateError
from blobstate.ids import InvalidIdError, new_uid, validate_uid
from blobstate.jsonfields import JsonFields, check_record_size, is_int, load_strict_json
from blobstate.layout import ACCEPTED_LOSS_PREFIX, accepted_loss_name, commit_name

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import LogScan

ACCEPTANCE_FORMAT_VERSION = 1
"""The ``accepted-loss/<v>_<uid>.json`` format version this build writes."""

ACCEPTANCE_FORMATS_READ = (1,)
"""The ``accepted-loss/<v>_<uid>.json`` format versions this build reads."""

_STATE_OBJECT_RE = re.compile(r"state/([^/]+)/([0-9]+)/([0-9]+)_([0-9a-f]+)\.(delta|snapshot)")
_ACCEPTANCE_NAME_RE = re.compile(re.escape(ACCEPTED_LOSS_PREFIX) + r"([0-9]+)_([0-9a-f]+)\.json")
_SHOWN = 3


class LostCommitError(StateError):
    """A command that writes refused a checkpoint whose newest commits are known lost: the message names
    the checkpoint, the newest readable version, the evidence and the way out."""

    def __init__(self, message: str, *, url: str, newest: int, lost: list[int]) -> None:
        super().__init__(message)
        self.url = url
        self.newest = newest
        self.lost = lost


class AcceptLossError(StateError):
    """``accept-loss`` refused: not a checkpoint, another version than the newest readable one, or
    nothing lost to accept."""


class AcceptanceFormatError(CorruptionError, ValueError):
    """An ``accepted-loss/<v>_<uid>.json`` record that is malformed: names the object, field and problem."""

    def __init__(self, name: str, field: str, problem: str) -> None:
        where = f" field {field}" if field else ""
        super().__init__(f"invalid {name}:{where}: {problem}")
        self.name = name
        self.field = field
        self.problem = problem


class LostCommitWarning(UserWarning):
    """What :func:`blobstate.read_state` warns, first, when the checkpoint's newest commits were lost or
    its commit log has holes: the version it reads as the newest is not."""


@dataclass(frozen=True, order=True)
class LostAttempt:
    """One attempt (``<v>_<uid>``) above the newest commit with a permanent object: a lost commit's."""

    version: int
    uid: str
    name: str
    """One of its permanent objects."""


@dataclass(frozen=True)
class Acceptance:
    """An operator's acceptance of lost commits: ``accepted-loss/<version>_<uid>.json``.

    ``version`` is the newest readable version the checkpoint continues from; ``lost`` maps each lost
    version to the uids of the attempts whose permanent objects were the evidence."""

    version: int
    uid: str
    lost: dict[int, tuple[str, ...]]
    reason: str | None = None
    created_time_ms: int = 0
    format_version: int = ACCEPTANCE_FORMAT_VERSION

    @property
    def name(self) -> str:
        """``accepted-loss/<version>_<uid>.json``."""
        return accepted_loss_name(self.version, self.uid)

    def covers(self, attempt: LostAttempt) -> bool:
        """Whether this acceptance names ``attempt``."""
        return attempt.uid in self.lost.get(attempt.version, ())

    def to_json(self) -> dict[str, object]:
        """The JSON object stored (before its digest)."""
        return {
            "format_version": self.format_version,
            "version": self.version,
            "lost": {str(v): list(uids) for v, uids in sorted(self.lost.items())},
            "reason": self.reason,
            "created_time_ms": self.created_time_ms,
        }


def _dump(acceptance: Acceptance) -> bytes:
    import json

    from blobstate.lineage.commitlog import DIGEST_FIELD, content_digest

    obj = acceptance.to_json()
    return json.dumps({**obj, DIGEST_FIELD: content_digest(obj)}, indent=1).encode("utf-8")


MAX_ACCEPTANCE_BYTES = 16 * 1024 * 1024
"""The largest ``accepted-loss/<v>_<uid>.json`` a reader parses (one names the lost attempts of a few
versions of up to 10,000 partitions: a few MB at most)."""


def parse_acceptance(data: bytes, name: str) -> Acceptance:
    """Read and validate ``accepted-loss/<v>_<uid>.json``; raises :class:`AcceptanceFormatError`."""
    from blobstate.lineage.commitlog import DIGEST_FIELD, content_digest

    def fail(field_: str, problem: str) -> NoReturn:
        raise AcceptanceFormatError(name, field_, problem)

    match = _ACCEPTANCE_NAME_RE.fullmatch(name)
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
    stored = f.get(DIGEST_FIELD, lambda v: isinstance(v, str), "a SHA-256 hex string")
    if stored != content_digest(f.obj):
        fail(DIGEST_FIELD, "content does not match its checksum: the object was changed after it was written")
    return Acceptance(version, match.group(2), lost, reason, created, format_version)


@dataclass(frozen=True)
class LossScan:
    """What :func:`scan_for_loss` found: the commit log's newest version, its holes, and the attempts
    above it that a lost commit made permanent (``lost``: not accepted; ``accepted``: accepted)."""

    url: str
    newest: int
    """The newest readable version (0: no commit)."""
    holes: tuple[int, ...] = ()
    horizon: int = 1
    lost: tuple[LostAttempt, ...] = ()
    accepted: tuple[LostAttempt, ...] = ()
    acceptances: tuple[Acceptance, ...] = field(default=(), repr=False)

    @property
    def lost_versions(self) -> list[int]:
        """The versions known lost and not accepted, ascending."""
        return sorted({a.version for a in self.lost})

    @property
    def accepted_versions(self) -> list[int]:
        """The versions whose loss an operator accepted (and that are still above the newest), ascending."""
        return sorted({a.version for a in self.accepted})

    def evidence(self) -> str:
        """``committed objects of version 6 exist (state/0/0/6_ab.delta, ...)``: the evidence in words."""
        return _evidence(self.lost)

    def way_out(self) -> str:
        """The operator's two ways out, with the commands."""
        return (
            f"put {_commit_range(self.lost_versions)} back from a backup (then everything works again), or "
            f"accept the loss: `blobstate accept-loss {self.url} --version {self.newest}`"
        )

    def refusal(self, action: str) -> str:
        """The one-line refusal of ``action`` (``rescale``, ``gc``, ``start a query on``)."""
        return (
            f"refusing to {action} {self.url}: its newest commits were lost: the newest readable version is "
            f"{self.newest}{'' if self.newest else ' (no commit is left)'}, but {self.evidence()}, so "
            f"{_commit_range(self.lost_versions)} "
            f"{'was' if len(self.lost_versions) == 1 else 'were'} committed; nothing was written; "
            f"{self.way_out()}"
        )

    def warnings(self) -> list[str]:
        """What a reader says first (empty: nothing to say): lost newest commits, holes."""
        out = []
        if self.lost:
            out.append(
                f"the newest commits of {self.url} were lost: version {self.newest} is the newest readable "
                f"version, not the newest committed one: {self.evidence()}; commands that write refuse this "
                f"checkpoint until you {self.way_out()}"
            )
        if self.holes:
            shown = ", ".join(commit_name(v) for v in self.holes[:_SHOWN])
            more = f" and {len(self.holes) - _SHOWN} more" if len(self.holes) > _SHOWN else ""
            out.append(
                f"the commit log of {self.url} has holes: {shown}{more} missing in the retained window "
                f"{self.horizon}..{self.newest}; those versions cannot be read: restore the commits from a "
                "backup"
            )
        return out

    def notes(self) -> list[str]:
        """Information: accepted losses whose objects are still above the newest commit."""
        if not self.accepted:
            return []
        records = sorted({a.name for a in self.acceptances if any(a.covers(x) for x in self.accepted)})
        return [
            f"the loss of {_commit_range(self.accepted_versions)} of {self.url} was accepted "
            f"({', '.join(records)}): the {_evidence(self.accepted, exist=False)} are no evidence of a lost "
            "commit any more"
        ]


def _commit_range(versions: list[int]) -> str:
    if not versions:
        return "no commit"
    if len(versions) == 1:
        return commit_name(versions[0])
    if versions == list(range(versions[0], versions[-1] + 1)):
        return f"{commit_name(versions[0])}..{commit_name(versions[-1])}"
    return ", ".join(commit_name(v) for v in versions)


def _evidence(attempts: Iterable[LostAttempt], *, exist: bool = True) -> str:
    found = sorted(attempts, key=lambda a: (a.version, a.name))
    versions = sorted({a.version for a in found})
    if not versions:
        return "no committed objects above the newest commit"
    what = (
        f"version {versions[0]}"
        if len(versions) == 1
        else f"versions {', '.join(map(str, versions[:-1]))} and {versions[-1]}"
    )
    shown = ", ".join(a.name for a in found[:_SHOWN])
    more = f" and objects of {len(found) - _SHOWN} more attempts" if len(found) > _SHOWN else ""
    return f"committed objects of {what}{' exist' if exist else ''} ({shown}{more})"


def _permanent(store: BlobStore, names: list[str]) -> str | None:
    """The first of ``names`` (one attempt's objects) that exists without a TTL, else None."""
    for name in names:
        try:
            if not store.has_ttl(name):
                return name
        except BlobNotFoundError:
            continue  # deleted meanwhile
    return None


def read_acceptances(store: BlobStore) -> list[Acceptance]:
    """Every acceptance recorded in ``accepted-loss/`` (one listing, then each read and checked)."""
    names = [n for n in store.list(ACCEPTED_LOSS_PREFIX) if _ACCEPTANCE_NAME_RE.fullmatch(n)]
    return [parse_acceptance(store.get(n), n) for n in names]


def scan_for_loss(store: BlobStore, scan: LogScan | None = None) -> LossScan:
    """Look for the evidence of lost newest commits (see the module docstring), bounded in cost.

    ``scan``: a listing of ``commits/`` already made (else one is made, holes tolerated).
    """
    from blobstate.lineage.commitlog import CommitLog

    if scan is None:
        scan = CommitLog(store).scan(check=False)
    newest = scan.latest
    attempts: dict[tuple[int, str], list[str]] = {}
    for name in store.list("state/"):
        match = _STATE_OBJECT_RE.fullmatch(name)
        if match and int(match.group(3)) > newest:
            attempts.setdefault((int(match.group(3)), match.group(4)), []).append(name)
    found: list[LostAttempt] = []
    if attempts:
        keys = sorted(attempts)
        permanent = store.run_parallel(lambda key: _permanent(store, sorted(attempts[key])), keys)
        found = [LostAttempt(v, uid, name) for (v, uid), name in zip(keys, permanent, strict=True) if name]
    if found:
        # A commit that landed after the listing of commits/ (a running query's) made its own version's
        # objects permanent: they are not a lost commit's.
        now = CommitLog(store).latest_version()
        if now > newest:
            newest = now
            found = [a for a in found if a.version > newest]
    acceptances: list[Acceptance] = read_acceptances(store) if found else []
    lost = tuple(a for a in found if not any(acc.covers(a) for acc in acceptances))
    accepted = tuple(a for a in found if any(acc.covers(a) for acc in acceptances))
    return LossScan(
        url=store.url,
        newest=newest,
        holes=tuple(scan.holes),
        horizon=scan.horizon,
        lost=lost,
        accepted=accepted,
        acceptances=tuple(acceptances),
    )


def check_not_lost(store: BlobStore, scan: LogScan | None = None, *, action: str) -> LossScan:
    """Refuse (:class:`LostCommitError`, one line) to let ``action`` write to a checkpoint whose newest
    commits are known lost and not accepted; return what was found otherwise.

    ``action`` completes "refusing to ... <url>" (``rescale``, ``run gc on``, ``start a query on``);
    ``scan``: a listing of ``commits/`` the caller already made.
    """
    found = scan_for_loss(store, scan)
    if found.lost:
        raise LostCommitError(
            found.refusal(action), url=store.url, newest=found.newest, lost=found.lost_versions
        )
    return found


def accept_loss(store: BlobStore, version: int, *, reason: str | None = None) -> tuple[Acceptance, LossScan]:
    """Record that the commits above ``version`` (the newest readable one) are lost for good.

    Writes ``accepted-loss/<version>_<uid>.json`` create-only, naming every attempt that is evidence now,
    and returns it with the scan made afterwards (whose ``lost`` is empty unless new evidence appeared
    meanwhile). Raises :class:`AcceptLossError` for a location that is not a checkpoint, a ``version``
    other than the newest readable one, or nothing lost; a commit log with holes raises
    :class:`~blobstate.lineage.commitlog.IncompleteCommitLogError` (holes are not accepted: restore them).
    """
    from blobstate.layout import METADATA
    from blobstate.lineage.commitlog import CommitLog, now_ms

    log = CommitLog(store)
    try:
        log.read_metadata()
    except BlobNotFoundError:
        raise AcceptLossError(f"{store.url} is not a query checkpoint ({METADATA} is missing)") from None
    found = scan_for_loss(store, log.scan())
    if not is_int(version) or version != found.newest:
        raise AcceptLossError(
            f"the newest readable version of {store.url} is {found.newest}, not {version!r}: give "
            f"--version {found.newest} (the version the checkpoint continues from); nothing was written"
        )
    if not found.lost:
        already = f" (the loss of {_commit_range(found.accepted_versions)} is accepted already)"
        raise AcceptLossError(
            f"nothing to accept: no commit above version {version} of {store.url} is known lost"
            f"{already if found.accepted else ''}; `blobstate verify {store.url}` checks the checkpoint"
        )
    lost: dict[int, list[str]] = {}
    for attempt in found.lost:
        lost.setdefault(attempt.version, []).append(attempt.uid)
    acceptance = Acceptance(
        version, new_uid(), {v: tuple(sorted(u)) for v, u in lost.items()}, reason, now_ms()
    )
    data = _dump(acceptance)
    parse_acceptance(data, acceptance.name)
    if not store.put_if_absent(acceptance.name, data):  # a fresh uid: never taken
        raise AcceptLossError(f"{acceptance.name} exists already in {store.url}; run accept-loss again")
    return acceptance, scan_for_loss(store)


__all__ = [
    "ACCEPTANCE_FORMATS_READ",
    "ACCEPTANCE_FORMAT_VERSION",
    "AcceptLossError",
    "Acceptance",
    "AcceptanceFormatError",
    "LossScan",
    "LostAttempt",
    "LostCommitError",
    "LostCommitWarning",
    "accept_loss",
    "check_not_lost",
    "parse_acceptance",
    "read_acceptances",
    "scan_for_loss",
]
