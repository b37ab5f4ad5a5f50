"""Spark's own checkpoint of the query (``metadata``, ``offsets/``, ``sources/``), read through Hadoop.

The driver reads it to tell a replayed batch from a reset (``replay.py``) and the adjunct step reads
the side streams' offsets and file-source logs from it; any filesystem Spark can use is read.
"""

from __future__ import annotations

import logging

from blobstate.batch.jvm import JvmSeam
from blobstate.engine.replay import SourceProgress
from blobstate.engine.stage import BatchError

log = logging.getLogger("blobstate")


class SparkCheckpointError(BatchError):
    """A file of Spark's checkpoint could not be read; the message names it."""


class SparkCheckpoint:
    """Spark's checkpoint at ``location``: its ``metadata`` (read once), this batch's offset log entry
    (:attr:`offsets`, read by :meth:`source`), and any file below it, read through the JVM seam."""

    def __init__(self, jvm: JvmSeam, location: str) -> None:
        self.location = location
        self._seam = jvm
        self._metadata: bytes | None = None
        self.offsets: bytes | None = None
        """The current batch's entry of Spark's offset log (None until :meth:`source` read one)."""

    def source(self, batch_id: int) -> SourceProgress | None:
        """What Spark's checkpoint says about batch ``batch_id`` (None: not readable from here)."""
        if not self._seam.reads_spark_files():  # Spark Connect: Python cannot reach the JVM's filesystem
            log.warning("cannot read Spark's checkpoint here: replays are taken on trust, as before")
            return None
        if self._metadata is None:  # written once when Spark's checkpoint is created
            self._metadata = self.read_file("metadata")
        self.offsets = self.read_file(f"offsets/{batch_id}")
        return SourceProgress.read(self._metadata, self.offsets)

    def list_dir(self, relative: str) -> list[str]:
        """The names in a directory of Spark's checkpoint (empty when it does not exist)."""
        return self._seam.list_dir(f"{self.location.rstrip('/')}/{relative}")

    def read_file(self, relative: str) -> bytes:
        """A file of Spark's checkpoint; :class:`SparkCheckpointError` names it when it cannot be read."""
        try:
            return self._seam.read_file(f"{self.location.rstrip('/')}/{relative}")
        except Exception as error:
            raise SparkCheckpointError(
                f"cannot read {relative} of Spark's checkpoint {self.location}: {error}"
            ) from error

    def exists(self, uri: str) -> bool:
        """Whether a file Spark's checkpoint names still exists (through Hadoop's FileSystem)."""
        return self._seam.file_exists(uri)
