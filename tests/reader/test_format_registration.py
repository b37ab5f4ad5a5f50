"""``spark.read.format("blobstate")`` works right after installation, in a session where nothing of
blobstate was imported or registered: PySpark finds the ``pyspark_blobstate`` module by itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from pkgutil import iter_modules

import pytest
from checkpoints import build_checkpoint

from blobstate.reader.datasource import BlobstateDataSource


def test_the_installed_package_offers_pyspark_its_data_source_by_the_lookup_rule() -> None:
    # PySpark's lookup: every top-level module named pyspark_* whose DefaultSource is a DataSource
    found = {m.name for m in iter_modules() if m.name.startswith("pyspark_")}
    assert "pyspark_blobstate" in found
    import pyspark_blobstate

    assert pyspark_blobstate.DefaultSource is BlobstateDataSource
    assert pyspark_blobstate.DefaultSource.name() == "blobstate"


@pytest.mark.spark
def test_a_fresh_session_reads_state_by_format_name_without_registering(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    batches = [[("u1", 3), ("u2", 5)], [("u1", 4), ("u3", 60)]]
    expected = build_checkpoint(url, batches, tmp_path / "local")
    script = textwrap.dedent(
        f"""
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        df = spark.read.format("blobstate").option("stateVarName", "totals").load({url!r})
        print("ROWS", sorted((r.key.key, r.value["count"], r.value["total"]) for r in df.collect()))

        import blobstate  # reads that register again only when the workers' environment changed

        for _ in range(3):
            blobstate.read_state(spark, {url!r}, state_var="totals").collect()
        print("READS DONE", flush=True)
        spark.sparkContext.environment["BLOBSTATE_REGISTRATION_TEST"] = "1"
        blobstate.read_state(spark, {url!r}, state_var="totals").collect()
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYSPARK_PYTHON"] = sys.executable
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = next(line for line in done.stdout.splitlines() if line.startswith("ROWS"))
    # Spark says it once per registration that replaced one: the first read_state, then the read after
    # the workers' environment changed (not each of the three reads).
    replaced = [line for line in done.stderr.splitlines() if "data source blobstate replaced a" in line]
    assert len(replaced) == 2, done.stderr[-3000:]
    totals = expected[-1]["totals"]
    assert rows == "ROWS " + str(sorted((k, v[0], v[1]) for k, v in totals.items()))
