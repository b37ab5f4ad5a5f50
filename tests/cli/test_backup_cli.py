"""``blobstate backup / restore / inspect / gc`` on a real RocksDB checkpoint, on every backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blobstate.cli.main import app
from blobstate.state.store import RocksStateStore

runner = CliRunner()


def _run(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fill(store: RocksStateStore, start: int, count: int) -> None:
    for i in range(start, start + count):
        store.put("values", b"key-%08d" % i, os.urandom(64))
    store.flush()


def test_checkpoint_round_trips_byte_identical_and_second_backup_is_incremental(
    blob_store_url: str, tmp_path: Path
) -> None:
    db = RocksStateStore.open(tmp_path / "db")
    _fill(db, 0, 5000)
    first_checkpoint = db.checkpoint(tmp_path / "ckpt1")

    first = _run("backup", str(first_checkpoint), blob_store_url)
    assert first["files_uploaded"] == len(_tree(first_checkpoint))

    _fill(db, 5000, 500)
    second_checkpoint = db.checkpoint(tmp_path / "ckpt2")
    db.close()
    old_ssts = {n for n in _tree(first_checkpoint) if n.endswith(".sst")}
    new_files = _tree(second_checkpoint)
    second = _run("backup", str(second_checkpoint), blob_store_url)
    uploaded = {Path(p).name for p in second["uploaded"]}
    # Only the SSTs that are new since the first backup, plus every mutable file, went up again.
    assert uploaded == {n for n in new_files if not n.endswith(".sst") or n not in old_ssts}
    assert second["files_retained"] == len(old_ssts & set(new_files))

    target = tmp_path / "restored"
    restored = _run("restore", blob_store_url, str(target))
    assert restored["snapshot"] == second["snapshot"]
    assert _tree(target) == new_files

    # Restoring again over an identical directory moves nothing.
    again = _run("restore", blob_store_url, str(target))
    assert again["bytes_downloaded"] == 0
    assert again["files_reused"] == len(new_files)
    with RocksStateStore.open(target) as reopened:
        assert sum(1 for _ in reopened.items("values")) == 5500

    inspected = _run("inspect", blob_store_url)
    assert inspected["snapshot"] == second["snapshot"]
    assert _run("gc", blob_store_url)["expired"] == []


def test_restore_of_an_empty_repository_names_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["restore", str(tmp_path / "nothing"), str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "no snapshot" in result.output


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_progress_is_not_printed_in_json_mode(command: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "CURRENT").write_text("MANIFEST-000001\n")
    _run("backup", str(source), str(tmp_path / "repo"))
    if command == "restore":
        _run("restore", str(tmp_path / "repo"), str(tmp_path / "out"))
