"""``blobstate connect-server-args``: what starts a Spark Connect server with blobstate's plugin."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from blobstate.cli.main import main


def test_connect_server_args_name_a_jar_holding_the_plugin_and_the_plugin_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["connect-server-args"])
    assert exited.value.code in (0, None)
    words = capsys.readouterr().out.split()
    assert words[0] == "--jars" and words[2] == "--conf"
    plugin = "org.apache.spark.sql.blobstate.ConnectPlugin"
    assert words[3] == f"spark.connect.extensions.relation.classes={plugin}"
    with zipfile.ZipFile(Path(words[1])) as jar:  # the class the conf names is in the jar
        assert "org/apache/spark/sql/blobstate/ConnectPlugin.class" in jar.namelist()
