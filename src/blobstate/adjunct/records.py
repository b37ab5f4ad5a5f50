"""Apply a batch's side rows to an adjunct store: key and value extraction, the transform, deletes.

The same function runs for a partitioned store (in the partition's task, before the batch's main rows)
and a broadcast store (in the driver, before the stage), in bootstrap and in steady state, so a side
row means the same everywhere: a null key is skipped, a null value deletes the key, and a row that
cannot be converted follows the adjunct's one ``on_bad_record`` policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from blobstate.adjunct.order import ranked_by_file
from blobstate.adjunct.spec import (
    COLUMN_PREFIX,
    ORDER_COLUMNS,
    AdjunctRecordError,
    AdjunctSpec,
    column_name,
)
from blobstate.encoding import codec
from blobstate.encoding.values import StateCodec, StateRow
from blobstate.state.interface import KeyValueStore


@dataclass
class ApplyStats:
    """What applying one batch's side rows of one adjunct did."""

    rows: int = 0
    upserts: int = 0
    deletes: int = 0
    null_keys: int = 0
    bad_records: int = 0

    def to_json(self) -> dict[str, int]:
        """A JSON-ready dict."""
        return asdict(self)

    def add(self, other: ApplyStats) -> None:
        """Add ``other``'s counts to these."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


def _as_tuple(value: Any, field_names: list[str]) -> StateRow:
    if isinstance(value, dict):
        return tuple(value.get(n) for n in field_names)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def _values(spec: AdjunctSpec, table: pa.Table, names: list[str]) -> Iterable[Any]:
    """Each row's value to store (None: delete the key), or the exception converting it raised."""
    if spec.transform is None:
        columns = [table.column(column_name(spec.name, c)).to_pylist() for c in spec.value_columns]
        for value in zip(*columns, strict=True):
            yield None if all(v is None for v in value) else value
        return
    side = [column_name(spec.name, c) for c in spec.side_columns]
    transform = spec.transform
    for row in table.select(side).rename_columns(list(spec.side_columns)).to_pylist():
        try:
            value = transform(row)
            yield None if value is None else _as_tuple(value, names)
        except Exception as error:
            yield error


def apply_side_rows(store: KeyValueStore, spec: AdjunctSpec, table: pa.Table | None) -> ApplyStats:
    """Upsert or delete one key of ``spec``'s column family per row of ``table`` (in row order).

    ``table`` holds the adjunct's rows as they appear in the query's input (key columns under
    ``spec.key_in_union``, side columns under :func:`column_name`). Raises
    :class:`AdjunctRecordError` naming the adjunct, the key and the cause for a row that cannot be
    converted when the policy is ``fail``; with ``skip`` it is counted in ``bad_records``.
    """
    stats = ApplyStats()
    if table is None or table.num_rows == 0:
        return stats
    schema = spec.schema
    names = schema.names
    encode = StateCodec(f"adjunct {spec.name}", schema).encode
    encode_key = codec.encode_key
    cf = spec.column_family
    key_columns = [table.column(k).to_pylist() for k in spec.key_in_union]
    keys = [(k,) for k in key_columns[0]] if len(key_columns) == 1 else list(zip(*key_columns, strict=True))
    skip = spec.on_bad_record == "skip"
    put, delete = store.put, store.delete
    null_keys = upserts = deletes = bad = 0
    for key, value in zip(keys, _values(spec, table, names), strict=True):
        if None in key:
            null_keys += 1
            continue
        try:
            if isinstance(value, Exception):
                raise value
            kb = encode_key(key)
            if value is None:
                delete(cf, kb)
                deletes += 1
                continue
            data = encode(value, None)
        except Exception as error:
            if skip:
                bad += 1
                continue
            raise AdjunctRecordError(
                f"adjunct {spec.name!r}: the side row with key {key!r} cannot be stored"
                f" ({type(error).__name__}: {error}); use on_bad_record='skip' to skip such rows"
            ) from None
        put(cf, kb, data)
        upserts += 1
    stats.rows = table.num_rows
    stats.null_keys, stats.upserts, stats.deletes, stats.bad_records = null_keys, upserts, deletes, bad
    return stats


def split_side_rows(
    batches: Iterable[pa.RecordBatch],
    tag_column: str,
    side_names: Iterable[str],
    files: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[pa.RecordBatch], dict[str, pa.Table]]:
    """The main rows (tag null; the tag and side columns dropped) and each adjunct's rows in the order
    they are applied (``files``: an adjunct's files of the batch in its source's order, see
    :func:`in_order`)."""
    import pyarrow.compute as pc

    collected = [b for b in batches if b.num_rows]
    names = list(side_names)
    if not collected:
        return [], {}
    table = pa.Table.from_batches(collected)
    tag = table.column(tag_column)
    own = [c for c in table.column_names if c != tag_column and not c.startswith(COLUMN_PREFIX)]
    main = table.filter(pc.is_null(tag)).select(own)
    sides = {}
    for name in names:
        rows = table.filter(pc.fill_null(pc.equal(tag, name), False))
        if rows.num_rows:
            sides[name] = in_order(rows, (files or {}).get(name))
    return main.to_batches(), sides


def in_order(table: pa.Table, files: Sequence[str] | None = None) -> pa.Table:
    """Side rows in the order they are applied (Spark's shuffle does not keep it): a reloaded history
    first, then the batch's own rows; each by file in the source's order (``files``: the batch's files,
    when it read more than one), then by position in the file (``adjunct.order``)."""
    if table.num_rows < 2 or ORDER_COLUMNS[0] not in table.column_names:
        return table
    if files is not None and len(files) > 1:
        table = ranked_by_file(table, files)
    return table.sort_by([(c, "ascending") for c in ORDER_COLUMNS])
