"""``inspect`` and ``restore`` on a query checkpoint (``metadata.json`` + ``commits/``): one partition's
state at a committed version (:mod:`blobstate.reader.partition`). ``backup_cmds`` dispatches here when
the URL holds a query checkpoint rather than a backup repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from blobstate.blobstore.redact import redact
from blobstate.reader import StateReadError


def is_query_checkpoint(url: str) -> bool:
    """Whether ``url`` holds a query checkpoint (and not a backup repository)."""
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.reader.checkpoint import is_query_checkpoint as has_metadata
    from blobstate.snapshot.repository import is_backup_repository

    with open_existing_blob_store(url) as store:
        return has_metadata(store) and not is_backup_repository(store)


def _need_partition(url: str, partition: int | None) -> int:
    if partition is None:
        raise StateReadError(f"{redact(url)} is a query checkpoint: choose a partition with --partition P")
    return partition


def _warn(info: dict[str, Any]) -> None:
    """The first lines, on stderr: the checkpoint's newest commits were lost, or its log has holes (the
    version shown as the newest then is not)."""
    for line in info.get("warnings", ()):
        typer.echo(f"warning: {redact(line)}", err=True)


def _header(info: dict[str, Any]) -> str:
    """The first line: the checkpoint, operator, partition, version and the batch its commit records."""
    from blobstate.cli.phrases import state_phrase

    span = f"{info['retained_from']}..{info['latest']}"
    holds = state_phrase(info["batch_id"], rescale=info["rescale"])
    return (
        f"query checkpoint {redact(info['url'])}  operator {info['operator']}  partition {info['partition']}"
        f"  version {info['version']}, {holds}"
        f" (uid {info['uid']}; retained versions {span})"
    )


def _loaded(load: dict[str, Any]) -> str:
    from blobstate.cli.phrases import restore_phrase

    base = f"{load['base_kind']} {load['base']}" if load["base"] else None
    return (
        f"loaded {restore_phrase(base, load['deltas_replayed'])}:"
        f" {load['bytes_downloaded']:,} bytes downloaded in {load['seconds']} s"
    )


def inspect_checkpoint(
    url: str, partition: int | None, version: int | None, operator: str | None, sample: int, as_json: bool
) -> None:
    """Print the partition's state variables (kind, schema, keys, rows, a sample) and its timers."""
    from blobstate.cli.progress import shown, store_activity
    from blobstate.reader.partition import inspect_partition

    chosen = _need_partition(url, partition)
    with store_activity(f"inspect: loading partition {chosen}", shown(as_json)):
        info = inspect_partition(url, chosen, version=version, operator=operator, sample=sample)
    _warn(info)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    typer.echo(_header(info))
    typer.echo(f"key columns: {', '.join(info['key_columns'])}")
    typer.echo(_loaded(info["load"]))
    if not info["state_variables"] and not info["adjunct_stores"]:
        typer.echo("no state variables")
    for var in info["state_variables"]:
        schema = var["schema"]
        if var["user_key_schema"] is not None:
            schema = f"{var['user_key_schema']} -> {schema}"
        ttl = ", with TTL" if var["ttl"] else ""
        typer.echo(
            f"{var['name']}: {var['kind']} state {schema}{ttl}: {var['keys']} keys, {var['rows']} rows"
        )
        for row in var["sample"]:
            typer.echo(f"    {json.dumps(row)}")
    for adjunct in info["adjunct_stores"]:
        typer.echo(
            f"adjunct store {adjunct['name']} ({adjunct['mode']}, column family $adjunct:{adjunct['name']}):"
            f" {adjunct['keys']} keys (values are not decoded: their schema is the query's)"
        )
        for key in adjunct["sample_keys"]:
            typer.echo(f"    {json.dumps(key)}")
    held = info["held_main_rows"]
    if held:
        versions = ", ".join(str(h["version"]) for h in held)
        typer.echo(
            f"main rows held back until a bootstrap side stream is loaded (column family $adjunct-deferred):"
            f" {sum(h['rows'] for h in held)} rows of the batches of versions {versions}"
        )
    timers = info["timers"]
    typer.echo(f"timers: {timers['rows']} on {timers['keys']} keys")
    for row in timers["sample"]:
        typer.echo(f"    {json.dumps(row)}")


def restore_checkpoint(
    url: str, directory: Path, partition: int | None, version: int | None, operator: str | None, as_json: bool
) -> None:
    """Materialise the partition's RocksDB at the version in ``directory`` (empty or absent)."""
    from blobstate.cli.progress import shown, store_activity
    from blobstate.reader.partition import restore_partition

    chosen = _need_partition(url, partition)
    with store_activity(f"restore: partition {chosen}", shown(as_json)):
        info = restore_partition(url, directory, chosen, version=version, operator=operator)
    _warn(info)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    typer.echo(_header(info))
    typer.echo(f"restored into {info['directory']}; {_loaded(info['load'])}")
