"""Where things live: the remote layout under a checkpoint URL and the local layout per executor.

Remote (relative to the checkpoint's blob store root)::

    metadata.json
    commits/<v>.json
    state/<op>/<p>/<v>_<uid>.delta
    state/<op>/<p>/<v>_<uid>.snapshot
    blobs/<op>/<p>/<blob-id>
    accepted-loss/<v>_<uid>.json

Local (per executor)::

    <local_dir>/<query-id>/<op>/<p>/working/
    <local_dir>/<query-id>/<op>/<p>/checkpoints/<v>_<uid>/
    <local_dir>/<query-id>/<op>/<p>/standby/
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from blobstate.ids import CheckpointId, validate_operator, validate_partition, validate_uid, validate_version

METADATA = "metadata.json"
COMMITS_PREFIX = "commits/"
CHECKPOINT_ID_FILE = "CHECKPOINT-ID"
ACCEPTED_LOSS_PREFIX = "accepted-loss/"
"""Where an operator's acceptance of lost commits is recorded (:mod:`blobstate.state.lost`)."""


def commit_name(version: int) -> str:
    """``commits/<v>.json``."""
    return f"{COMMITS_PREFIX}{validate_version(version)}.json"


def accepted_loss_name(version: int, uid: str) -> str:
    """``accepted-loss/<v>_<uid>.json``: an acceptance of the commits lost above version ``v``."""
    return f"{ACCEPTED_LOSS_PREFIX}{CheckpointId(version, uid).name}.json"


def state_prefix(operator: str, partition: int) -> str:
    """``state/<op>/<p>/``: deltas and snapshot indexes of one partition."""
    return f"state/{validate_operator(operator)}/{validate_partition(partition)}/"


def delta_name(operator: str, partition: int, cid: CheckpointId) -> str:
    """``state/<op>/<p>/<v>_<uid>.delta``."""
    return f"{state_prefix(operator, partition)}{cid.name}.delta"


def snapshot_name(operator: str, partition: int, cid: CheckpointId) -> str:
    """``state/<op>/<p>/<v>_<uid>.snapshot``."""
    return f"{state_prefix(operator, partition)}{cid.name}.snapshot"


def blob_prefix(operator: str, partition: int) -> str:
    """``blobs/<op>/<p>/``: file contents referenced by this partition's snapshot indexes."""
    return f"blobs/{validate_operator(operator)}/{validate_partition(partition)}/"


@dataclass(frozen=True)
class LocalPartitionLayout:
    """The local directories of one (operator, partition) of one query on one executor.

    The layout is immutable, so each directory is computed once per layout (``cached_property``): a
    partition's open and commit ask for them about ten times per batch.
    """

    local_dir: Path
    query_id: str
    operator: str
    partition: int

    def __post_init__(self) -> None:
        validate_uid(self.query_id.replace("-", ""), "query id")
        validate_operator(self.operator)
        validate_partition(self.partition)

    @cached_property
    def root(self) -> Path:
        """``<local_dir>/<query-id>/<op>/<p>``."""
        return Path(self.local_dir) / self.query_id / self.operator / str(self.partition)

    @cached_property
    def working(self) -> Path:
        """The open store's directory."""
        return self.root / "working"

    @cached_property
    def checkpoints(self) -> Path:
        """Directory of immutable local RocksDB checkpoints, one per ``<v>_<uid>``."""
        return self.root / "checkpoints"

    def checkpoint(self, cid: CheckpointId) -> Path:
        """The local checkpoint directory of ``cid``."""
        return self.checkpoints / cid.name

    @cached_property
    def standby(self) -> Path:
        """The standby replica's directory."""
        return self.root / "standby"

    @cached_property
    def lock_file(self) -> Path:
        """Held (``fcntl.flock``) by the one process that has this partition open."""
        return self.root / "LOCK"
