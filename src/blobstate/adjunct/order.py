"""The order a batch's side rows are applied in: the side source's own order.

A key updated twice in one micro-batch keeps the value of the later row, so the rows must be applied in
the order the source has them, the same way in the steady state and in a reload from history:

* a file source: by file in the order its log in Spark's checkpoint (``sources/<i>/``) lists them (the
  order the source read them: by modification time, or newest first with ``latestFirst``), then by
  position in the file. Spark packs a batch's files into read partitions largest first, so a row's
  place in the batch (``monotonically_increasing_id``) orders rows within a file only: each row carries
  its file (``input_file_name()``) and the driver gives the file's place in the log.
* any other source (rate, memory, Kafka, ...): the source's order within each read partition (a Kafka
  topic-partition's offsets), partitions in Spark's order; rows of different partitions have no order
  of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from blobstate.adjunct.spec import FILE_COLUMN, RANK_COLUMN
from blobstate.batch.jvm import SourceLeaf

log = logging.getLogger("blobstate")


def file_of_row(leaves: Sequence[SourceLeaf]) -> Any:
    """The column naming each row's file when a stream whose plan has ``leaves``
    (``JvmSeam.streaming_leaves``) reads a file source (null for other sources)."""
    from pyspark.sql import functions as F

    from blobstate.adjunct.history import is_file_relation

    files = any(n.node == "StreamingRelation" and is_file_relation(n) for n in leaves)
    if not files:
        return F.lit(None).cast("string")
    return F.nullif(F.input_file_name(), F.lit(""))


def file_key(path: str) -> tuple[str, str, str]:
    """A file's path as Spark's log and ``input_file_name()`` may spell it (``file:/a`` and ``file:///a``,
    escaped or not), reduced to one form."""
    parts = urlsplit(path)
    scheme = (parts.scheme or "file").lower()
    netloc = "" if scheme == "file" and parts.netloc in ("", "localhost") else parts.netloc
    return scheme, netloc, unquote(parts.path)


def ranked_by_file(table: pa.Table, files: Sequence[str]) -> pa.Table:
    """``table`` with the rank of each row that names its file set to the file's place in ``files`` (the
    batch's files in the source's order); rows without a file keep their rank. A file missing from
    ``files`` ranks after them, by path (and is logged: the source's log did not list it)."""
    if FILE_COLUMN not in table.column_names or not files:
        return table
    paths = table.column(FILE_COLUMN)
    seen = [p for p in pc.unique(paths).to_pylist() if p is not None]
    if not seen:
        return table
    places = {file_key(f): i for i, f in reversed(list(enumerate(files)))}
    unknown = sorted(p for p in seen if file_key(p) not in places)
    if unknown:
        log.warning(
            "side rows from %d file(s) the source's log does not list for this batch (%s): applied after"
            " its files",
            len(unknown),
            unknown[0],
        )
    extra = {p: len(files) + i for i, p in enumerate(unknown)}
    ranks = pa.array([places.get(file_key(p), extra.get(p)) for p in seen], pa.int64())
    index = pc.index_in(paths, value_set=pa.array(seen, pa.string()))
    rank = pc.coalesce(pc.take(ranks, index), table.column(RANK_COLUMN).cast(pa.int64()))
    position = table.column_names.index(RANK_COLUMN)
    return table.set_column(position, RANK_COLUMN, rank)


def batch_files(
    sources: Mapping[str, tuple[int, int]],
    offsets: Mapping[str, Any],
    before: Mapping[str, Any],
    list_dir: Callable[[str], list[str]],
    read: Callable[[str], bytes],
) -> dict[str, tuple[str, ...]]:
    """Each side stream's files in one batch, in the order its file source's log in Spark's checkpoint
    lists them; only side streams that read more than one file.

    ``sources``: each adjunct's sources in the offset log (first index, count); ``offsets`` and
    ``before``: each adjunct's offsets in this batch's and the previous batch's entry (a file source's is
    ``{"logOffset": n}``); ``list_dir`` and ``read`` list and read Spark's checkpoint by relative path.
    """
    from blobstate.adjunct.history import files_between

    out: dict[str, tuple[str, ...]] = {}
    for name, (first, count) in sources.items():
        files: list[str] = []
        for i in range(count):
            last = _log_offset(offsets.get(name), i)
            after = _log_offset(before.get(name), i)
            after = -1 if after is None else after
            if last is not None and last > after:
                log_dir = f"sources/{first + i}"
                names = _log_entries(list_dir(log_dir), after, last)
                files += files_between({n: read(f"{log_dir}/{n}") for n in names}, after, last)
        if len(files) > 1:
            out[name] = tuple(files)
    return out


def _log_entries(names: list[str], after: int, last: int) -> list[str]:
    """The names of a file source log's entries holding its batches after ``after`` up to ``last``: each
    batch's own entry, or the first compacted entry at or after it (which took it in)."""
    present = set(names)
    compacted = sorted(int(n[:-8]) for n in names if n.endswith(".compact") and n[:-8].isdigit())
    wanted: set[str] = set()
    for batch in range(after + 1, last + 1):
        if str(batch) in present:
            wanted.add(str(batch))
            continue
        later = [c for c in compacted if c >= batch]
        if later:
            wanted.add(f"{later[0]}.compact")
    return sorted(wanted)


def _log_offset(offsets: Any, index: int) -> int | None:
    """The ``logOffset`` of a side stream's ``index``-th source in an offset log entry, when it is a file
    source's (None: another source, or no offset)."""
    if not isinstance(offsets, list) or index >= len(offsets) or not isinstance(offsets[index], dict):
        return None
    value = offsets[index].get("logOffset")
    return value if isinstance(value, int) else None
