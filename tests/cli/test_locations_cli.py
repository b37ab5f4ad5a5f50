"""Issue 33: a checkpoint location that is a file, or that does not exist, is one ``error:`` line saying
so, on every command that takes a checkpoint URL (not a bare ``NotADirectoryError``, not "metadata.json
is missing")."""

from __future__ import annotations

from pathlib import Path

import pytest

from blobstate.blobstore import (
    LocationNotADirectoryError,
    LocationNotFoundError,
    open_blob_store,
    open_existing_blob_store,
)
from blobstate.cli.main import main

COMMANDS = {
    "verify": ["verify", "{url}"],
    "verify --checksums": ["verify", "{url}", "--checksums"],
    "inspect": ["inspect", "{url}"],
    "inspect --partition": ["inspect", "{url}", "--partition", "0"],
    "lineage": ["lineage", "{url}"],
    "lineage --json": ["lineage", "{url}", "--json"],
    "gc": ["gc", "{url}"],
    "gc --full": ["gc", "{url}", "--full"],
    "rescale": ["rescale", "{url}", "--partitions", "2"],
    "report": ["report", "{url}", "--out", "{tmp}/report"],
    "backup": ["backup", "{tmp}/source", "{url}"],
    "restore": ["restore", "{url}", "{tmp}/restored"],
    "accept-loss": ["accept-loss", "{url}", "--version", "1"],
}
"""Every command taking a checkpoint (or backup repository) URL."""

READERS = [name for name in COMMANDS if name != "backup"]


def _command(name: str, url: str, tmp_path: Path) -> list[str]:
    """The arguments of command ``name`` on ``url`` (for backup, a small source directory made here)."""
    source = tmp_path / "source"
    source.mkdir(exist_ok=True)
    (source / "CURRENT").write_text("MANIFEST-000001\n")
    return [arg.format(url=url, tmp=tmp_path) for arg in COMMANDS[name]]


def _error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 1, args
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, captured.err)
    assert "Traceback" not in captured.err and "NotADirectoryError" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_checkpoint_path_that_is_a_file_is_one_line_saying_so(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_text("{}")
    line = _error_line(_command(command, str(target), tmp_path), capsys)
    assert line.startswith(f"error: {target} is a file, not a checkpoint directory"), line
    assert target.read_text() == "{}"  # nothing written through it


@pytest.mark.parametrize("command", ["lineage", "backup", "verify"])
def test_a_checkpoint_path_below_a_file_names_the_file(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_text("{}")
    line = _error_line(_command(command, str(target / "sub"), tmp_path), capsys)
    assert line.startswith(f"error: {target / 'sub'} cannot be a checkpoint directory: {target} is a file")


@pytest.mark.parametrize("command", READERS)
def test_a_mistyped_checkpoint_path_does_not_exist(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "chekpoint"
    line = _error_line(_command(command, str(target), tmp_path), capsys)
    assert line.startswith(f"error: {target} does not exist"), line
    assert "metadata.json" not in line
    assert not target.exists()  # reading commands create nothing


def test_a_file_url_that_does_not_exist_is_named_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/chekpoint"
    assert _error_line(["lineage", url], capsys).startswith(f"error: {url} does not exist")


def test_an_existing_empty_directory_is_still_not_a_query_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _error_line(["lineage", str(tmp_path)], capsys)
    assert line.startswith(f"error: {tmp_path} is not a query checkpoint (metadata.json is missing)")
    assert "nothing is stored under it (a mistyped path?)" in line


@pytest.mark.parametrize("command", ["lineage", "verify", "report", "gc", "accept-loss"])
def test_an_empty_object_store_prefix_says_nothing_is_stored_there(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An object store has no directories to be missing: a mistyped prefix is one under which nothing is
    stored, and every command that reads a checkpoint says so instead of only "metadata.json is missing"."""
    url = "memory://mistyped-prefix"
    args = [command, url, *(["--version", "3"] if command == "accept-loss" else [])]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code not in (0, None)
    captured = capsys.readouterr()
    said = (captured.out + captured.err).strip()
    assert f"{url} is not a" in said and "nothing is stored under it (a mistyped path?)" in said, said


def test_a_prefix_holding_something_else_is_not_called_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    line = _error_line(["lineage", str(tmp_path)], capsys)
    assert "is not a query checkpoint" in line and "nothing is stored" not in line


def test_backup_still_creates_a_new_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "new" / "repo"
    with pytest.raises(SystemExit) as exited:
        main(_command("backup", str(repo), tmp_path))
    assert exited.value.code in (0, None), capsys.readouterr().err
    assert repo.is_dir()


def test_the_store_refuses_a_file_and_tells_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(LocationNotADirectoryError, match="is a file, not a checkpoint directory"):
        open_blob_store(str(target))
    with pytest.raises(LocationNotADirectoryError, match=f"{target} is a file$"):
        open_blob_store(f"file://{target}/below")
    missing = tmp_path / "missing"
    with pytest.raises(LocationNotFoundError, match=f"^{missing} does not exist$"):
        open_existing_blob_store(str(missing))
    with open_blob_store(str(missing)) as store:  # a writer may open it: the first put creates it
        assert store.location_missing() == f"{missing} does not exist"
        store.put("a", b"1")
        assert store.location_missing() is None
    with open_existing_blob_store("memory://nothing-here") as memory:  # no directories to tell
        assert memory.location_missing() is None
