"""``blobstate lineage | verify``: inspect and check a query checkpoint's versions, uids and snapshots.

(``blobstate gc`` lives in :mod:`blobstate.cli.gc_cmd`.)
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.urls import URL_FORMS
from blobstate.errors import StateError

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
UrlArgument = Annotated[str, typer.Argument(help=f"Query checkpoint: {URL_FORMS}.")]


def _version_row(
    store: Any, history: Any, version: int, uid: str, latest: int | None = None
) -> dict[str, Any]:
    from blobstate.blobstore import BlobNotFoundError
    from blobstate.ids import CheckpointId
    from blobstate.layout import delta_name, snapshot_name
    from blobstate.lineage.delta import DeltaFormatError, read_delta_lineage
    from blobstate.snapshot import SnapshotError, read_snapshot_index
    from blobstate.state.chain import resolve_chain
    from blobstate.state.errors import StateLoadError

    operator, partition = history.operator, history.partition
    cid = CheckpointId(version, uid)
    commit = history.commit(version)
    assert commit is not None  # the uid came from it
    row: dict[str, Any] = {
        "version": version,
        "batch_id": commit.batch_id,
        "rescale": commit.rescaled,
        "uid": uid,
        "checkpoint_id": cid.name,
    }
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
    found = history.snapshot_ref(cid, latest or version)
    row["snapshot"] = found is not None
    if found is not None and found[1] != version:
        row["snapshot_named_in"] = found[1]  # uploaded in the background, named by a later commit
    late = history.objects(cid).late_snapshot
    if late is not None:
        row["names_snapshot"] = late.checkpoint_name
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
        chain = resolve_chain(
            store, operator, partition, cid, history=history, cached=True, upto=latest or version
        )
        row["restore_from"] = "empty" if chain.base is None else f"{chain.base.name}.snapshot"
        row["deltas_to_replay"] = len(chain.deltas)
    except StateLoadError as error:
        row["restore_error"] = str(error)
    return row


def collect_lineage(
    store: Any,
    *,
    partition: int | None = None,
    operator: str | None = None,
    limit: int = 20,
    version: int | None = None,
) -> dict[str, Any]:
    """Committed versions (newest first, at most ``limit``) of every partition, with uids and sizes.

    With ``version`` the listing starts at that version instead of the newest one. ``batch_id`` and
    ``rescale`` are the newest commit's (its recorded batch; after a rescale no longer ``latest - 1``).
    A ``partition`` or ``operator`` that the layout of the listing's first version does not have is
    refused (:class:`PartitionNotFoundError`, naming the partitions it has), not listed as nothing.
    """
    from blobstate.lineage.commitlog import CommitLog
    from blobstate.state.history import CommitCache, PartitionHistory

    log_ = CommitLog(store)
    latest = log_.latest_version()
    out: dict[str, Any] = {"latest": latest, "partitions": []}
    if latest is None or latest < 1:
        return out
    newest = log_.read_commit(latest)
    out["batch_id"], out["rescale"] = newest.batch_id, newest.rescaled
    cache = CommitCache(log_, {latest: newest})
    top = latest if version is None else version
    # The partitions of the listing's first version; each listing stops where their layout starts (a
    # rescale): partition p before it is another partition.
    first = cache.commit(top) or newest
    _check_selection(store.url, first, top, latest, operator, partition)
    for op, parts in sorted(first.checkpoints.items()):
        if operator is not None and op != operator:
            continue
        for p in sorted(int(k) for k in parts):
            if partition is not None and p != partition:
                continue
            history = PartitionHistory(cache, op, p, layout_from=first.layout_from)
            history.prefetch(range(max(1, top - limit + 1), top + 1))
            rows = []
            for v in range(top, max(0, top - limit), -1):
                uid = history.uid(v)
                if uid is None:
                    break
                row = _version_row(store, history, v, uid, latest)
                rows.append(row)
                if v < newest.retained_from and row.get("delta_bytes") is None:
                    row["cleaned_up"] = True
                    break
            out["partitions"].append({"operator": op, "partition": p, "versions": rows})
    return out


class VersionNotCommittedError(StateError):
    """``lineage --version V`` names a version that has no commit."""


class PartitionNotFoundError(StateError):
    """``lineage --partition P`` (or ``--operator``) names a partition (or operator) that the checkpoint's
    layout does not have."""


def _check_selection(
    url: str, commit: Any, top: int, latest: int, operator: str | None, partition: int | None
) -> None:
    """Refuse an ``operator`` or ``partition`` that ``commit`` (the listing's first version, ``top``)
    does not have, naming the ones its layout has: the current layout's unless ``top`` is older."""
    at = "" if top == latest else f" at version {top}"
    if operator is not None and operator not in commit.checkpoints:
        known = ", ".join(sorted(commit.checkpoints)) or "none"
        raise PartitionNotFoundError(
            f"the checkpoint {redact(url)} has no operator {operator!r}{at}: it has {known}"
        )
    if partition is None:
        return
    parts = sorted({int(p) for op, ps in commit.checkpoints.items() if operator in (None, op) for p in ps})
    if partition in parts:
        return
    rescaled_at = getattr(commit, "layout_from", 1)
    since = f" (its layout since the rescale at version {rescaled_at})" if rescaled_at > 1 else ""
    raise PartitionNotFoundError(
        f"the checkpoint {redact(url)} has no partition {partition}{at}: it has partitions "
        f"{_numbers(parts)}{since}"
    )


def _numbers(values: list[int]) -> str:
    """``0..3`` for a run without gaps, else the numbers listed; ``none`` for no number."""
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 1:
        return f"{values[0]}..{values[-1]}"
    return ", ".join(str(v) for v in values)


class NotACheckpointError(StateError):
    """``lineage`` was given a location that holds no query checkpoint (no ``metadata.json``)."""


def require_checkpoint(store: Any, url: str) -> None:
    """Refuse, naming ``url``, a location without a query checkpoint's ``metadata.json`` (a mistyped
    path, Spark's own ``_spark`` directory inside a checkpoint, a backup repository)."""
    from blobstate.blobstore.open import nothing_stored
    from blobstate.layout import METADATA
    from blobstate.reader.checkpoint import is_query_checkpoint

    if not is_query_checkpoint(store):
        why = _hint(url) or nothing_stored(store)
        raise NotACheckpointError(f"{redact(url)} is not a query checkpoint ({METADATA} is missing){why}")


def _hint(url: str) -> str:
    """Where the checkpoint is when ``url`` is Spark's own ``_spark`` directory inside one, else ''."""
    from blobstate.blobstore import open_blob_store
    from blobstate.reader.checkpoint import is_query_checkpoint

    head, sep, last = url.rstrip("/").rpartition("/")
    if not sep or last != "_spark" or not head:
        return ""
    try:
        with open_blob_store(head) as parent:
            if not is_query_checkpoint(parent):
                return ""
    except Exception:  # the hint is a courtesy: the error above stands without it
        return ""
    shown = redact(head)
    return f": it is Spark's own offsets checkpoint inside the query checkpoint {shown}; give {shown}"


def _restore(row: dict[str, Any]) -> str:
    """A version row's restore chain in words (``restore_from`` is ``empty`` or the base snapshot)."""
    from blobstate.cli.phrases import restore_phrase

    base = None if row["restore_from"] == "empty" else row["restore_from"]
    return restore_phrase(base, row["deltas_to_replay"])


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _time(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _version_json(row: Any, *, detail: bool) -> dict[str, Any]:
    """One version's metrics as JSON (per-partition figures with ``detail``); None: not in the commit."""
    from dataclasses import asdict

    out: dict[str, Any] = {
        "version": row.version,
        "batch_id": row.batch_id,
        "created_time_ms": row.created_time_ms,
        "input_rows": row.input_rows,
        "output_rows": row.output_rows,
        "seconds": row.seconds,
        "bytes_uploaded": row.bytes_uploaded,
        "restore_seconds": row.restore_seconds,
        "restore_bytes": row.restore_bytes,
        "state_keys": row.state_keys,
        "delta_bytes": row.delta_bytes,
        "snapshots": row.snapshots,
        "checkpoint": row.checkpoint_kind,
        "rescale": row.rescale,
    }
    if detail:
        out["partitions"] = {str(p): asdict(m) for p, m in sorted(row.partitions.items())}
        out["standby"] = None if row.standby is None else asdict(row.standby)
    return out


def collect_versions(store: Any, *, limit: int = 20, version: int | None = None) -> list[Any]:
    """The per-batch metrics (:class:`blobstate.report.BatchMetrics`) of the newest ``limit`` versions,
    newest first, or of ``version`` alone (:class:`VersionNotCommittedError` when it has no commit).

    A snapshot uploaded in the background shows at the version it is of: the commits after ``version``
    are read to find the one naming it, as ``--version``'s restore chains do.
    """
    from blobstate.lineage.commitlog import CommitLog
    from blobstate.report.metrics import batch_row, late_names

    log_ = CommitLog(store)
    if version is not None:
        latest = log_.latest_version()
        if not log_.commit_exists(version):
            newest = log_.latest_commit()
            latest = 0 if newest is None else newest.version
            horizon = newest.horizon if newest is not None and version < newest.horizon else None
            raise VersionNotCommittedError(
                f"version {version} of {store.url} has no commit (commits/{version}.json"
                + (
                    f" was pruned: no retained version needs commits below {horizon}"
                    if horizon is not None
                    else ""
                )
                + f"); the newest committed version is {latest}: run `blobstate lineage` to list them"
            )
        later = [v for v in log_.versions() if version < v <= latest]
        commits = store.run_parallel(log_.read_commit, [version, *later])
        return [batch_row(commits[0], late=late_names(commits))]
    versions = sorted(log_.versions(), reverse=True)[:limit]
    commits = store.run_parallel(log_.read_commit, versions)
    late = late_names(commits)
    return [batch_row(c, late=late) for c in commits]


_HEADER = (
    f"{'batch':>7}  {'version':>7}  {'committed (UTC)':<19}  {'rows in':>10}  {'rows out':>10}"
    f"  {'batch s':>8}  {'uploaded':>11}  {'restore s':>9}  checkpoint"
)


def _version_line(row: Any) -> str:
    return (
        f"{row.batch_id:>7}  {row.version:>7}  {_time(row.created_time_ms):<19}"
        f"  {_fmt(row.input_rows, ','):>10}  {_fmt(row.output_rows, ','):>10}  {_fmt(row.seconds, '.3f'):>8}"
        f"  {_size(row.bytes_uploaded):>11}  {_fmt(row.restore_seconds, '.3f'):>9}  {row.checkpoint_kind}"
        + (f" (rescale of batch {row.batch_id} to {row.num_partitions} partitions)" if row.rescale else "")
    )


def _replica(replica: Any) -> str:
    """``host (executor id) @ version`` of a replica."""
    version = "" if replica.version is None else f" @ {replica.version}"
    return f"{replica.host} ({replica.executor_id}){version}"


def _placement_detail(row: Any) -> None:
    """Each partition's active host and its standby replicas (with the versions the commit recorded),
    then the batch's moves."""
    if not any(m.host or m.standbys for m in row.partitions.values()):
        return
    typer.echo(f"  {'partition':>9}  {'active':<28}  standbys (host (executor) @ version)")
    for p, m in sorted(row.partitions.items()):
        active = "-" if m.host is None else f"{m.host} ({m.executor_id or '?'})"
        standbys = ", ".join(_replica(r) for r in m.standbys) or "-"
        if m.warmup is not None:
            standbys += f"; warm-up {_replica(m.warmup)}"
        typer.echo(f"  {p:>9}  {active:<28}  {standbys}")
    moves = row.standby.moves if row.standby is not None else ()
    typer.echo("  moves: " + ("; ".join(m.describe() for m in moves) if moves else "none"))


def _partition_detail(row: Any, lineage_rows: dict[tuple[str, int], dict[str, Any]]) -> None:
    typer.echo(
        f"  {'partition':>9}  {'uid':<32}  {'rows in':>9}  {'rows out':>9}  {'restore s':>9}  {'load':<14}"
        f"  {'uploaded':>11}  {'delta':>11}  {'snapshot':<8}  restore from"
    )
    for (op, p), info in sorted(lineage_rows.items()):
        m = row.partitions.get(p)
        name = f"{p}" if len({o for o, _ in lineage_rows}) == 1 else f"{op}/{p}"
        restore = info.get("restore_error") or _restore(info)
        snapshot = "yes" if info.get("snapshot") else "no"
        if info.get("snapshot_named_in"):
            snapshot = f"yes (named in version {info['snapshot_named_in']})"
        if info.get("snapshot_error"):
            snapshot = f"error: {info['snapshot_error']}"
        typer.echo(
            f"  {name:>9}  {info['uid']:<32}  {_fmt(m and m.input_rows, ','):>9}"
            f"  {_fmt(m and m.output_rows, ','):>9}  {_fmt(m and m.restore_seconds, '.3f'):>9}"
            f"  {(m and m.load_rule) or '-':<14}  {_size(m and m.bytes_uploaded):>11}"
            f"  {_size(info.get('delta_bytes')):>11}  {snapshot:<8}  {restore}"
        )
    _placement_detail(row)


def lineage(
    url: UrlArgument,
    version: Annotated[
        int | None,
        typer.Option("--version", "-v", help="Only this version, with each partition's figures and uid."),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", help="List this partition's versions: uids, sizes, restore chain."),
    ] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Only this operator.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many newest versions.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """Show committed versions: commit time, rows in/out, batch seconds, bytes uploaded, restore seconds
    (slowest partition) and snapshot or delta; "-" where a commit predates a metric.

    With --version, one version and every partition's figures, uid and restore chain, its active and
    standby hosts and the batch's moves; with --partition, that partition's versions with their uids,
    sizes and restore chains.

    When newer commits than the newest one were lost (committed objects of later versions exist) or the
    commit log has holes, the first lines say so and the exit status is 1.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.state.lost import scan_for_loss

    with open_existing_blob_store(url) as store:
        require_checkpoint(store, url)
        loss = scan_for_loss(store)
        warnings, notes = loss.warnings(), loss.notes()
        for line in warnings:
            typer.echo(f"warning: {redact(line)}", err=True)
        rows = collect_versions(store, limit=limit, version=version)
        result = collect_lineage(
            store,
            partition=partition,
            operator=operator,
            limit=1 if version is not None else limit,
            version=version,
        )
    if as_json:
        result["versions"] = [_version_json(r, detail=version is not None) for r in rows]
        result["warnings"], result["notes"] = [redact(w) for w in warnings], [redact(n) for n in notes]
        typer.echo(json.dumps(result, indent=2))
    else:
        for line in notes:
            typer.echo(f"note: {redact(line)}")
        _listing(result, rows, version, partition, lost=bool(loss.lost))
    if warnings:
        raise typer.Exit(1)


def _listing(
    result: dict[str, Any], rows: list[Any], version: int | None, partition: int | None, *, lost: bool
) -> None:
    """``lineage``'s human output: the versions (``lost``: newer commits were lost)."""
    if not result["latest"]:
        typer.echo("no committed versions")
        return
    from blobstate.cli.phrases import state_phrase

    latest = result["latest"]
    newest = "newest readable version (newer commits were lost)" if lost else "newest committed version"
    typer.echo(f"{newest}: {latest} ({state_phrase(result['batch_id'], rescale=result['rescale'])})")
    if partition is None or version is not None:
        typer.echo(_HEADER)
        for row in rows:
            typer.echo(_version_line(row))
    if version is not None:
        by_partition = {
            (part["operator"], part["partition"]): part["versions"][0]
            for part in result["partitions"]
            if part["versions"]
        }
        _partition_detail(rows[0], by_partition)
        return
    if partition is None:
        typer.echo("(--version V: one version with each partition; --partition P: a partition's lineage)")
        return
    _partition_listing(result)


def _partition_listing(result: dict[str, Any]) -> None:
    """Each selected partition's versions: the batch its commit records (or the rescale of one), uid,
    delta size, snapshot size and restore chain."""
    from blobstate.cli.phrases import batch_label

    for part in result["partitions"]:
        typer.echo(f"operator {part['operator']} partition {part['partition']}:")
        labels = [batch_label(row["batch_id"], rescale=row["rescale"]) for row in part["versions"]]
        width = max((len(label) for label in labels), default=0)
        for row, batch in zip(part["versions"], labels, strict=True):
            if row.get("cleaned_up"):
                typer.echo(f"  {batch:>{width}}  {row['checkpoint_id']:<44} (cleaned up by retention)")
                continue
            delta = "-" if row.get("delta_bytes") is None else f"{row['delta_bytes']:,} B"
            snap = f"snapshot {row['snapshot_bytes']:,} B" if row.get("snapshot_bytes") is not None else ""
            restore = row.get("restore_error") or f"restore: {_restore(row)}"
            typer.echo(
                f"  {batch:>{width}}  {row['checkpoint_id']:<44} delta {delta:>14}  {snap:<24} {restore}"
            )


def verify(
    url: Annotated[
        str,
        typer.Argument(help=f"Query checkpoint (or backup repository: its newest snapshot): {URL_FORMS}."),
    ],
    checksums: Annotated[
        bool, typer.Option("--checksums", help="Also read every blob and check its CRC-32.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Prove every retained version of every partition is restorable; exit 1 naming what is wrong.

    Deltas and snapshot indexes are read and checked against their commits; blobs are checked for
    presence and size (read and checksummed with --checksums). The output says what was not read.
    Committed objects of the newest commit still pending because its post-commit cleanup has not run
    yet are a note ("cleanup pending"), not a problem; so is a loss of commits accepted with accept-loss.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.cli.progress import shown, store_activity
    from blobstate.snapshot.repository import is_backup_repository
    from blobstate.state.verify import verify as run_verify

    with open_existing_blob_store(url) as store:
        if is_backup_repository(store):
            _verify_repository(store, url, checksums, as_json)
            return
        with store_activity("verify", shown(as_json)):
            report = run_verify(store, checksums=checksums)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "problems": [{**p.__dict__, "text": str(p)} for p in report.problems],
                    "checked": report.summary(),
                    "notes": report.notes,
                },
                indent=2,
            )
        )
    elif report.problems:
        for problem in report.problems:
            typer.echo(f"problem: {redact(str(problem))}", err=True)
        for line in report.notes:
            typer.echo(f"note: {redact(line)}", err=True)
        typer.echo(f"{len(report.problems)} problem(s) found in {redact(url)}", err=True)
    else:
        for line in report.summary():
            typer.echo(line)
        for line in report.notes:
            typer.echo(f"note: {redact(line)}")
        if report.latest_version:
            typer.echo("ok: every retained version is restorable")
    if report.problems:
        raise typer.Exit(1)


def _verify_repository(store: Any, url: str, checksums: bool, as_json: bool) -> None:
    from blobstate.cli.progress import shown, store_activity
    from blobstate.snapshot.repository import verify_repository

    with store_activity("verify", shown(as_json)):
        result = verify_repository(store, checksums=checksums)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": not result.problems,
                    "problems": [{**p.__dict__, "text": str(p)} for p in result.problems],
                    "snapshot": result.snapshot,
                    "heads": result.heads,
                    "horizon": result.horizon,
                    "blobs": result.blobs,
                    "checksums": result.checksums,
                },
                indent=2,
            )
        )
    elif result.problems:
        for problem in result.problems:
            typer.echo(f"problem: {redact(str(problem))}", err=True)
        typer.echo(f"{len(result.problems)} problem(s) found in {redact(url)}", err=True)
    else:
        how = (
            "read and checked their CRC-32"
            if result.checksums
            else ("checked presence and size without reading them (--checksums reads them)")
        )
        pruned = f" (from the horizon {result.horizon}: older heads are pruned)" if result.horizon > 1 else ""
        typer.echo(
            f"backup repository: read {result.heads} head records{pruned} and the newest index "
            f"{result.snapshot}; {result.blobs} blobs: {how}"
        )
        typer.echo("ok: the newest snapshot is restorable")
    if result.problems:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``lineage`` and ``verify`` to the CLI."""
    app.command()(lineage)
    app.command()(verify)
