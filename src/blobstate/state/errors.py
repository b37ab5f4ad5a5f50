"""Errors of loading, committing and verifying partition state. Each names the thing at fault."""

from __future__ import annotations

from blobstate.errors import CorruptionError, StateError
from blobstate.ids import CheckpointId


class StateLoadError(StateError, RuntimeError):
    """A partition could not be brought to the requested checkpoint. Its working store stays dirty."""


class MissingObjectError(StateLoadError):
    """An object that a checkpoint's lineage references is missing (deleted, expired or never written)."""

    def __init__(
        self, name: str, cid: CheckpointId, target: CheckpointId | None = None, why: str = ""
    ) -> None:
        needed = f" (needed to load {target})" if target is not None and target != cid else ""
        extra = f": {why}" if why else ""
        super().__init__(
            f"missing object {name!r} of version {cid.version}, uid {cid.uid}{needed}{extra}; "
            "state is not reset to empty"
        )
        self.name = name
        self.checkpoint_id = cid
        self.target = target


class CorruptObjectError(StateLoadError, CorruptionError):
    """An object that a checkpoint's lineage references is corrupt, truncated or of an unknown format."""

    def __init__(
        self, name: str, cid: CheckpointId, problem: str, target: CheckpointId | None = None
    ) -> None:
        needed = f" (needed to load {target})" if target is not None and target != cid else ""
        super().__init__(
            f"corrupt object {name!r} of version {cid.version}, uid {cid.uid}{needed}: {problem}"
        )
        self.name = name
        self.checkpoint_id = cid
        self.problem = problem
        self.target = target


class LineageError(StateLoadError):
    """A lineage record that cannot be followed: a gap, a wrong length, or a bad uid."""

    def __init__(self, name: str, cid: CheckpointId, problem: str) -> None:
        super().__init__(f"bad lineage in {name!r} (version {cid.version}, uid {cid.uid}): {problem}")
        self.name = name
        self.checkpoint_id = cid
        self.problem = problem


class PartitionClosedError(StateError, RuntimeError):
    """The partition was committed, aborted or closed; open it again for the next version."""
