"""The ``blobstate`` entry point: one error line naming the object, the traceback only with --debug."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main


def _broken_checkpoint(root: Path) -> str:
    """A checkpoint whose newest commit was changed after it was written."""
    from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
    from blobstate.lineage.refs import ObjectRef, PartitionObjects

    url = str(root / "checkpoint")
    store = open_blob_store(url)
    log = CommitLog(store)
    log.write_metadata(QueryMetadata.new(1, {"0": {"key_columns": ["k"]}}))
    refs = PartitionObjects(ObjectRef.of(b"delta"))
    log.write_commit(
        Commit(
            version=1,
            checkpoints={"0": {0: "ab" * 16}},
            writer="w",
            objects={"0": {0: refs}},
            retained_from=1,
        )
    )
    raw = json.loads(store.get("commits/1.json"))
    raw["watermark_ms"] = 5
    store.put("commits/1.json", json.dumps(raw).encode())
    return url


def test_an_error_is_one_line_naming_the_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _broken_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["lineage", url])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "commits/1.json" in lines[0] and "--debug" in lines[0]
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _broken_checkpoint(tmp_path)
    with pytest.raises(SystemExit):
        main(["lineage", url, "--debug"])
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_the_console_script_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    url = _broken_checkpoint(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "blobstate.cli.main", "verify", url],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=False,
    )
    assert result.returncode == 1
    assert "commits/1.json" in result.stderr and "Traceback" not in result.stderr


def test_version_names_the_release_and_every_stored_format(capsys: pytest.CaptureFixture[str]) -> None:
    from blobstate import __version__
    from blobstate.formats import plain_lines
    from blobstate.lineage.commitlog import COMMIT_FORMATS_READ, METADATA_FORMAT_VERSION

    # Issue 32: every release called itself 0.1.0 although releases read and write different formats.
    assert __version__ != "0.1.0"
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    first, *rest = capsys.readouterr().out.strip().splitlines()
    assert first.split(" (")[0] == f"blobstate {__version__}"
    assert [line.strip() for line in rest[1:]] == plain_lines()
    lines = [line.strip() for line in rest[1:]]
    assert f"metadata.json: writes {METADATA_FORMAT_VERSION}; reads {METADATA_FORMAT_VERSION}" in lines
    reads = ", ".join(str(v) for v in COMMIT_FORMATS_READ)
    assert any(
        line.startswith("commits/<v>.json: writes 3") and line.endswith(f"reads {reads}") for line in lines
    )
    for what in ("deltas", "snapshot indexes", "backup repository marker", "backup heads"):
        assert any(line.startswith(what) for line in lines), (what, lines)


def test_version_says_when_the_installed_metadata_names_another_release(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.metadata

    from blobstate import __version__

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1")
    with pytest.raises(SystemExit):
        main(["--version"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"blobstate {__version__} (installed metadata says 0.0.1: reinstall blobstate)"


def test_the_release_is_written_once() -> None:
    """``blobstate.__version__`` is the only place the release is written: ``pyproject.toml`` reads it
    (setuptools' ``attr``), ``setup.py`` names none, and the README's examples show it."""
    import re
    import tomllib

    from blobstate import __version__

    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "blobstate.__version__"}
    assert "version=" not in (root / "setup.py").read_text().replace(" ", "")
    readme = (root / "README.md").read_text()
    shown = set(re.findall(r"blobstate[- ](\d+\.\d+\.\d+)", readme))
    assert shown == {__version__}, shown


def test_the_readme_shows_the_stored_formats_version_prints() -> None:
    """The README's "Stored formats" table is the one ``blobstate --version`` prints from."""
    from blobstate.formats import STORED_FORMATS, markdown_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| object | version written | versions read |") :]
    table = table[: table.index("\n\n") + 1]
    assert table == markdown_table()
    assert len(STORED_FORMATS) == table.count("\n") - 2 >= 5


def test_a_command_s_own_version_option_is_not_the_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _broken_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["lineage", url, "--version", "1"])
    assert exited.value.code == 1 and "commits/1.json" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["backup", "restore", "inspect", "lineage", "verify", "gc", "report"])
def test_a_command_s_help_names_every_location_it_accepts(command: str) -> None:
    from typer.testing import CliRunner

    from blobstate.cli.main import app

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for scheme in ("file://", "s3://", "az://", "abfss://", "abfs://", "memory://"):
        assert scheme in result.output, f"{command} --help does not name {scheme}"
