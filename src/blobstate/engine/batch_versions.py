"""Which blobstate version a Spark batch id commits, and which commit a replayed batch id committed.

Without a rescale, batch ``b`` commits version ``b + 1``. A rescale commits a version of its own that no
Spark batch produced: it turns the newest version ``L`` (batch ``L - 1``) into ``R = L + 1`` and records
L's ``batch_id`` in it. Every commit records its ``batch_id``, and from a rescale on ``version - batch_id``
is one more than before it (``1 +`` the number of rescales so far), so the newest commit fixes the mapping
of every later batch: batch ``b`` commits ``latest.version + (b - latest.batch_id)``. A batch at or below
the newest commit's ``batch_id`` was committed already (Spark runs it again when the driver died before
Spark's own commit): its commit is the newest one whose ``batch_id`` is ``b``, which for the batch a
rescale followed is the rescale's commit (it carries that batch's ``source``, so the replay check holds).
"""

from __future__ import annotations

from collections.abc import Callable

from blobstate.lineage.commitlog import Commit


def version_of_batch(latest: Commit | None, batch_id: int) -> int:
    """The version batch ``batch_id`` commits, after the newest commit ``latest`` (None: nothing
    committed yet, version ``batch_id + 1``). Only meaningful for ``batch_id > latest.batch_id``; for
    a batch already committed see :func:`committed_batch`."""
    if latest is None:
        return batch_id + 1
    return latest.version + (batch_id - latest.batch_id)


def committed_batch(
    latest: Commit | None, batch_id: int, read: Callable[[int], Commit | None]
) -> tuple[int, Commit | None] | None:
    """Where batch ``batch_id`` was committed, if it was: ``(version, commit)`` of the newest commit whose
    ``batch_id`` is ``batch_id`` (the commit None when ``read`` finds it pruned), or None when the batch
    comes after ``latest``. ``read(v)`` returns the commit of version ``v`` (None: no such commit).

    Walks down from ``latest``: each step below a rescale skips the rescale's version, so it reads at most
    one commit per rescale between the batch and the newest commit, plus one.
    """
    if latest is None or batch_id > latest.batch_id:
        return None
    version = version_of_batch(latest, batch_id)
    while version >= 1:
        commit = latest if version == latest.version else read(version)
        if commit is None:
            return version, None
        if commit.batch_id == batch_id:
            return version, commit
        if commit.batch_id < batch_id:  # batch ids never fall as versions rise: not in this log
            return version, None
        # A rescale lies between: its version repeats a batch id, so the batch sits that much lower.
        version -= commit.batch_id - batch_id
    return None


__all__ = ["committed_batch", "version_of_batch"]
