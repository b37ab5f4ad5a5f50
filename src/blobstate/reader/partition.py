"""One partition of a query checkpoint at a version, for the command line: what its state variables hold
(:func:`inspect_partition`) and its RocksDB materialised in a directory (:func:`restore_partition`)."""

from __future__ import annotations

import datetime as _dt
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from blobstate.adjunct.deferred import held_rows
from blobstate.blobstore import open_blob_store
from blobstate.encoding import codec
from blobstate.encoding.codec import Key
from blobstate.encoding.layout import ADJUNCT_CF_PREFIX
from blobstate.reader.checkpoint import (
    CheckpointVersion,
    choose_operator,
    choose_partitions,
    open_version,
    restore_into,
)
from blobstate.reader.variables import StateReadError, declarations, entries, timers


def jsonable(value: Any) -> Any:
    """A decoded key or value as plain JSON: tuples as lists, bytes as hex, times as ISO 8601 text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, (Decimal, _dt.timedelta)):
        return str(value)
    return repr(value)


def _one_partition(checkpoint: CheckpointVersion, partition: int) -> int:
    (p,) = choose_partitions(checkpoint, partition)
    return p


def _where(checkpoint: CheckpointVersion, operator: str, partition: int) -> dict[str, Any]:
    return {
        "url": checkpoint.url,
        "operator": operator,
        "partition": partition,
        "version": checkpoint.version,
        "batch_id": checkpoint.commit.batch_id,
        "rescale": checkpoint.commit.rescaled,
        "uid": checkpoint.commit.checkpoints[operator][partition],
        "retained_from": checkpoint.retained_from,
        "latest": checkpoint.latest,
    }


def _loss_warnings(store: Any) -> list[str]:
    """What a reader says first: the checkpoint's newest commits were lost, or its log has holes
    (:meth:`blobstate.state.lost.LossScan.warnings`); empty when neither."""
    from blobstate.state.lost import scan_for_loss

    return scan_for_loss(store).warnings()


def _load(report: Any) -> dict[str, Any]:
    return {
        "base": report.base or None,
        "base_kind": report.base_kind,
        "deltas_replayed": report.deltas_replayed,
        "bytes_downloaded": report.bytes_downloaded,
        "seconds": round(report.seconds, 3),
    }


def adjunct_stores(
    rocks: Any, checkpoint: CheckpointVersion, operator: str, arity: int, sample: int
) -> list[dict[str, Any]]:
    """The adjunct stores in the partition's store (column families ``$adjunct:<name>``): name, mode, keys
    and the first ``sample`` keys. Values are not decoded: their schema is the query's declaration and is
    not recorded in the checkpoint."""
    spec = checkpoint.metadata.operators.get(operator, {})
    modes = dict(spec.get("adjuncts") or {})
    found = []
    for cf in rocks.column_families():
        if not cf.startswith(ADJUNCT_CF_PREFIX):
            continue
        name = cf[len(ADJUNCT_CF_PREFIX) :]
        keys = 0
        shown: list[Any] = []
        for kb, _ in rocks.items(cf):
            keys += 1
            if len(shown) < sample:
                shown.append(jsonable(codec.decode_key(bytes(kb), arity)[0]))
        mode = modes.get(name) or ("broadcast" if "partitions" in spec else "partitioned")
        found.append({"name": name, "mode": mode, "keys": keys, "sample_keys": shown})
    return found


def inspect_partition(
    url: str, partition: int, *, version: int | None = None, operator: str | None = None, sample: int = 3
) -> dict[str, Any]:
    """Each state variable of the partition at ``version`` (default: the latest) with its kind, schema,
    TTL, number of grouping keys and of rows (list elements, map entries), and its first ``sample`` rows;
    each adjunct store it holds with its keys (:func:`adjunct_stores`); the main rows held back for a
    loading side stream (``held_rows``); the same for the registered timers; ``warnings``: lost newest
    commits or holes in the commit log (:func:`_loss_warnings`). Everything as plain JSON."""
    with open_blob_store(url) as store:
        checkpoint = open_version(store, version)
        op = choose_operator(checkpoint, operator)
        p = _one_partition(checkpoint, partition)
        warnings = _loss_warnings(store)
        arity = len(checkpoint.key_columns(op))
        scratch = Path(tempfile.mkdtemp(prefix=f"blobstate-read-{p}-"))
        try:
            loaded = restore_into(store, checkpoint, op, p, scratch / "db", scratch / "load")
            rocks = loaded.store
            try:
                variables = []
                declared = declarations(rocks, where=checkpoint.describe(op, p))
                for var in sorted(declared.values(), key=lambda v: v.name):
                    keys: set[Key] = set()
                    rows = 0
                    shown: list[Any] = []
                    for entry in entries(rocks, var, arity):
                        keys.add(entry[0])
                        rows += 1
                        if len(shown) < sample:
                            shown.append(jsonable(entry if var.ttl else entry[:-1]))
                    variables.append(
                        {
                            "name": var.name,
                            "kind": var.kind,
                            "schema": var.value_type().simpleString(),
                            "user_key_schema": None if var.user_key_schema is None
                            else var.user_key_schema.simpleString(),
                            "ttl": var.ttl,
                            "keys": len(keys),
                            "rows": rows,
                            "sample": shown,
                        }
                    )  # fmt: skip
                timer_rows = list(timers(rocks, arity))
                adjuncts = adjunct_stores(rocks, checkpoint, op, arity, sample)
                held = held_rows(rocks)
            finally:
                rocks.close()
            report = loaded.report
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return {
        **_where(checkpoint, op, p),
        "warnings": warnings,
        "key_columns": checkpoint.key_columns(op),
        "load": _load(report),
        "state_variables": variables,
        "adjunct_stores": adjuncts,
        "held_main_rows": [{"version": v, "rows": n} for v, n in held],
        "timers": {
            "keys": len({k for k, _ in timer_rows}),
            "rows": len(timer_rows),
            "sample": [jsonable(t) for t in timer_rows[:sample]],
        },
    }


def restore_partition(
    url: str, directory: Path, partition: int, *, version: int | None = None, operator: str | None = None
) -> dict[str, Any]:
    """Materialise the partition's RocksDB at ``version`` (default: the latest) in ``directory``, which must
    be empty or absent; it then holds a RocksDB database (open it with ``rocksdict``, read-only) and a
    ``CHECKPOINT-ID`` naming ``<version>_<uid>``. Returns where it came from and how it was loaded, and
    ``warnings`` (lost newest commits, holes in the commit log).

    A ``directory`` inside the checkpoint's own local directory (or holding it) is refused first,
    :class:`~blobstate.snapshot.restore.RestoreTargetError` saying so: nothing is written into the
    checkpoint."""
    from blobstate.snapshot.restore import check_restore_target
    from blobstate.state.localdirs import mark_clean

    directory = Path(directory)
    with open_blob_store(url) as store:
        check_restore_target(store, directory, what="query checkpoint", after=" (nothing was changed)")
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            raise StateReadError(
                f"{directory} is not an empty directory: restore into a new or empty one"
                " (nothing was changed)"
            )
        checkpoint = open_version(store, version)
        op = choose_operator(checkpoint, operator)
        p = _one_partition(checkpoint, partition)
        warnings = _loss_warnings(store)
        scratch = Path(tempfile.mkdtemp(prefix=f"blobstate-read-{p}-"))
        try:
            loaded = restore_into(store, checkpoint, op, p, directory, scratch)
            loaded.store.close()
            mark_clean(directory, loaded.info)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return {
        **_where(checkpoint, op, p),
        "warnings": warnings,
        "directory": str(directory),
        "load": _load(loaded.report),
    }
