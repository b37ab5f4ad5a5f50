"""The HTML page and its PNG plots, drawn from a commit log written through the real commit log API."""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from report_helpers import write_checkpoint

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.report.metrics import load_batch_metrics
from blobstate.report.render import PAGE_NAME, PLOTS, STANDBY_PLOTS, ReportError, render_plots

DATA_URI = re.compile(r'<section id="([a-z_]+)">.*?src="data:image/png;base64,([A-Za-z0-9+/=]+)"', re.S)


def check_png(data: bytes) -> tuple[int, int]:
    """Decode a PNG; assert it is of a sensible size and not blank (its pixels vary). Returns its size."""
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(data))
    image.load()
    assert image.format == "PNG"
    width, height = image.size
    assert 600 <= width <= 2000 and 200 <= height <= 2000, image.size
    variance = ImageStat.Stat(image.convert("L")).var[0]
    assert variance > 100, f"blank-looking plot (pixel variance {variance:.1f})"
    return image.size


def embedded_plots(page: str) -> dict[str, bytes]:
    """Section id -> the PNG bytes its data URI holds."""
    return {name: base64.b64decode(data) for name, data in DATA_URI.findall(page)}


def test_the_page_embeds_every_plot_and_writes_the_pngs(tmp_path: Path, capsys) -> None:
    url = str(tmp_path / "checkpoint")
    with open_blob_store(url) as store:
        meta = write_checkpoint(store, versions=5)
    out = tmp_path / "report"
    main_exit = None
    try:
        main(["report", url, "--out", str(out)])
    except SystemExit as exited:
        main_exit = exited.code
    assert main_exit in (None, 0)
    assert "wrote" in capsys.readouterr().out

    page = (out / PAGE_NAME).read_text()
    plots = embedded_plots(page)
    names = [name for name, _, _ in PLOTS + STANDBY_PLOTS]  # the log carries standby metrics
    assert list(plots) == names
    for name, png in plots.items():
        check_png(png)
        assert (out / f"{name}.png").read_bytes() == png
    for _, title, _ in PLOTS + STANDBY_PLOTS:
        assert f"<h2>{title}</h2>" in page
    assert meta.query_id in page and "1 to a standby" in page
    assert "<td>-</td>" in page  # version 1 predates the metrics


def test_no_standby_plots_without_standbys(tmp_path: Path) -> None:
    with open_blob_store(str(tmp_path / "checkpoint")) as store:
        write_checkpoint(store, versions=3, no_metrics=(1, 2, 3))
        _, rows = load_batch_metrics(store)
    assert [p.name for p in render_plots(rows)] == [name for name, _, _ in PLOTS]


def test_missing_matplotlib_is_one_error_with_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with open_blob_store(str(tmp_path / "checkpoint")) as store:
        write_checkpoint(store, versions=2)
        _, rows = load_batch_metrics(store)
    with pytest.raises(ReportError, match=r"pip install 'blobstate\[report\]'"):
        render_plots(rows)
    with pytest.raises(SystemExit) as exited:
        main(["report", str(tmp_path / "checkpoint"), "--out", str(tmp_path / "out")])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blobstate[report]" in err[0]
    assert not (tmp_path / "out").exists()


