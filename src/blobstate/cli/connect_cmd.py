"""``blobstate connect-server-args``: what a Spark Connect server needs to run blobstate's queries."""

from __future__ import annotations

import typer


def server_args() -> list[str]:
    """``--jars <helper jar> --conf spark.connect.extensions.relation.classes=<plugin>``: the helper jar
    built for the installed PySpark (the shipped one when it fits, else compiled once and cached)."""
    import os

    import pyspark

    from blobstate.engine.jvm.connect import PLUGIN_CLASS
    from blobstate.engine.placement import helper_jar

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    jar = helper_jar(pyspark.__version__, jars)
    return ["--jars", str(jar), "--conf", f"spark.connect.extensions.relation.classes={PLUGIN_CLASS}"]


def register(app: typer.Typer) -> None:
    """Add the command to ``app``."""

    @app.command("connect-server-args")
    def connect_server_args() -> None:
        """Print the arguments that start a Spark Connect server with blobstate's plugin:
        $SPARK_HOME/sbin/start-connect-server.sh $(blobstate connect-server-args)."""
        typer.echo(" ".join(server_args()))
