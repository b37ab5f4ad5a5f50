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
  sweeps the accepted attempts' objects once the newest commit passes their versions. The lost commits'
  cleanup may have deleted versions below ``N`` and pruned commits ``N`` still counts, so from the
  acceptance on version ``N`` alone is retained (:mod:`blobstate.lineage.acceptance`), after it was checked
  restorable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.errors import StateError
from blobstate.ids import new_uid
from blobstate.jsonfields import is_int
from blobstate.layout import commit_name
from blobstate.lineage.acceptance import (
    ACCEPTANCE_FORMAT_VERSION,
    ACCEPTANCE_FORMATS_READ,
    MAX_ACCEPTANCE_BYTES,
    Acceptance,
    AcceptanceFormatError,
    parse_acceptance,
    read_acceptances,
)

if TYPE_CHECKING:
    from blobstate.lineage.commitlog import CommitLog, LogScan

_STATE_OBJECT_RE = re.compile(r"state/([^/]+)/([0-9]+)/([0-9]+)_([0-9a-f]+)\.(delta|snapshot)")
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
        records = sorted(
            {a.name for a in self.acceptances if any(a.covers(x.version, x.uid) for x in self.accepted)}
        )
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


def scan_for_loss(store: BlobStore, scan: LogScan | None = None, *, log: CommitLog | None = None) -> LossScan:
    """Look for the evidence of lost newest commits (see the module docstring), bounded in cost.

    ``scan``: a listing of ``commits/`` already made (else one is made, holes tolerated); ``log``: the
    commit log that made it, whose acceptances (read with its newest commit, and its ``assumed`` ones not
    written yet: ``accept-loss`` checks before it writes) are used instead of reading them again.
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
    acceptances = (log.acceptances() if log is not None else read_acceptances(store)) if found else []
    lost = tuple(a for a in found if not any(acc.covers(a.version, a.uid) for acc in acceptances))
    accepted = tuple(a for a in found if any(acc.covers(a.version, a.uid) for acc in acceptances))
    return LossScan(
        url=store.url,
        newest=newest,
        holes=tuple(scan.holes),
        horizon=scan.horizon,
        lost=lost,
        accepted=accepted,
        acceptances=tuple(acceptances),
    )


def check_not_lost(
    store: BlobStore, scan: LogScan | None = None, *, action: str, log: CommitLog | None = None
) -> LossScan:
    """Refuse (:class:`LostCommitError`, one line) to let ``action`` write to a checkpoint whose newest
    commits are known lost and not accepted; return what was found otherwise.

    ``action`` completes "refusing to ... <url>" (``rescale``, ``run gc on``, ``start a query on``);
    ``scan``: a listing of ``commits/`` the caller already made (by ``log``).
    """
    found = scan_for_loss(store, scan, log=log)
    if found.lost:
        raise LostCommitError(
            found.refusal(action), url=store.url, newest=found.newest, lost=found.lost_versions
        )
    return found


def scan_for_writing(
    store: BlobStore, *, action: str, log: CommitLog | None = None
) -> tuple[LogScan, LossScan]:
    """The listing of ``commits/`` every writer starts from, proven safe to write after.

    A lost newest commit is refused first (:class:`LostCommitError`): its cleanup may have pruned
    commits that the readable commit still counts, which would otherwise read as holes and hide the way
    out. Then holes refuse (:class:`~blobstate.lineage.commitlog.IncompleteCommitLogError`).
    """
    from blobstate.lineage.commitlog import CommitLog

    log = log if log is not None else CommitLog(store)
    scan = log.scan(check=False)
    found = check_not_lost(store, scan, action=action, log=log)
    log.check_complete(scan)
    return scan, found


def _unbroken_from(scan: LogScan) -> int:
    """The oldest version from which every commit up to the newest exists."""
    return max(scan.holes) + 1 if scan.holes else scan.horizon


def accept_loss(store: BlobStore, version: int, *, reason: str | None = None) -> tuple[Acceptance, LossScan]:
    """Record that the commits above ``version`` (the newest readable one) are lost for good.

    The lost commits' post-commit cleanup was free to delete every version below their retained window
    and to prune the commits below their horizon, so the checkpoint continues from ``version`` alone:
    commits missing at the bottom of its retained window count as pruned (pruning goes oldest first, so
    the lost commits' pruning leaves a prefix), and ``version`` itself is checked restorable (as
    ``verify`` checks a retained version) before anything is written.

    Writes ``accepted-loss/<version>_<uid>.json`` create-only, naming every attempt that is evidence now,
    and returns it with the scan made afterwards (whose ``lost`` is empty unless new evidence appeared
    meanwhile). Raises :class:`AcceptLossError` for a location that is not a checkpoint, a ``version``
    other than the newest readable one, nothing lost, or a ``version`` that is not restorable any more
    (only putting the lost commits back can help then); a commit log with holes that are not at the
    bottom of the window raises :class:`~blobstate.lineage.commitlog.IncompleteCommitLogError` (no
    cleanup makes those: restore them).
    """
    from blobstate.layout import METADATA
    from blobstate.lineage.commitlog import CommitLog, now_ms
    from blobstate.state.verify import verify

    log = CommitLog(store)
    try:
        log.read_metadata()
    except BlobNotFoundError:
        from blobstate.blobstore.open import nothing_stored

        raise AcceptLossError(
            f"{store.url} is not a query checkpoint ({METADATA} is missing){nothing_stored(store)}"
        ) from None
    scan = log.scan(check=False)
    found = scan_for_loss(store, scan, log=log)
    if not is_int(version) or version != found.newest:
        raise AcceptLossError(
            f"the newest readable version of {store.url} is {found.newest}, not {version!r}: give "
            f"--version {found.newest} (the version the checkpoint continues from); nothing was written"
        )
    if not found.lost:
        already = f" (the loss of {_commit_range(found.accepted_versions)} is accepted already)"
        if found.holes:
            log.check_complete(scan)  # holes without a lost commit: restore them
        raise AcceptLossError(
            f"nothing to accept: no commit above version {version} of {store.url} is known lost"
            f"{already if found.accepted else ''}; `blobstate verify {store.url}` checks the checkpoint"
        )
    holes = list(scan.holes)
    if holes != list(range(scan.horizon, scan.horizon + len(holes))):
        log.check_complete(scan)  # a hole above a present commit: no pruning made it
    lost: dict[int, list[str]] = {}
    for attempt in found.lost:
        lost.setdefault(attempt.version, []).append(attempt.uid)
    acceptance = Acceptance(
        version,
        new_uid(),
        {v: tuple(sorted(u)) for v, u in lost.items()},
        reason,
        now_ms(),
        commit=scan.newest.attempts_digest() if scan.newest is not None else None,
        horizon=_unbroken_from(scan),
    )
    log.assumed.append(acceptance)
    report = verify(store, commit_log=log)
    if report.problems:
        first, more = report.problems[0], len(report.problems) - 1
        raise AcceptLossError(
            f"cannot continue {store.url} from version {version}: it is not restorable any more: {first}"
            f"{f' (and {more} more problems)' if more else ''}; the lost commits' cleanup deleted what it "
            f"needs, so only putting {_commit_range(found.lost_versions)} back can recover the checkpoint; "
            "nothing was written"
        )
    data = acceptance.dump()
    parse_acceptance(data, acceptance.name)
    if not store.put_if_absent(acceptance.name, data):  # a fresh uid: never taken
        raise AcceptLossError(f"{acceptance.name} exists already in {store.url}; run accept-loss again")
    return acceptance, scan_for_loss(store)


__all__ = [
    "ACCEPTANCE_FORMATS_READ",
    "ACCEPTANCE_FORMAT_VERSION",
    "MAX_ACCEPTANCE_BYTES",
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
    "scan_for_writing",
]
