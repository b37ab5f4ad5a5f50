"""``blobstate backup | restore | inspect``: a standalone backup repository of one directory.

``restore`` and ``inspect`` also take a query checkpoint's URL: then they work on one partition's state
at a committed version (``--partition``, ``--version``; :mod:`blobstate.cli.state_cmds`).

The repository (:mod:`blobstate.snapshot.repository`) holds ``heads/<n>.json`` (the head log that fences
concurrent backups), ``<n>_<uid>.snapshot`` indexes, the guard that stops builds from before the head
log, and ``data/`` (``blobs/`` in repositories written before the guard). Each backup is incremental against
the newest committed snapshot and commits by creating its head; only then does it run the post-commit
cleanup. Restore never deletes anything it was not asked to (``--delete-extra``) and refuses a target
that contains the repository or lies inside it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.progress import byte_bar, shown
from blobstate.cli.urls import URL_FORMS

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PartitionOption = Annotated[
    int | None, typer.Option("--partition", help="Query checkpoint: the partition to read (required there).")
]
VersionOption = Annotated[
    int | None, typer.Option("--version", help="Query checkpoint: a retained version (default: the latest).")
]
OperatorOption = Annotated[
    str | None, typer.Option("--operator", help="Query checkpoint: the operator (default: the only one).")
]


def _checkpoint_url(url: str, *, partition: int | None, version: int | None, operator: str | None) -> bool:
    """Whether ``url`` is a query checkpoint; the checkpoint-only options are refused on a repository."""
    from blobstate.cli.state_cmds import is_query_checkpoint
    from blobstate.reader import StateReadError

    if is_query_checkpoint(url):
        return True
    given = [
        f
        for f, v in (("--partition", partition), ("--version", version), ("--operator", operator))
        if v is not None
    ]
    if given:
        raise StateReadError(
            f"{redact(url)} is not a query checkpoint (no metadata.json): {', '.join(given)} apply only to"
            " query checkpoints; a backup repository takes --snapshot"
        )
    return False


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def backup(
    directory: Annotated[Path, typer.Argument(help="Local directory to back up.")],
    url: Annotated[str, typer.Argument(help=f"Backup repository: {URL_FORMS}.")],
    as_json: JsonOption = False,
) -> None:
    """Back up DIRECTORY to URL, uploading only what changed since the newest snapshot there."""
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot.repository import backup_to_repository

    if not directory.is_dir():
        raise _fail(f"{directory} is not a directory")
    with (
        open_blob_store(url) as store,
        byte_bar("backup", _tree_size(directory), shown(as_json)) as progress,
    ):
        done = backup_to_repository(
            store, directory, metadata={"source": str(directory.resolve())}, progress=progress
        )
    result = done.result
    if done.warning is not None:  # committed all the same: exit 0
        typer.echo(f"warning: {redact(done.warning)}", err=True)
    stats = asdict(result.stats)
    stats["snapshot"] = result.index_name
    stats["version"] = done.version
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        typer.echo(
            f"snapshot {result.index_name} (backup {done.version}): uploaded {stats['files_uploaded']} files"
            f" ({stats['bytes_uploaded']:,} bytes), reused {stats['files_retained']} files"
            f" ({stats['bytes_retained']:,} bytes)"
        )


def restore(
    url: Annotated[str, typer.Argument(help=f"Backup repository or query checkpoint: {URL_FORMS}.")],
    directory: Annotated[
        Path,
        typer.Argument(
            help="Target directory (made identical to the snapshot; for a query checkpoint: empty or absent)."
        ),
    ],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot name (default: the newest).")] = None,
    delete_extra: Annotated[
        bool,
        typer.Option(
            "--delete-extra",
            help="Delete files and directories in DIRECTORY that the snapshot does not hold "
            "(without it, such a target is refused and left untouched).",
        ),
    ] = False,
    partition: PartitionOption = None,
    version: VersionOption = None,
    operator: OperatorOption = None,
    as_json: JsonOption = False,
) -> None:
    """Restore the newest snapshot (or --snapshot NAME) at URL into DIRECTORY.

    For a query checkpoint: materialise one partition's RocksDB at a version in DIRECTORY, for debugging.
    """
    if _checkpoint_url(url, partition=partition, version=version, operator=operator):
        from blobstate.cli.state_cmds import restore_checkpoint
        from blobstate.reader import StateReadError

        if snapshot is not None or delete_extra:
            raise StateReadError(
                f"{redact(url)} is a query checkpoint: --snapshot and --delete-extra apply to backups"
            )
        restore_checkpoint(url, directory, partition, version, operator, as_json)
        return
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.snapshot.repository import read_snapshot, restore_repository
    from blobstate.snapshot.restore import RestoreTargetError, check_restore_target

    with open_existing_blob_store(url) as store:
        check_restore_target(store, directory)
        chosen = read_snapshot(store, snapshot)
        try:
            with byte_bar("restore", chosen.index.total_size, shown(as_json)) as progress:
                chosen, stats = restore_repository(
                    store, directory, chosen, delete_extra=delete_extra, progress=progress
                )
        except RestoreTargetError as error:
            if not error.extras:
                raise
            raise RestoreTargetError(f"{error} (--delete-extra)", extras=error.extras) from None
    result = asdict(stats)
    result["snapshot"] = chosen.name
    result["version"] = chosen.version
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(
            f"restored {chosen.name}: downloaded {result['files_downloaded']} files"
            f" ({result['bytes_downloaded']:,} bytes), kept {result['files_reused']} matching files"
            f" ({result['bytes_reused']:,} bytes), deleted {result['files_deleted']} extra files"
        )


def inspect(
    url: Annotated[str, typer.Argument(help=f"Backup repository or query checkpoint: {URL_FORMS}.")],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot name (default: the newest).")] = None,
    partition: PartitionOption = None,
    version: VersionOption = None,
    operator: OperatorOption = None,
    sample: Annotated[
        int, typer.Option("--sample", min=0, help="Query checkpoint: rows shown per state variable.")
    ] = 3,
    as_json: JsonOption = False,
) -> None:
    """Show a backup's snapshot index, or a query checkpoint's partition (--partition P).

    For a backup repository: a committed snapshot index, its files, sizes, checksums and blobs. For a
    query checkpoint: one partition's state variables and timers at a version, counted and sampled.
    """
    if _checkpoint_url(url, partition=partition, version=version, operator=operator):
        from blobstate.cli.state_cmds import inspect_checkpoint
        from blobstate.reader import StateReadError

        if snapshot is not None:
            raise StateReadError(
                f"{redact(url)} is a query checkpoint: --snapshot applies to backups; use --version"
            )
        inspect_checkpoint(url, partition, version, operator, sample, as_json)
        return
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.snapshot.repository import read_snapshot

    with open_existing_blob_store(url) as store:
        chosen = read_snapshot(store, snapshot)
    name, index = chosen.name, chosen.index
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "snapshot": name,
                    "version": chosen.version,
                    "verified_by_head": chosen.head is not None,
                    "index": json.loads(index.to_json()),
                },
                indent=2,
            )
        )
        return
    typer.echo(
        f"snapshot {name}  backup {chosen.version}  checkpoint {index.checkpoint_id}"
        f"  created {index.created_time_ms} ms"
    )
    if chosen.head is None:
        typer.echo("(no head log: a repository written by an older blobstate; index not verified)")
    if index.prev_snapshot_index:
        typer.echo(f"previous {index.prev_snapshot_index}")
    for path, file in index.iter_present_files():
        typer.echo(f"  {path:<40} {file.metadata.size:>14,} bytes  {len(file.blobs)} blob(s)")


def register(app: typer.Typer) -> None:
    """Add backup, restore and inspect to the CLI."""
    for command in (backup, restore, inspect):
        app.command()(command)
