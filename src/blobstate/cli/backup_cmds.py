"""``blobstate backup | restore | inspect``: a standalone backup repository of one directory.

The repository (:mod:`blobstate.snapshot.repository`) holds ``heads/<n>.json`` (the head log that fences
concurrent backups), ``<n>_<uid>.snapshot`` indexes and ``blobs/``. Each backup is incremental against
the newest committed snapshot and commits by creating its head; only then does it run the post-commit
cleanup. Restore never deletes anything it was not asked to (``--delete-extra``) and refuses a target
that contains the repository or lies inside it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@contextmanager
def _progress(description: str, total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A byte progress bar on a terminal; a no-op callback otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


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
    url: Annotated[str, typer.Argument(help="Backup repository: a path, file://, memory:// or s3:// URL.")],
    as_json: JsonOption = False,
) -> None:
    """Back up DIRECTORY to URL, uploading only what changed since the newest snapshot there."""
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot.repository import backup_to_repository

    if not directory.is_dir():
        raise _fail(f"{directory} is not a directory")
    with (
        open_blob_store(url) as store,
        _progress("backup", _tree_size(directory), not as_json) as progress,
    ):
        done = backup_to_repository(
            store, directory, metadata={"source": str(directory.resolve())}, progress=progress
        )
    result = done.result
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
    url: Annotated[str, typer.Argument(help="Backup repository URL.")],
    directory: Annotated[Path, typer.Argument(help="Target directory (made identical to the snapshot).")],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot name (default: the newest).")] = None,
    delete_extra: Annotated[
        bool,
        typer.Option(
            "--delete-extra",
            help="Delete files and directories in DIRECTORY that the snapshot does not hold "
            "(without it, such a target is refused and left untouched).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Restore the newest snapshot (or --snapshot NAME) at URL into DIRECTORY."""
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot.repository import read_snapshot, restore_repository
    from blobstate.snapshot.restore import RestoreTargetError, check_restore_target

    with open_blob_store(url) as store:
        check_restore_target(store, directory)
        chosen = read_snapshot(store, snapshot)
        try:
            with _progress("restore", chosen.index.total_size, not as_json) as progress:
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
    url: Annotated[str, typer.Argument(help="Backup repository URL.")],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot name (default: the newest).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Show a snapshot index: its files, sizes, checksums and blobs."""
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot.repository import read_snapshot

    with open_blob_store(url) as store:
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
