"""Is this batch a replay? Spark's offsets checkpoint against blobstate's commit log.

Spark calls the batch function again for a batch it had not marked done (a driver that died after the
blobstate commit and before Spark's own): blobstate must skip it, since its state is committed. But when
Spark's checkpoint (``<checkpoint>/_spark``) is lost or replaced while blobstate's commit log holds
versions, Spark starts again at batch 0 with new input, and taking those batches for replays would drop
the input silently.

So every commit records where its batch came from (:class:`SourceProgress`): the id of the Spark
streaming query (kept in Spark's checkpoint ``metadata`` file; a lost or reset checkpoint gets a new one)
and the SHA-256 of Spark's offset log entry for the batch (``offsets/<batch_id>``, which Spark writes
before it runs a batch and reuses unchanged when it runs it again). :func:`check_batch` decides: a batch
whose commit exists is a replay only when both match; any other disagreement stops the query with
:class:`SparkCheckpointMismatchError`, which says what happened and how to recover.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from blobstate.errors import QueryError


class SparkCheckpointMismatchError(QueryError):
    """Spark's offsets checkpoint and blobstate's commit log disagree: input would be lost or repeated."""


@dataclass(frozen=True)
class SourceProgress:
    """Where a batch's input came from: Spark's streaming query id and its offset log entry's digest."""

    spark_query_id: str
    offsets_sha256: str
    batch_timestamp_ms: int | None = None
    """Spark's processing time for the batch (its offset log's ``batchTimestampMs``), the same on replay;
    not part of :meth:`to_json`."""

    def to_json(self) -> dict[str, str]:
        """``{"spark_query_id": ..., "offsets_sha256": ...}``."""
        return {"spark_query_id": self.spark_query_id, "offsets_sha256": self.offsets_sha256}

    @classmethod
    def from_json(cls, raw: object) -> SourceProgress | None:
        """Parse a commit's ``source`` field (None when absent or not in this form)."""
        if not isinstance(raw, dict):
            return None
        query_id, digest = raw.get("spark_query_id"), raw.get("offsets_sha256")
        if not isinstance(query_id, str) or not isinstance(digest, str):
            return None
        return cls(query_id, digest)

    @classmethod
    def read(cls, metadata: bytes, offsets: bytes) -> SourceProgress:
        """From the bytes of Spark's ``metadata`` file and ``offsets/<batch_id>`` entry."""
        try:
            query_id = json.loads(metadata.decode("utf-8").splitlines()[0])["id"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise SparkCheckpointMismatchError(
                f"cannot read the streaming query id from Spark's checkpoint metadata: {error}"
            ) from error
        return cls(str(query_id), hashlib.sha256(offsets).hexdigest(), _batch_timestamp_ms(offsets))


def _batch_timestamp_ms(offsets: bytes) -> int | None:
    """``batchTimestampMs`` of an offset log entry (``v1``, then its metadata JSON), or None."""
    lines = offsets.decode("utf-8", errors="replace").splitlines()
    try:
        value = json.loads(lines[1]).get("batchTimestampMs") if len(lines) > 1 else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


RECOVERY = (
    "to recover, restore Spark's checkpoint directory ({spark}) as it was, or start the query on a new "
    "blobstate checkpoint location (a new checkpoint argument) to process the input from the start"
)


def check_batch(
    batch_id: int,
    committed: Any,
    latest: Any,
    current: SourceProgress,
    *,
    checkpoint: str,
    spark_checkpoint: str,
) -> bool:
    """Whether batch ``batch_id`` is a replay of a committed batch (True: skip it; False: run it).

    ``committed`` is the commit of the batch (None if there is none; ``batch_versions.committed_batch``
    finds it), ``latest`` the
    newest commit (None if nothing is committed), ``current`` what Spark's checkpoint says about this
    batch now. Raises :class:`SparkCheckpointMismatchError` when they disagree. Commits without a recorded
    source (written by an older blobstate, or by tools) are trusted as before.
    """
    recovery = RECOVERY.format(spark=spark_checkpoint)
    if committed is not None:
        recorded = SourceProgress.from_json(committed.source)
        if recorded is None:
            return True
        if recorded.spark_query_id != current.spark_query_id:
            raise SparkCheckpointMismatchError(
                f"Spark's checkpoint {spark_checkpoint} belongs to streaming query "
                f"{current.spark_query_id}, but batch {batch_id} in {checkpoint} was committed by query "
                f"{recorded.spark_query_id}: Spark's checkpoint was lost or replaced, and running on would "
                f"take new input for replays of committed batches and drop it; {recovery}"
            )
        if recorded.offsets_sha256 != current.offsets_sha256:
            raise SparkCheckpointMismatchError(
                f"batch {batch_id} has other source offsets in Spark's checkpoint {spark_checkpoint} than "
                f"the batch committed as version {committed.version} in {checkpoint}: Spark's offset log was "
                f"changed, and running on would drop or repeat input; {recovery}"
            )
        return True
    if latest is not None:
        recorded = SourceProgress.from_json(latest.source)
        if recorded is not None and recorded.spark_query_id != current.spark_query_id:
            raise SparkCheckpointMismatchError(
                f"Spark's checkpoint {spark_checkpoint} belongs to streaming query "
                f"{current.spark_query_id}, but {checkpoint} was written by query "
                f"{recorded.spark_query_id} up to version {latest.version}: the two checkpoints do not "
                f"belong together; {recovery}"
            )
    return False


__all__ = ["SourceProgress", "SparkCheckpointMismatchError", "check_batch"]
