"""``blobstate demo``: the streaming demo on local Spark (or a Spark Connect server) with the
local-directory blob store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def demo(
    workdir: Annotated[
        Path,
        typer.Option(
            help="Scratch directory for the demo's input, checkpoint and output. An earlier demo's files in"
            " it are deleted first; a directory holding anything else is refused."
        ),
    ] = Path("blobstate-demo"),
    batches: Annotated[
        int,
        typer.Option(
            help="Micro-batches of clicks; two batches of one far-future click each follow, which move the"
            " watermark past every open session."
        ),
    ] = 12,
    events: Annotated[int, typer.Option(help="Click events per micro-batch.")] = 10_000,
    users: Annotated[int, typer.Option(help="Distinct users.")] = 10_000,
    partitions: Annotated[int, typer.Option(help="State partitions.")] = 4,
    kill_after: Annotated[int, typer.Option(help="Kill the job after this many batches, then restart.")] = 5,
    remote: Annotated[
        str | None,
        typer.Option(
            metavar="sc://HOST:PORT",
            help="Run the job's query on this Spark Connect server instead of local Spark. The server must"
            " run blobstate's plugin ('blobstate connect-server-args' prints the spark-submit arguments),"
            " have blobstate installed in its Python, and see the work directory at the same path (a"
            " server on this machine). Over Connect the query runs in the server, so the demo stops it"
            " (query.stop()) after --kill-after batches instead of killing the job.",
        ),
    ] = None,
) -> None:
    """Sessionize a click stream with blobstate state, kill and restart the job, check the result."""
    from blobstate.demo.clickstream import StreamShape
    from blobstate.demo.run import run_demo

    result = run_demo(
        workdir,
        StreamShape(batches=batches, events_per_batch=events, users=users),
        partitions,
        kill_after,
        remote=remote,
    )
    if not result.matches:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the CLI."""
    app.command()(demo)
