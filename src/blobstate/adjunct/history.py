"""Re-read a side stream's history up to the offset Spark recorded (the reload of a re-created store).

A side stream joins the main query, so Spark will not deliver its past rows again. To rebuild a store
(the recovery decision table's "re-create; reload its history", docs/DESIGN.md) blobstate reads them
itself, exactly up to the recorded offset: for a file source, the files its log in Spark's checkpoint
(``sources/<i>/``) lists for the batches up to that offset, read with the source's own format, schema and
options. Other sources cannot be re-read this way: the start fails with a message naming the adjunct and
the source.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blobstate.adjunct.spec import AdjunctError
from blobstate.batch.jvm import SourceLeaf

FILE_SOURCE_OPTIONS_DROPPED = {
    "path",
    "maxfilespertrigger",
    "maxbytespertrigger",
    "latestfirst",
    "maxfileage",
}
"""Options of a streaming file source that mean nothing (or something else) to a batch read."""


@dataclass(frozen=True)
class FileSource:
    """A side stream that is a plain file source, possibly with some of its columns selected."""

    format: str
    options: dict[str, str]
    schema_json: str | None
    columns: tuple[str, ...]


def file_source_of(name: str, source: SourceLeaf | None, columns: Sequence[str]) -> FileSource:
    """The file source under side stream ``columns`` of adjunct ``name``, from the streaming relation the
    stream reads when its plan is only that relation with at most a selection of its columns on top
    (``JvmSeam.plain_source``; None: another plan); AdjunctError when it is not a file source."""
    if source is None or not is_file_relation(source):
        raise AdjunctError(
            f"adjunct {name!r}: its store must be rebuilt from the side stream's history, which blobstate"
            " can read again only for a file source read as it is (spark.readStream...load(path), at most"
            " selecting columns; move computed columns into transform=); keep the store persistent without"
            " max_age_seconds, or start on a new checkpoint"
        )
    return FileSource(
        format=str(source.format),
        options={k: v for k, v in source.options.items() if k.lower() not in FILE_SOURCE_OPTIONS_DROPPED},
        schema_json=source.schema_json,
        columns=tuple(columns),
    )


def is_file_relation(leaf: SourceLeaf) -> bool:
    """Whether a ``StreamingRelation`` of an analyzed plan reads a file source."""
    name = str(leaf.format).lower()
    return name in {"parquet", "json", "csv", "orc", "text", "avro"} or name.endswith("fileformat")


def files_up_to(log_files: Mapping[str, bytes], last_batch: int) -> list[str]:
    """The files a file source's log (``sources/<i>/`` entries by name) lists for batches up to
    ``last_batch``, in the order the source read them (by batch, then as listed)."""
    return files_between(log_files, -1, last_batch)


def files_between(log_files: Mapping[str, bytes], after_batch: int, last_batch: int) -> list[str]:
    """The files a file source's log lists for the batches after ``after_batch`` up to ``last_batch``, in
    the order the source read them (by batch, then as listed)."""
    entries: dict[str, tuple[int, int]] = {}
    for name, data in log_files.items():
        lines = data.decode("utf-8").splitlines()
        if not lines or lines[0] != "v1":
            raise AdjunctError(f"file source log entry {name} is not in Spark's v1 format")
        for position, line in enumerate(lines[1:]):
            if not line.strip():
                continue
            entry = json.loads(line)
            batch = int(entry["batchId"])
            if after_batch < batch <= last_batch:
                entries.setdefault(str(entry["path"]), (batch, position))
    return sorted(entries, key=lambda path: entries[path])


def history_frame(spark: Any, source: FileSource, files: list[str]) -> Any:
    """The rows of ``files`` with the side stream's columns, ``__rank`` (the file's place in the source's
    read order) and ``__row`` (increasing with the row's position in its file)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    reader = spark.read.format(source.format).options(**source.options)
    if source.schema_json is not None:
        reader = reader.schema(StructType.fromJson(json.loads(source.schema_json)))
    frame = reader.load(files).select(
        *[F.col(f"`{c}`") for c in source.columns], F.input_file_name().alias("__file")
    )
    ranks = spark.createDataFrame([(path, i) for i, path in enumerate(files)], "__file STRING, __rank BIGINT")
    joined = frame.join(F.broadcast(ranks), "__file")
    row = F.monotonically_increasing_id().alias("__row")
    return joined.select(*[F.col(f"`{c}`") for c in source.columns], F.col("__rank"), row)


def is_rate_limited(leaves: Sequence[SourceLeaf]) -> bool:
    """Whether a source among a side stream's plan ``leaves`` (``JvmSeam.streaming_leaves``) takes only
    part of its backlog per batch (a per-trigger limit such as ``maxFilesPerTrigger`` or
    ``maxOffsetsPerTrigger``): then the first batch does not hold the whole side table, and a bootstrap
    waits for a batch that finds no new side rows.

    A generated source (``rate``, ``rate-micro-batch``) is not: it has no backlog, only the rows due at
    each trigger, and it never runs out of new rows, so waiting for it would hold main rows forever.
    """
    for leaf in leaves:
        if leaf.node not in ("StreamingRelation", "StreamingRelationV2"):
            continue
        if any("pertrigger" in k.lower() for k in leaf.options):
            return True
    return False
