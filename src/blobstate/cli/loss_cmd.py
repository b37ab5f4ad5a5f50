"""``blobstate accept-loss``: an operator's decision that a checkpoint's lost newest commits stay lost.

Until then every command that writes refuses the checkpoint (:mod:`blobstate.state.lost`); the other way
out is to put the lost ``commits/<v>.json`` back from a backup.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.urls import URL_FORMS


def accept_loss(
    url: Annotated[str, typer.Argument(help=f"A query checkpoint: {URL_FORMS}.")],
    version: Annotated[
        int,
        typer.Option(
            "--version",
            help="The newest readable version (the newest commit), which the checkpoint continues from.",
        ),
    ],
    reason: Annotated[str | None, typer.Option("--reason", help="Why, recorded with the acceptance.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Accept that the commits above --version were lost for good, so that writers may continue.

    Run it only when the lost commits/<v>.json cannot be put back from a backup (putting them back needs
    no command: everything works again). It records the acceptance create-only in
    accepted-loss/<version>_<uid>.json, naming the lost attempts found now; from then on gc, rescale and
    a query's start proceed from --version, and the next commit takes the lost commit's number, so the
    lost commits can never be put back. Version --version alone stays retained (the lost commits'
    cleanup may have deleted older ones), and it is checked restorable first: if the lost commits'
    cleanup deleted part of it, nothing is written and only putting them back helps. A later loss is
    refused again.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.state.lost import accept_loss as record

    with open_existing_blob_store(url) as store:
        acceptance, after = record(store, version, reason=reason)
    lost = sorted(acceptance.lost)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "accepted": acceptance.name,
                    "version": acceptance.version,
                    "lost_versions": lost,
                    "attempts": sum(len(uids) for uids in acceptance.lost.values()),
                    "warnings": [redact(w) for w in after.warnings()],
                },
                indent=2,
            )
        )
    else:
        shown = f"version {lost[0]}" if len(lost) == 1 else f"versions {lost[0]}..{lost[-1]}"
        typer.echo(
            f"checkpoint {redact(after.url)}: accepted the loss of {shown} ({acceptance.name}); writers "
            f"continue from version {acceptance.version}, the next commit is version "
            f"{acceptance.version + 1}; version {acceptance.version} was checked restorable and is the only "
            "one retained now"
        )
        for line in after.warnings():
            typer.echo(f"warning: {redact(line)}", err=True)
    if after.lost:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``accept-loss`` to the CLI."""
    app.command("accept-loss")(accept_loss)
