"""When to take a snapshot, how many versions to keep restorable, how many local checkpoints to keep."""

from __future__ import annotations

from dataclasses import dataclass

from blobstate import defaults

DEFAULT_SNAPSHOT_EVERY = defaults.SNAPSHOT_EVERY
DEFAULT_SNAPSHOT_DELTA_BYTES = defaults.SNAPSHOT_DELTA_BYTES
DEFAULT_MIN_VERSIONS_TO_RETAIN = defaults.MIN_VERSIONS_TO_RETAIN
DEFAULT_LOCAL_CHECKPOINTS_TO_KEEP = defaults.LOCAL_CHECKPOINTS_TO_KEEP
DEFAULT_SNAPSHOT_UPLOAD = defaults.SNAPSHOT_UPLOAD


@dataclass(frozen=True)
class SnapshotPolicy:
    """Snapshot every ``every`` versions, or once the deltas since the last snapshot exceed ``delta_bytes``.

    ``every`` counts deltas since the last (presumed) snapshot.
    """

    every: int = DEFAULT_SNAPSHOT_EVERY
    delta_bytes: int = DEFAULT_SNAPSHOT_DELTA_BYTES

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"snapshot_every must be a positive integer, got {self.every!r}")
        if (
            isinstance(self.delta_bytes, bool)
            or not isinstance(self.delta_bytes, int)
            or self.delta_bytes < 1
        ):
            raise ValueError(f"snapshot_delta_bytes must be a positive integer, got {self.delta_bytes!r}")

    def due(self, deltas_since_snapshot: int, delta_bytes_since_snapshot: int) -> bool:
        """Whether a checkpoint with this many deltas (and bytes of deltas) since its base snapshot is due."""
        return deltas_since_snapshot >= self.every or delta_bytes_since_snapshot >= self.delta_bytes


def validate_retention(min_versions_to_retain: int) -> int:
    """Return ``min_versions_to_retain`` if it is a positive integer, else raise ``ValueError``."""
    value = min_versions_to_retain
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"min_versions_to_retain must be a positive integer, got {value!r}")
    return value