def test_an_empty_checkpoint_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    url = str(tmp_path / "checkpoint")
    with open_blob_store(url) as store:
        write_checkpoint(store, versions=0)
    with pytest.raises(SystemExit):
        main(["report", url, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert err.startswith("error: ") and url in err and "no committed versions" in err


def test_json_names_the_files_and_a_rerun_leaves_no_stale_plot(tmp_path: Path, capsys) -> None:
    url = str(tmp_path / "checkpoint")
    out = tmp_path / "report"
    with open_blob_store(url) as store:
        write_checkpoint(store, versions=3)
    main_args = ["report", url, "--out", str(out), "--json"]
    with pytest.raises(SystemExit) as exited:
        main(main_args)
    assert exited.value.code in (None, 0)
    first = json.loads(capsys.readouterr().out)
    assert first["page"] == str(out / PAGE_NAME) and first["versions"] == [1, 2, 3]
    assert [Path(p).name for p in first["plots"]] == [f"{n}.png" for n, _, _ in PLOTS + STANDBY_PLOTS]

    # the same directory, for a checkpoint without standbys: the standby PNGs go
    url2 = str(tmp_path / "checkpoint2")
    with open_blob_store(url2) as store:
        write_checkpoint(store, versions=2, no_metrics=(1, 2))
    with pytest.raises(SystemExit):
        main(["report", url2, "--out", str(out), "--json"])
    second = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.glob("*.png")) == sorted(Path(p).name for p in second["plots"])
    assert not (out / "standby_lag.png").exists()


def test_many_versions_are_drawn_as_steps(tmp_path: Path) -> None:
    from blobstate.report.render import MAX_BARS

    with open_blob_store(str(tmp_path / "checkpoint")) as store:
        write_checkpoint(store, versions=MAX_BARS + 10)
        _, rows = load_batch_metrics(store, state_sizes=False)
    plots = render_plots(rows)
    assert [p.name for p in plots] == [name for name, _, _ in PLOTS + STANDBY_PLOTS]
    for plot in plots:
        check_png(plot.png)


def test_the_header_and_table_count_batches_and_the_state_size_caption_matches_its_series(
    tmp_path: Path,
) -> None:
    """The header says how many operators there are (an operator id of 0 is not a count of 0), batches
    are numbered as Spark numbers them, and the state size plot promises the snapshots' file sizes only
    when it draws them: with background snapshots (named by a later commit) it does."""
    from report_helpers import write_background_checkpoint

    from blobstate.report.metrics import load_batch_metrics as load
    from blobstate.report.render import STATE_FILES_CAPTION, page_html

    url = str(tmp_path / "checkpoint")
    write_background_checkpoint(url, tmp_path / "local", versions=5, every=2)
    with open_blob_store(url) as store:
        summary, rows = load(store)
        _, without_sizes = load(store, state_sizes=False)
    captions = {p.name: p.caption for p in render_plots(rows)}
    assert captions["state_size"].endswith(STATE_FILES_CAPTION)
    assert STATE_FILES_CAPTION not in {p.name: p.caption for p in render_plots(without_sizes)}["state_size"]

    page = page_html(summary, rows, [])
    assert "<th>operators</th><td>1 (id 0)</td>" in page
    assert "<th>batches</th><td>5 committed, 0 .. 4 (versions 1 .. 5)</td>" in page
    assert "<th>snapshots</th><td>2 partition snapshots committed</td>" in page
    assert "<tr><th>batch</th><th>version</th>" in page
    assert "<tr><td>1</td><td>2</td>" in page and "<td>snapshot</td></tr><tr><td>2</td><td>3</td>" in page


def test_the_header_counts_failovers_as_the_plot_draws_them() -> None:
    """Cold failovers are in the header as in the plot, and a task Spark ran elsewhere while its executor
    lived is no failover in either."""
    from blobstate.report.metrics import Move, StandbyMetrics
    from blobstate.report.render import failover_summary

    def batch(failovers: int, cold: int, moves: tuple[Move, ...]) -> Any:
        standby = StandbyMetrics(
            replicas=1,
            failovers=failovers,
            failovers_without_standby=cold,
            active_failures=failovers + cold,
            standby_failures=0,
            moves=moves,
            max_lag_versions=0,
            lag_versions={},
            sync_bytes=0,
        )
        return SimpleNamespace(standby=standby)

    elsewhere = Move(3, "1", "0", "elsewhere", "127.0.0.4", "127.0.0.3")
    rows = [batch(0, 0, (elsewhere,)), batch(2, 1, ()), batch(0, 3, ())]
    assert failover_summary(rows) == (
        "2 to a standby, 4 cold (no standby); 1 task(s) Spark ran on another executor while theirs lived "
        "(no failover)"
    )
    assert "no failover" in elsewhere.describe() and not elsewhere.failover
