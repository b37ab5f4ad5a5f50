"""Unique-id lineage (docs/DESIGN.md, "Lineage"): delta objects (:mod:`.delta`) and the commit log
(:mod:`.commitlog`)."""

from __future__ import annotations

from blobstate.lineage.changelog import ChangeOp, ChangeRecord
from blobstate.lineage.commitlog import (
    COMMIT_FORMAT_VERSION,
    MAX_COMMIT_BYTES,
    MAX_METADATA_BYTES,
    METADATA_FORMAT_VERSION,
    Commit,
    CommitConflictError,
    CommitLog,
    CommitLogError,
    CommitLogFormatError,
    MetadataConflictError,
    QueryMetadata,
)
from blobstate.lineage.delta import (
    FORMAT_VERSION,
    Delta,
    DeltaFormatError,
    decode_delta,
    encode_delta,
    read_delta,
    read_delta_lineage,
    write_delta,
)

__all__ = [
    "COMMIT_FORMAT_VERSION",
    "FORMAT_VERSION",
    "MAX_COMMIT_BYTES",
    "MAX_METADATA_BYTES",
    "METADATA_FORMAT_VERSION",
    "ChangeOp",
    "ChangeRecord",
    "Commit",
    "CommitConflictError",
    "CommitLog",
    "CommitLogError",
    "CommitLogFormatError",
    "Delta",
    "DeltaFormatError",
    "MetadataConflictError",
    "QueryMetadata",
    "decode_delta",
    "encode_delta",
    "read_delta",
    "read_delta_lineage",
    "write_delta",
]
