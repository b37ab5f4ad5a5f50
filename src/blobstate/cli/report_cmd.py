"""``blobstate report``: one HTML page (and PNGs) with a query checkpoint's per-batch metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.lineage_cmds import JsonOption, UrlArgument


def report(
    url: UrlArgument,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for index.html and the PNG plots (created).")
    ] = Path("blobstate-report"),
    no_state_sizes: Annotated[
        bool,
        typer.Option(
            "--no-state-sizes", help="Do not read snapshot indexes for the state's size (fewer reads)."
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace files and symbolic links at the output names that the report did not write "
            "(the links themselves, never what they point to).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Write one self-contained HTML page with plots of every committed batch's metrics.

    Plots: latency, rows in/out, bytes uploaded, restore seconds per partition, state size, snapshots,
    and standby lag and failovers when the query ran with standbys. Needs matplotlib
    (pip install 'blobstate[report]').

    The files are written into a new directory next to --out and moved into place; the report never
    writes through a symbolic link. It lists the files it wrote in blobstate-report.json in --out and
    replaces only those on the next run: a link or another file at an output name (index.html,
    <plot>.png) is refused unless --force. PNGs a previous report listed but this one does not draw are
    removed; nothing else in --out is touched.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.cli.lineage_cmds import require_checkpoint
    from blobstate.cli.progress import shown, step_bars
    from blobstate.report.metrics import load_batch_metrics
    from blobstate.report.render import ReportError, pyplot, write_report
    from blobstate.state.lost import scan_for_loss

    pyplot()  # fail before reading anything when matplotlib is missing
    with open_existing_blob_store(url) as store, step_bars(shown(as_json)) as progress:
        require_checkpoint(store, url)
        # A reader says first when the newest version it shows is not the newest committed one.
        warnings = [redact(line) for line in scan_for_loss(store).warnings()]
        for line in warnings:
            typer.echo(f"warning: {line}", err=True)
        summary, rows = load_batch_metrics(store, state_sizes=not no_state_sizes, progress=progress)
        if not rows:
            raise ReportError(f"{redact(url)} has no committed versions: nothing to report")
        page, pngs = write_report(summary, rows, out, progress, force=force)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "page": str(page),
                    "plots": [str(p) for p in pngs],
                    "query_id": summary.query_id,
                    "partitions": summary.num_partitions,
                    "versions": [r.version for r in rows],
                    "missing_versions": summary.missing,
                    "warnings": warnings,
                },
                indent=2,
            )
        )
        return
    typer.echo(f"wrote {page} ({len(rows)} batches, {summary.num_partitions} partitions; PNGs next to it)")


def register(app: typer.Typer) -> None:
    """Add ``report`` to the CLI."""
    app.command()(report)
