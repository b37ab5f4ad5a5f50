"""The stored formats this build writes and reads: one table, shown by ``blobstate --version`` and by the
README's "Stored formats" (a test compares the two).

Every entry takes its versions from the module that writes and parses the object, so the table cannot
drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass

from blobstate.lineage.acceptance import ACCEPTANCE_FORMAT_VERSION, ACCEPTANCE_FORMATS_READ
from blobstate.lineage.commitlog import (
    COMMIT_FORMAT_VERSION,
    COMMIT_FORMATS_READ,
    INSTANT_KEYS_COMMIT_FORMAT,
    METADATA_FORMAT_VERSION,
    RESCALED_COMMIT_FORMAT,
)
from blobstate.lineage.delta import FORMAT_VERSION as DELTA_FORMAT_VERSION
from blobstate.snapshot.heads import HEAD_FORMAT_VERSION, HEAD_FORMATS_READ
from blobstate.snapshot.index import SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS
from blobstate.snapshot.repository import REPOSITORY_FORMAT_VERSION, REPOSITORY_MARKER


@dataclass(frozen=True)
class StoredFormat:
    """One kind of stored object: what it is (Markdown), the version(s) written and the versions read."""

    what: str
    written: str
    read: tuple[int, ...]

    def cells(self) -> tuple[str, str, str]:
        """The README table's cells: object, version written, versions read."""
        return self.what, self.written, ", ".join(str(v) for v in self.read)


STORED_FORMATS: tuple[StoredFormat, ...] = (
    StoredFormat("`metadata.json`", f"{METADATA_FORMAT_VERSION}", (METADATA_FORMAT_VERSION,)),
    StoredFormat(
        "`commits/<v>.json`",
        f"{COMMIT_FORMAT_VERSION} (with `horizon`), {RESCALED_COMMIT_FORMAT} from a rescale on,"
        f" {INSTANT_KEYS_COMMIT_FORMAT} keyed by a TIMESTAMP",
        tuple(COMMIT_FORMATS_READ),
    ),
    StoredFormat(
        "deltas `state/<op>/<p>/<v>_<uid>.delta`", f"{DELTA_FORMAT_VERSION}", (DELTA_FORMAT_VERSION,)
    ),
    StoredFormat(
        "snapshot indexes `.snapshot` (`schemaVersion`)",
        f"{SCHEMA_VERSION}",
        tuple(sorted(SUPPORTED_SCHEMA_VERSIONS)),
    ),
    StoredFormat(
        "accepted losses `accepted-loss/<v>_<uid>.json`",
        f"{ACCEPTANCE_FORMAT_VERSION}",
        tuple(ACCEPTANCE_FORMATS_READ),
    ),
    StoredFormat(
        f"backup repository marker `{REPOSITORY_MARKER}`",
        f"{REPOSITORY_FORMAT_VERSION}",
        (REPOSITORY_FORMAT_VERSION,),
    ),
    StoredFormat(
        "backup heads `heads/<n>.json`", f"{HEAD_FORMAT_VERSION} (with `horizon`)", tuple(HEAD_FORMATS_READ)
    ),
)
"""Every stored object that carries a format version, in the README's order."""

HEADER = ("object", "version written", "versions read")


def markdown_table() -> str:
    """The README's "Stored formats" table (Markdown, one row per :data:`STORED_FORMATS` entry)."""
    lines = ["| " + " | ".join(row) + " |" for row in (HEADER, *(f.cells() for f in STORED_FORMATS))]
    lines.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(lines) + "\n"


def plain_lines() -> list[str]:
    """The same table for a terminal: one line per object, without Markdown."""
    out = []
    for stored in STORED_FORMATS:
        what, written, read = (cell.replace("`", "") for cell in stored.cells())
        out.append(f"{what}: writes {written}; reads {read}")
    return out


__all__ = ["STORED_FORMATS", "StoredFormat", "markdown_table", "plain_lines"]
