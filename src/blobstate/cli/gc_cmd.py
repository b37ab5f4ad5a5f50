"""``blobstate gc``: expire pending objects and, with ``--full``, sweep what nothing references."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.urls import URL_FORMS

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def gc(
    url: Annotated[str, typer.Argument(help=f"A query checkpoint or a backup repository: {URL_FORMS}.")],
    full: Annotated[
        bool,
        typer.Option("--full", help="Also delete committed objects that no retained version references."),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Change nothing; show the TTLs it would clear and what it would delete."
        ),
    ] = False,
    install_lifecycle: Annotated[
        bool,
        typer.Option(
            "--install-lifecycle",
            help="On S3, install the bucket lifecycle rule that expires pending objects under this prefix"
            " after 30 days (once per checkpoint; needs s3:PutLifecycleConfiguration). On Azure, fails"
            " saying how an account owner installs the policy.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Finish post-commit cleanup, then expire pending objects past their TTL; --full also sweeps.

    Works on query checkpoints and backup repositories. Refuses (deleting nothing) a location that is
    neither, or whose commit or head log it cannot read completely. On a local or shared-filesystem
    location only gc expires pending objects: run it regularly. On S3, which expires them with a
    lifecycle rule, it checks that the rule is set up, and fails saying how to fix it when it is not.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.cli.progress import shown, store_activity
    from blobstate.snapshot.repository import gc_repository, is_backup_repository
    from blobstate.state.retention import gc_checkpoint

    with (
        open_existing_blob_store(url) as store,
        store_activity("gc --dry-run" if dry_run else "gc", shown(as_json)),
    ):
        if is_backup_repository(store):
            repo_stats = gc_repository(store, full=full, dry_run=dry_run)
            stats = None
        else:
            stats = gc_checkpoint(store, full=full, dry_run=dry_run)
        if install_lifecycle and not dry_run:
            store.install_expiry_rule()
        expiry_problem = store.expiry_problem()
    url = redact(url)  # as the output names it
    if stats is None:
        _report_repository(url, repo_stats, full, dry_run, as_json, expiry_problem)
        return
    result: dict[str, Any] = asdict(stats)
    result["expiry_problem"] = expiry_problem
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        if expiry_problem:
            raise typer.Exit(1)
        return
    newest, oldest = stats.latest_version, stats.retained_from
    span = f"newest version {newest}, versions {oldest}..{newest} retained"
    if dry_run:
        typer.echo(
            f"dry run, nothing changed: checkpoint {url}: {span}; post-commit cleanup would clear any TTL "
            f"on {stats.ttl_removed} referenced objects ({stats.ttl_pending} of them still pending), "
            f"delete {len(stats.cleanup_deleted)} objects of versions no longer retained and prune "
            f"{_commits(stats.commits_pruned)}; would expire {len(stats.expired)} pending objects past "
            "their TTL"
        )
    else:
        typer.echo(
            f"checkpoint {url}: {span}; post-commit cleanup finished (cleared any TTL on {stats.ttl_removed} "
            f"referenced objects, deleted {len(stats.cleanup_deleted)} objects of versions no longer "
            f"retained, pruned {_commits(stats.commits_pruned)}); expired {len(stats.expired)} pending "
            "objects past their TTL"
        )
    if full:
        verb = "would delete" if dry_run else "deleted"
        typer.echo(
            f"swept: listed {stats.listed} objects, {stats.referenced} referenced by retained versions, "
            f"{stats.pending_kept} pending left to expire; {verb} {len(stats.deleted)} unreferenced"
        )
    if expiry_problem:
        typer.echo(f"error: {redact(expiry_problem)}", err=True)
        raise typer.Exit(1)


def _commits(versions: list[int]) -> str:
    """``3 commits below the horizon (commits/4.json ... commits/6.json)``, or ``no commit``."""
    from blobstate.layout import commit_name

    if not versions:
        return "no commit"
    names = ", ".join(commit_name(v) for v in versions)
    if len(versions) > 3 and versions == list(range(versions[0], versions[-1] + 1)):
        names = f"{commit_name(versions[0])} ... {commit_name(versions[-1])}"
    return f"{len(versions)} commit{'s' if len(versions) > 1 else ''} below the horizon ({names})"


def _heads(versions: list[int], verb: str) -> str:
    """``; pruned 2 heads below the horizon (heads/1.json, heads/2.json)``, or nothing."""
    if not versions:
        return ""
    from blobstate.snapshot.heads import head_name

    names = ", ".join(head_name(v) for v in versions[:3]) + (", ..." if len(versions) > 3 else "")
    return f"; {verb} {len(versions)} head{'s' if len(versions) > 1 else ''} below the horizon ({names})"


def _report_repository(
    url: str, stats: Any, full: bool, dry_run: bool, as_json: bool, expiry_problem: str | None
) -> None:
    if as_json:
        result = asdict(stats)
        result["expiry_problem"] = expiry_problem
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        verb = "would delete" if dry_run else "deleted"
        heads = _heads(stats.heads_pruned, "would prune" if dry_run else "pruned")
        if dry_run:
            typer.echo(
                f"dry run, nothing changed: backup repository {url}: newest snapshot {stats.newest or '-'}"
                f"{heads}"
            )
        else:
            typer.echo(
                f"backup repository {url}: newest snapshot {stats.newest or '-'}; "
                f"expired {len(stats.expired)} pending objects past their TTL{heads}"
            )
        if full:
            typer.echo(
                f"swept: listed {stats.listed} objects, {stats.referenced} referenced by committed "
                f"snapshots; {verb} {len(stats.deleted)} unreferenced"
            )
        if expiry_problem:
            typer.echo(f"error: {redact(expiry_problem)}", err=True)
    if expiry_problem:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add gc to the CLI."""
    app.command()(gc)
