"""``blobstate gc``: expire pending objects and, with ``--full``, sweep what nothing references."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def gc(
    url: Annotated[str, typer.Argument(help="Blob store URL (a backup repository or a query checkpoint).")],
    full: Annotated[
        bool, typer.Option("--full", help="Also mark-and-sweep a query checkpoint (repairs).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Expire pending objects past their TTL (backends without native expiry); --full also sweeps."""
    from blobstate.blobstore import open_blob_store

    result: dict[str, Any] = {}
    with open_blob_store(url) as store:
        result["expired"] = store.expire()
        if full:
            from blobstate.state.retention import gc_full

            result["swept"] = gc_full(store)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        typer.echo(f"expired {len(result['expired'])} pending objects past their TTL")
        if full:
            typer.echo(f"swept: {result['swept']}")


def register(app: typer.Typer) -> None:
    """Add gc to the CLI."""
    app.command()(gc)
