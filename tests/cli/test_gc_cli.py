"""``blobstate gc`` as a user runs it: checkpoints, other locations, and S3 expiry."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import app

runner = CliRunner()


def _checkpoint(url: str) -> None:
    from blobstate.lineage.commitlog import CommitLog, QueryMetadata

    CommitLog(open_blob_store(url)).write_metadata(QueryMetadata.new(1, {"0": {"key_columns": ["k"]}}))


def test_gc_on_s3_fails_until_the_lifecycle_rule_is_installed(s3_url: str) -> None:
    _checkpoint(s3_url)
    missing = runner.invoke(app, ["gc", s3_url])
    assert missing.exit_code == 1 and "--install-lifecycle" in missing.output
    installed = runner.invoke(app, ["gc", s3_url, "--install-lifecycle", "--json"])
    assert installed.exit_code == 0, installed.output
    assert json.loads(installed.stdout)["expiry_problem"] is None
    assert runner.invoke(app, ["gc", s3_url]).exit_code == 0


def test_gc_on_a_location_that_is_neither_checkpoint_nor_repository_deletes_nothing(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "precious").write_bytes(b"x")
    result = runner.invoke(app, ["gc", str(tmp_path), "--full"])
    assert result.exit_code != 0
    assert (tmp_path / "blobs" / "precious").exists()


def test_gc_full_on_a_backup_repository_keeps_the_newest_snapshot_restorable(tmp_path: Path) -> None:
    """Finding 1: ``gc --full`` on a repository made by ``blobstate backup``."""
    import os

    source = tmp_path / "source"
    source.mkdir()
    repo = str(tmp_path / "repo")
    first_head = tmp_path / "repo" / "heads" / "1.json"
    kept = b""
    for round_ in range(3):
        for i in range(3):
            (source / f"file-{i}").write_bytes(os.urandom(2000 + round_))
        assert runner.invoke(app, ["backup", str(source), repo]).exit_code == 0
        if round_ == 0:
            kept = first_head.read_bytes()
    # The third backup pruned heads/1.json (below its horizon); put it back as a crash part-way through
    # the pruning would have left it.
    assert not first_head.exists()
    first_head.write_bytes(kept)
    dry = runner.invoke(app, ["gc", repo, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would prune 1 head below the horizon (heads/1.json)" in dry.output
    result = runner.invoke(app, ["gc", repo, "--full", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["heads_pruned"] == [1] and not first_head.exists()
    verified = runner.invoke(app, ["verify", repo, "--checksums"])
    assert verified.exit_code == 0 and "ok" in verified.output, verified.output
    assert "read 2 head records (from the horizon 2: older heads are pruned)" in verified.output
    target = tmp_path / "restored"
    restored = runner.invoke(app, ["restore", repo, str(target)])
    assert restored.exit_code == 0, restored.output
    assert {p.name: p.read_bytes() for p in target.iterdir()} == {
        p.name: p.read_bytes() for p in source.iterdir()
    }
