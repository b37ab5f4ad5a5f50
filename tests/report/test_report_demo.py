"""``blobstate report`` and ``lineage`` on a real checkpoint: the demo's query, run once on the test Spark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_report_render import check_png, embedded_plots

from blobstate.blobstore import open_blob_store
from blobstate.demo.clickstream import StreamShape, generate_batches, generate_profiles, write_batches
from blobstate.demo.job import start_query
from blobstate.lineage.commitlog import CommitLog
from blobstate.report.metrics import load_batch_metrics
from blobstate.report.render import PAGE_NAME, PLOTS

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3


@pytest.fixture(scope="module")
def demo(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """The demo's checkpoint after 7 batches of clicks (snapshots at version 5), and the driver's reports."""
    work = tmp_path_factory.mktemp("demo")
    shape = StreamShape(batches=7, events_per_batch=2000, users=400)
    clicks = generate_batches(shape)
    write_batches(clicks, work / "input")
    write_batches(generate_profiles(shape, len(clicks)), work / "profiles", "profiles")
    reports: list[Any] = []
    # Snapshots inline, so version 5 restores from its own snapshot (what the lineage test below reads);
    # background uploads named by a later commit are covered in tests/state/test_snapshot_uploads.py.
    spark.conf.set("spark.blobstate.snapshot_upload", "inline")
    try:
        query = _start(spark, work, reports)
    finally:
        spark.conf.unset("spark.blobstate.snapshot_upload")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return work / "checkpoint", [r for r in reports if not r.skipped]


def _start(spark: Any, work: Path, reports: list[Any]) -> Any:
    return start_query(
        spark,
        work / "input",
        str(work / "checkpoint"),
        work / "output",
        str(work / "local"),
        PARTITIONS,
        on_batch=reports.append,
        profiles_dir=work / "profiles",
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobstate.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
        timeout=300,
    )


def test_the_table_matches_what_the_driver_reported(demo: tuple[Path, list[Any]]) -> None:
    checkpoint, reports = demo
    with open_blob_store(str(checkpoint)) as store:
        summary, rows = load_batch_metrics(store)
    assert summary.num_partitions == PARTITIONS and summary.missing == []
    assert len(rows) == len(reports) >= 7
    for row, report in zip(rows, reports, strict=True):
        assert row.version == report.version
        assert (row.input_rows, row.output_rows) == (report.input_rows, report.output_rows)
        assert row.bytes_uploaded == report.bytes_uploaded
        assert row.snapshots == report.snapshots
        assert row.restore_seconds == report.max_load_seconds
        assert row.state_keys == report.state_keys
    five = rows[4]
    assert five.checkpoint_kind == "snapshot"
    assert all(p.state_bytes and p.state_bytes > 0 for p in five.partitions.values())
    assert all(p.state_bytes is None for p in rows[3].partitions.values())  # no snapshot at version 4


def test_the_report_page_has_every_plot(demo: tuple[Path, list[Any]], tmp_path: Path) -> None:
    checkpoint, reports = demo
    out = tmp_path / "report"
    result = _cli("report", str(checkpoint), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"({len(reports)} batches, {PARTITIONS} partitions" in result.stdout
    page = (out / PAGE_NAME).read_text()
    plots = embedded_plots(page)
    assert list(plots) == [name for name, _, _ in PLOTS]  # no standbys in the demo: no standby plots
    for name, png in plots.items():
        check_png(png)
        assert (out / f"{name}.png").read_bytes() == png
    with open_blob_store(str(checkpoint)) as store:
        assert CommitLog(store).read_metadata().query_id in page


def _browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def test_a_headless_browser_renders_the_plots(demo: tuple[Path, list[Any]], tmp_path: Path) -> None:
    from PIL import Image

    if _browser() is None:
        # CI installs Debian's chromium and sets the variable: there the test must run, never skip
        if os.environ.get("BLOBSTATE_REQUIRE_BROWSER") == "1":
            pytest.fail("a headless browser is required (BLOBSTATE_REQUIRE_BROWSER=1) but none is on PATH")
        pytest.skip("no headless browser (apt-get install chromium)")
    checkpoint, _ = demo
    out = tmp_path / "report"
    assert _cli("report", str(checkpoint), "--out", str(out)).returncode == 0
    # The page alone, without its PNG files: everything it shows must be embedded.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(out / PAGE_NAME, alone / PAGE_NAME)
    shot = tmp_path / "screenshot.png"
    browser = _browser()
    assert browser is not None
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1000,1400",
            (alone / PAGE_NAME).as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert shot.exists(), result.stderr[-2000:]
    check_png(shot.read_bytes())
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # matplotlib's first colour (tab:blue, #1f77b4) is only on the page if the plots were drawn.
    blue = int((np.abs(pixels - np.array([0x1F, 0x77, 0xB4])).max(axis=2) < 30).sum())
    assert blue > 500, f"only {blue} plot-coloured pixels in the screenshot"


def test_lineage_of_one_version_names_each_partition(demo: tuple[Path, list[Any]]) -> None:
    checkpoint, reports = demo
    result = _cli("lineage", str(checkpoint), "--version", "5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    with open_blob_store(str(checkpoint)) as store:
        commit = CommitLog(store).read_commit(5)
    op = next(iter(commit.checkpoints))
    for part in data["partitions"]:
        (row,) = part["versions"]
        uid = commit.checkpoints[op][part["partition"]]
        assert row["uid"] == uid and row["snapshot"] is True
        assert row["restore_from"] == f"5_{uid}.snapshot" and row["deltas_to_replay"] == 0
    (version,) = data["versions"]
    assert version["input_rows"] == reports[4].input_rows and version["checkpoint"] == "snapshot"
    assert set(version["partitions"]) == {str(p) for p in range(PARTITIONS)}
