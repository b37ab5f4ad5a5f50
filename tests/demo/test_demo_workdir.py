"""The demo's work directory: an earlier demo's files are replaced, a user's own files never deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from blobstate.demo.run import DemoWorkdirError, clear_workdir
from blobstate.errors import ConfigurationError


def test_a_directory_holding_a_file_the_demo_did_not_write_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DemoWorkdirError, match=r"holds 'notes.txt', which the demo did not write") as caught:
        clear_workdir(tmp_path)
    assert isinstance(caught.value, ConfigurationError)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "checkpoint").is_dir()


def test_an_earlier_demo_s_files_are_deleted_and_the_directory_kept(tmp_path: Path) -> None:
    for name in ("checkpoint", "input", "local", "output", "profiles"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "f").write_text("x")
    (tmp_path / "job.log").write_text("log")
    clear_workdir(tmp_path)
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


def test_a_new_directory_is_created_and_a_link_in_place_of_one_is_refused(tmp_path: Path) -> None:
    clear_workdir(tmp_path / "a" / "demo")
    assert (tmp_path / "a" / "demo").is_dir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious").write_text("keep")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(DemoWorkdirError, match="is not a directory"):
        clear_workdir(tmp_path / "link")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "output").symlink_to(target)  # a known name that is a link: not the demo's
    with pytest.raises(DemoWorkdirError, match="holds 'output'"):
        clear_workdir(tmp_path / "b")
    assert (target / "precious").read_text() == "keep"
