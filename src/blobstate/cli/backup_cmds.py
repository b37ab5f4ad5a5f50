"""``blobstate backup | restore | inspect``: a standalone backup repository of one directory.

A standalone repository uses the layout of one partition: ``<n>_<uid>.snapshot`` index objects at its
root plus ``blobs/``. Each backup is incremental against the newest snapshot and, once its index is
written, runs the post-commit cleanup (the previous index and the blobs only it referenced go).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

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
    from blobstate.ids import CheckpointId, new_uid
    from blobstate.snapshot import backup_directory, latest_snapshot, post_commit_cleanup

    if not directory.is_dir():
        raise _fail(f"{directory} is not a directory")
    with open_blob_store(url) as store:
        newest = latest_snapshot(store)
        previous_name, previous = newest if newest else (None, None)
        if newest:
            post_commit_cleanup(store, previous_name, previous)  # finish a backup cut off part-way
        number = CheckpointId.parse(previous_name.removesuffix(".snapshot")).version + 1 if newest else 1
        cid = CheckpointId(number, new_uid())
        with _progress("backup", _tree_size(directory), not as_json) as progress:
            result = backup_directory(
                store,
                directory,
                index_name=f"{cid.name}.snapshot",
                blob_prefix="blobs/",
                previous=previous,
                previous_name=previous_name,
                checkpoint_id=cid.name,
                metadata={"source": str(directory.resolve())},
                progress=progress,
            )
        post_commit_cleanup(store, result.index_name, result.index)
    stats = asdict(result.stats)
    stats["snapshot"] = result.index_name
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        typer.echo(
            f"snapshot {result.index_name}: uploaded {stats['files_uploaded']} files"
            f" ({stats['bytes_uploaded']:,} bytes), reused {stats['files_retained']} files"
            f" ({stats['bytes_retained']:,} bytes)"
        )


def _chosen_snapshot(store: Any, url: str, snapshot: str | None) -> tuple[str, Any]:
    """The named snapshot, or the newest one; a clear error when the repository has none."""
    from blobstate.snapshot import latest_snapshot, read_snapshot_index

    if snapshot is not None:
        return snapshot, read_snapshot_index(store, snapshot)
    newest = latest_snapshot(store)
    if newest is None:
        raise _fail(f"no snapshot in {url}")
    return newest


def restore(
    url: Annotated[str, typer.Argument(help="Backup repository URL.")],
    directory: Annotated[Path, typer.Argument(help="Target directory (made identical to the snapshot).")],
    snapshot: Annotated[str | None, typer.Option(help="Snapshot name (default: the newest).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Restore the newest snapshot (or --snapshot NAME) at URL into DIRECTORY."""
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot import restore_directory

    with open_blob_store(url) as store:
        name, index = _chosen_snapshot(store, url, snapshot)
        with _progress("restore", index.total_size, not as_json) as progress:
            stats = restore_directory(store, index, directory, progress=progress)
    result = asdict(stats)
    result["snapshot"] = name
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(
            f"restored {name}: downloaded {result['files_downloaded']} files"
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

    with open_blob_store(url) as store:
        name, index = _chosen_snapshot(store, url, snapshot)
    if as_json:
        typer.echo(json.dumps({"snapshot": name, "index": json.loads(index.to_json())}, indent=2))
        return
    typer.echo(f"snapshot {name}  checkpoint {index.checkpoint_id}  created {index.created_time_ms} ms")
    if index.prev_snapshot_index:
        typer.echo(f"previous {index.prev_snapshot_index}")
    for path, file in index.iter_present_files():
        typer.echo(f"  {path:<40} {file.metadata.size:>14,} bytes  {len(file.blobs)} blob(s)")


def register(app: typer.Typer) -> None:
    """Add backup, restore and inspect to the CLI."""
    for command in (backup, restore, inspect):
        app.command()(command)
