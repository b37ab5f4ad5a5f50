"""``blobstate report --out DIR`` never writes through a link and never replaces a file it did not write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_helpers import write_checkpoint

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.report.output import MANIFEST_NAME, ReportOutputError, read_manifest, write_outputs
from blobstate.report.render import PAGE_NAME, PLOTS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A checkpoint without standby metrics: the report draws the six main plots only."""
    url = str(tmp_path_factory.mktemp("report-output") / "checkpoint")
    with open_blob_store(url) as store:
        write_checkpoint(store, versions=3, no_metrics=(1, 2, 3))
    return url


def report(url: str, out: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str]]:
    """Run ``blobstate report``; its exit status and its stderr lines."""
    code = 0
    try:
        main(["report", url, "--out", str(out), *flags])
    except SystemExit as exited:
        code = exited.code or 0
    return int(code), capsys.readouterr().err.strip().splitlines()


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if "blobstate-report-" in p.name]


def test_a_link_at_an_output_name_is_refused_and_force_replaces_the_link_not_its_target(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.html"
    victim.write_text("the user's own page")
    out = tmp_path / "report"
    out.mkdir()
    (out / PAGE_NAME).symlink_to("../victim.html")

    code, err = report(checkpoint, out, capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: {out / PAGE_NAME} is a symbolic link") and "--force" in err[0]
    assert victim.read_text() == "the user's own page"
    assert (out / PAGE_NAME).is_symlink() and sorted(p.name for p in out.iterdir()) == [PAGE_NAME]
    assert leftovers(tmp_path) == []

    code, err = report(checkpoint, out, capsys, "--force")
    assert code == 0, err
    assert victim.read_text() == "the user's own page"
    assert not (out / PAGE_NAME).is_symlink() and "<!DOCTYPE html>" in (out / PAGE_NAME).read_text()
    assert read_manifest(out) == {PAGE_NAME, *(f"{n}.png" for n, _, _ in PLOTS)}
    assert leftovers(tmp_path) == []


def test_files_the_report_did_not_write_are_refused_unless_forced(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / PAGE_NAME).write_text("my own index")
    (out / "latency.png").write_bytes(b"my own plot")

    code, err = report(checkpoint, out, capsys)
    assert code == 1 and len(err) == 1, err
    assert "did not write it" in err[0] and "(and 1 more)" in err[0] and "nothing in" in err[0]
    assert (out / PAGE_NAME).read_text() == "my own index"
    assert (out / "latency.png").read_bytes() == b"my own plot"
    assert not (out / MANIFEST_NAME).exists()


def test_force_replaces_files_the_report_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("my own index")
    with pytest.raises(ReportOutputError, match="did not write it"):
        write_outputs(out, {"index.html": b"page"})
    write_outputs(out, {"index.html": b"page"}, force=True)
    assert (out / "index.html").read_bytes() == b"page" and read_manifest(out) == {"index.html"}


def test_a_rerun_replaces_its_own_files_and_leaves_everything_else(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code, err = report(checkpoint, out, capsys)
    assert code == 0, err
    assert json.loads((out / MANIFEST_NAME).read_text())["written_by"] == "blobstate report"
    # beside the report: the user's notes, and a PNG named like a plot this report does not draw
    (out / "notes.txt").write_text("mine")
    (out / "standby_lag.png").write_bytes(b"mine too")
    code, err = report(checkpoint, out, capsys)
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "standby_lag.png").read_bytes() == b"mine too"
    assert leftovers(tmp_path) == []


def test_files_an_earlier_report_listed_and_this_one_does_not_write_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_outputs(out, {"index.html": b"1", "a.png": b"a", "b.png": b"b"})
    (out / "mine.png").write_bytes(b"mine")
    write_outputs(out, {"index.html": b"2", "a.png": b"a2"})
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST_NAME, "a.png", "index.html", "mine.png"])
    assert read_manifest(out) == {"index.html", "a.png"}
    assert (out / "index.html").read_bytes() == b"2"


def test_an_output_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)
    with pytest.raises(ReportOutputError, match="is a symbolic link"):
        write_outputs(tmp_path / "out", {"index.html": b"x"}, force=True)
    assert list(real.iterdir()) == [] and leftovers(tmp_path) == []


def test_a_directory_at_an_output_name_is_refused_even_with_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "index.html").mkdir(parents=True)
    with pytest.raises(ReportOutputError, match="is a directory: nothing in"):
        write_outputs(out, {"index.html": b"x", "a.png": b"a"}, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]


def test_a_manifest_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST_NAME).write_text('{"files": ["../../etc/passwd"]}')
    (out / "index.html").write_text("mine")
    with pytest.raises(ReportOutputError, match="is not a list of files blobstate report wrote"):
        write_outputs(out, {"index.html": b"x"})
    assert (out / "index.html").read_text() == "mine"
