"""``blobstate lineage | verify``: inspect and check a query checkpoint's versions, uids and snapshots.

(``blobstate gc`` lives in :mod:`blobstate.cli.gc_cmd`.)
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
UrlArgument = Annotated[
    str, typer.Argument(help="Query checkpoint: a path, file://, memory:// or s3:// URL.")
]


def _version_row(store: Any, history: Any, version: int, uid: str) -> dict[str, Any]:
    from blobstate.blobstore import BlobNotFoundError
    from blobstate.ids import CheckpointId
    from blobstate.layout import delta_name, snapshot_name
    from blobstate.lineage.delta import DeltaFormatError, read_delta_lineage
    from blobstate.snapshot import SnapshotError, read_snapshot_index
    from blobstate.state.chain import resolve_chain
    from blobstate.state.errors import StateLoadError

    operator, partition = history.operator, history.partition
    cid = CheckpointId(version, uid)
    row: dict[str, Any] = {"version": version, "uid": uid, "checkpoint_id": cid.name}
    dname = delta_name(operator, partition, cid)
    try:
        data = store.get(dname)
        row["delta_bytes"] = len(data)
        row["lineage"] = read_delta_lineage(data, name=dname)
    except BlobNotFoundError:
        row["delta_bytes"] = None
    except DeltaFormatError as error:
        row["delta_error"] = str(error)
    sname = snapshot_name(operator, partition, cid)
    row["snapshot"] = history.objects(cid).snapshot is not None
    if row["snapshot"]:
        try:
            index = read_snapshot_index(store, sname)
            row["snapshot_bytes"] = index.total_size
            row["snapshot_files"] = sum(1 for _ in index.iter_present_files())
        except BlobNotFoundError:
            row["snapshot_error"] = "missing"
        except SnapshotError as error:
            row["snapshot_error"] = str(error)
    try:
        chain = resolve_chain(store, operator, partition, cid, history=history, cached=True)
        row["restore_from"] = "empty" if chain.base is None else f"{chain.base.name}.snapshot"
        row["deltas_to_replay"] = len(chain.deltas)
    except StateLoadError as error:
        row["restore_error"] = str(error)
    return row


def collect_lineage(
    store: Any, *, partition: int | None = None, operator: str | None = None, limit: int = 20
) -> dict[str, Any]:
    """Committed versions (newest first, at most ``limit``) of every partition, with uids and sizes."""
    from blobstate.lineage.commitlog import CommitLog
    from blobstate.state.history import CommitCache, PartitionHistory

    log_ = CommitLog(store)
    latest = log_.latest_version()
    out: dict[str, Any] = {"latest": latest, "partitions": []}
    if latest is None or latest < 1:
        return out
    newest = log_.read_commit(latest)
    cache = CommitCache(log_, {latest: newest})
    for op, parts in sorted(newest.checkpoints.items()):
        if operator is not None and op != operator:
            continue
        for p in sorted(int(k) for k in parts):
            if partition is not None and p != partition:
                continue
            history = PartitionHistory(cache, op, p)
            history.prefetch(range(max(1, latest - limit + 1), latest))
            rows = []
            for version in range(latest, max(0, latest - limit), -1):
                uid = history.uid(version)
                if uid is None:
                    break
                row = _version_row(store, history, version, uid)
                rows.append(row)
                if version < newest.retained_from and row.get("delta_bytes") is None:
                    row["cleaned_up"] = True
                    break
            out["partitions"].append({"operator": op, "partition": p, "versions": rows})
    return out


def lineage(
    url: UrlArgument,
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Only this partition.")] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Only this operator.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many newest versions.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """Show committed versions with their uids, which have snapshots, and sizes."""
    from blobstate.blobstore import open_blob_store

    with open_blob_store(url) as store:
        result = collect_lineage(store, partition=partition, operator=operator, limit=limit)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    if not result["latest"]:
        typer.echo("no committed versions")
        return
    typer.echo(f"newest committed version: {result['latest']}")
    for part in result["partitions"]:
        typer.echo(f"operator {part['operator']} partition {part['partition']}:")
        for row in part["versions"]:
            if row.get("cleaned_up"):
                typer.echo(f"  {row['checkpoint_id']:<44} (cleaned up by retention)")
                continue
            delta = "-" if row.get("delta_bytes") is None else f"{row['delta_bytes']:,} B"
            snap = f"snapshot {row['snapshot_bytes']:,} B" if row.get("snapshot_bytes") is not None else ""
            restore = row.get("restore_error") or (
                f"restore: {row['restore_from']} + {row['deltas_to_replay']} deltas"
            )
            typer.echo(f"  {row['checkpoint_id']:<44} delta {delta:>14}  {snap:<24} {restore}")


def verify(
    url: UrlArgument,
    checksums: Annotated[
        bool, typer.Option("--checksums", help="Also read every blob and check its CRC-32.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Prove every retained version of every partition is restorable; exit 1 naming what is wrong.

    Deltas and snapshot indexes are read and checked against their commits; blobs are checked for
    presence and size (read and checksummed with --checksums). The output says what was not read.
    """
    from blobstate.blobstore import open_blob_store
    from blobstate.snapshot.repository import is_backup_repository
    from blobstate.state.verify import verify as run_verify

    with open_blob_store(url) as store:
        if is_backup_repository(store):
            _verify_repository(store, url, checksums, as_json)
            return
        report = run_verify(store, checksums=checksums)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "problems": [{**p.__dict__, "text": str(p)} for p in report.problems],
                    "checked": report.summary(),
                },
                indent=2,
            )
        )
    elif report.problems:
        for problem in report.problems:
            typer.echo(f"problem: {problem}", err=True)
        typer.echo(f"{len(report.problems)} problem(s) found in {url}", err=True)
    else:
        for line in report.summary():
            typer.echo(line)
        if report.latest_version:
            typer.echo("ok: every retained version is restorable")
    if report.problems:
        raise typer.Exit(1)


def _verify_repository(store: Any, url: str, checksums: bool, as_json: bool) -> None:
    from blobstate.snapshot.repository import verify_repository

    result = verify_repository(store, checksums=checksums)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": not result.problems,
                    "problems": [{**p.__dict__, "text": str(p)} for p in result.problems],
                    "snapshot": result.snapshot,
                    "heads": result.heads,
                    "blobs": result.blobs,
                    "checksums": result.checksums,
                },
                indent=2,
            )
        )
    elif result.problems:
        for problem in result.problems:
            typer.echo(f"problem: {problem}", err=True)
        typer.echo(f"{len(result.problems)} problem(s) found in {url}", err=True)
    else:
        how = (
            "read and checked their CRC-32"
            if result.checksums
            else ("checked presence and size without reading them (--checksums reads them)")
        )
        typer.echo(
            f"backup repository: read {result.heads} head records and the newest index "
            f"{result.snapshot}; {result.blobs} blobs: {how}"
        )
        typer.echo("ok: the newest snapshot is restorable")
    if result.problems:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``lineage`` and ``verify`` to the CLI."""
    app.command()(lineage)
    app.command()(verify)
