"""``blobstate rescale``: change the number of state partitions of a stopped query's checkpoint."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from blobstate.blobstore.redact import redact
from blobstate.cli.urls import URL_FORMS


def _spark(master: str | None) -> Any:
    """The session the rescale job runs on: the active one, or a new one on ``master`` (default: the
    Spark conf's, else ``local[*]``). A new local session's Python workers run this command's own
    interpreter unless ``PYSPARK_PYTHON`` says otherwise (the ``python3`` on the PATH may not have
    blobstate); every session's workers are checked before the job runs."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from blobstate.engine.executor_python import check_executors_python
    from blobstate.engine.jvm import seam_for

    builder = SparkSession.builder.appName("blobstate rescale")
    if SparkSession.getActiveSession() is None:
        master = master or SparkConf().get("spark.master", None) or "local[*]"
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    check_executors_python(seam_for(spark), "the rescale did not start")
    return spark


def rescale(
    url: Annotated[str, typer.Argument(help=f"A query checkpoint: {URL_FORMS}.")],
    partitions: Annotated[
        str,
        typer.Option(
            "--partitions", help="The new number of state partitions (1 to 10000).", metavar="INTEGER"
        ),
    ],
    master: Annotated[
        str | None,
        typer.Option("--master", help="Spark master to run the rescale job on (default: local[*])."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Rescale the newest version of a query checkpoint to --partitions partitions, as one new version.

    Every kind of state follows its keys. The query must be stopped; restart it with
    num_partitions=N (or none: it takes the newest commit's count). A query can also rescale at its
    start: transform_with_state(..., num_partitions=N, allow_rescale=True). Older versions stay
    readable until retention removes them; a crash leaves the old layout or the new one, and running
    the command again finishes the job. See docs/RESCALE.md.
    """
    from blobstate.blobstore import open_existing_blob_store
    from blobstate.cli.progress import shown, store_activity
    from blobstate.rescale import rescale_checkpoint
    from blobstate.rescale.job import plan_rescale

    count = _partition_count(partitions)
    with open_existing_blob_store(url) as store:
        plan_rescale(store, count)  # a checkpoint that cannot be rescaled is refused before Spark starts
    spark = _spark(master)  # (the JVM's start-up lines are its own: no display over them)
    with store_activity(f"rescale to {count} partitions", shown(as_json)) as activity:
        activity.follow_spark(spark)
        result = rescale_checkpoint(spark, url, count)
    partitions_done = result.new_partitions
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    if result.already:
        typer.echo(
            f"checkpoint {redact(result.url)}: version {result.version} already has {partitions_done}"
            " partitions; post-commit cleanup finished"
        )
        return
    typer.echo(
        f"checkpoint {redact(result.url)}: rescaled version {result.previous_version} from "
        f"{result.old_partitions} to {result.new_partitions} partitions as version {result.version} "
        f"({result.records} records, {result.bytes_uploaded} bytes uploaded, {result.seconds:.1f}s)"
    )


def _partition_count(text: str) -> int:
    """``--partitions`` as an integer in the allowed range, else one :class:`RescaleError` line."""
    from blobstate.rescale import RescaleError
    from blobstate.rescale.job import check_partition_count

    try:
        value = int(text.strip().replace("_", ""), 10)
    except ValueError:
        raise RescaleError(f"--partitions must be a positive integer, not {text!r}") from None
    return check_partition_count(value, "--partitions")


def register(app: typer.Typer) -> None:
    """Add ``rescale`` to the CLI."""
    app.command()(rescale)
