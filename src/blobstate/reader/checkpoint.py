"""A query checkpoint opened for reading: which version, operator and partitions, and one partition's
RocksDB store restored at a committed version into a local directory.

Reading never writes or deletes anything in the blob store: it reads ``metadata.json``, commits, deltas
and snapshots (each checked against its commit, as the load rules do, :mod:`blobstate.state.loader`)
and restores into a directory of its own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.blobstore.open import nothing_stored
from blobstate.ids import CheckpointId
from blobstate.layout import METADATA, LocalPartitionLayout
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.reader.variables import StateReadError
from blobstate.state.local_copy import LocalCopy, Opener, open_rocks, partition_history


@dataclass(frozen=True)
class CheckpointVersion:
    """A committed version of a query checkpoint, chosen and checked for reading."""

    url: str
    metadata: QueryMetadata
    commit: Commit
    retained_from: int
    latest: int

    @property
    def version(self) -> int:
        """The version read."""
        return self.commit.version

    def describe(self, operator: str, partition: int) -> str:
        """``operator <op> partition <p> at version <v> (uid <uid>) of <url>``: one partition's state
        at this version, for messages."""
        uid = self.commit.checkpoints.get(operator, {}).get(partition)
        return (
            f"operator {operator} partition {partition} at version {self.version} (uid {uid}) of {self.url}"
        )

    def key_columns(self, operator: str) -> list[str]:
        """The grouping key columns of ``operator``."""
        return list(self.metadata.operators[operator]["key_columns"])


def is_query_checkpoint(store: BlobStore) -> bool:
    """Whether ``store`` holds a query checkpoint (its ``metadata.json``)."""
    return store.exists(METADATA)


def open_version(store: BlobStore, version: int | None = None) -> CheckpointVersion:
    """Read the checkpoint's metadata and the commit of ``version`` (None: the latest).

    Refuses, with a :class:`StateReadError` naming the retained range, a version that was never
    committed or that is older than the latest commit keeps restorable (``retained_from``).
    """
    log = CommitLog(store)
    try:
        metadata = log.read_metadata()
    except BlobNotFoundError:
        raise StateReadError(
            f"{store.url} is not a blobstate query checkpoint: it has no {METADATA}{nothing_stored(store)}"
        ) from None
    latest = log.latest_version()
    if latest == 0:
        raise StateReadError(f"the checkpoint {store.url} has no committed version yet: nothing to read")
    newest = log.read_commit(latest)
    retained_from = newest.retained_from
    span = (
        f"versions {retained_from}..{latest} are retained"
        if retained_from < latest
        else f"only version {latest} is retained"
    )
    if version is None:
        version = latest
    if isinstance(version, bool) or not isinstance(version, int):
        raise StateReadError(f"version must be an int, not {type(version).__name__} ({version!r})")
    if version < 1:
        raise StateReadError(
            f"version {version} of {store.url} never existed: versions start at 1 (committed versions are "
            f"1..{latest}; {span})"
        )
    if version > latest:
        raise StateReadError(
            f"version {version} of {store.url} is not committed (the latest is {latest}; {span})"
        )
    if version < retained_from:
        raise StateReadError(
            f"version {version} of {store.url} is no longer retained ({span}; min_versions_to_retain decides"
            " how many)"
        )
    try:
        commit = newest if version == latest else log.read_commit(version)
    except BlobNotFoundError:
        raise StateReadError(f"version {version} of {store.url} has no commit ({span})") from None
    return CheckpointVersion(store.url, metadata, commit, retained_from, latest)


def choose_operator(checkpoint: CheckpointVersion, operator: str | None) -> str:
    """``operator``, checked; by default the checkpoint's only processor operator (broadcast adjunct
    stores, operators of their own, are read only when named)."""
    known = sorted(checkpoint.metadata.operators)
    if operator is None:
        processors = [op for op in known if "partitions" not in checkpoint.metadata.operators[op]]
        if len(processors) == 1:
            return processors[0]
        raise StateReadError(
            f"the checkpoint {checkpoint.url} has operators {known}: choose one with operator"
        )
    if operator not in checkpoint.metadata.operators:
        raise StateReadError(f"the checkpoint {checkpoint.url} has no operator {operator!r}; it has {known}")
    return operator


def choose_partitions(checkpoint: CheckpointVersion, partition: Any) -> list[int]:
    """The partitions to read: ``partition`` (an int or a comma-separated string), or all when None."""
    # A processor operator's count at this version (a rescale changes it); adjunct stores are not variables.
    n = checkpoint.commit.partitions_of("\x00", checkpoint.metadata)
    if partition is None or partition == "":
        return list(range(n))
    wanted = partition if isinstance(partition, (list, tuple)) else str(partition).split(",")
    out = []
    for item in wanted:
        try:
            p = int(str(item).strip())
        except ValueError:
            raise StateReadError(f"partition must be an int, not {item!r}") from None
        if not 0 <= p < n:
            raise StateReadError(
                f"the checkpoint {checkpoint.url} has no partition {p}: it has partitions 0..{n - 1}"
            )
        out.append(p)
    return out


def restore_into(
    store: BlobStore,
    checkpoint: CheckpointVersion,
    operator: str,
    partition: int,
    target: Path,
    scratch: Path,
    opener: Opener = open_rocks,
) -> Any:
    """Restore the partition's RocksDB at the checkpoint's version into ``target``.

    Returns the load's :class:`~blobstate.state.loader.Loaded` (``.store`` open, ``.report`` how it was
    loaded, ``.info`` its lineage). ``scratch`` is a private directory for the load's bookkeeping (its
    partition layout root, whose lock the load holds); ``opener`` opens the store. The caller closes
    the store.
    """
    cid: CheckpointId = checkpoint.commit.checkpoint_id(operator, partition)
    layout = LocalPartitionLayout(scratch, checkpoint.metadata.query_id, operator, partition)
    history = partition_history(store, operator, partition, {cid.version: checkpoint.commit})
    with LocalCopy.open(store, layout, target, history=history, opener=opener) as copy:
        # Every commit up to the latest is durable: a snapshot of this version (or an older one on its
        # lineage) that a later commit named is committed, and retention keeps it while this version is.
        return copy.bring_to(cid, upto=checkpoint.latest)


@contextmanager
def restored_partition(
    store: BlobStore,
    checkpoint: CheckpointVersion,
    operator: str,
    partition: int,
    opener: Opener = open_rocks,
) -> Iterator[Any]:
    """The partition's store at the version, restored (opened with ``opener``) into a temporary directory
    removed afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix=f"blobstate-read-{partition}-"))
    try:
        loaded = restore_into(
            store, checkpoint, operator, partition, scratch / "db", scratch / "load", opener
        )
        rocks = loaded.store
        try:
            yield rocks
        finally:
            rocks.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
