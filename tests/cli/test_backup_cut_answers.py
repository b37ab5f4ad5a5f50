"""``blobstate backup`` against S3 whose answers are cut: a backup that committed never reports failure."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import app
from blobstate.snapshot.repository import read_snapshot, verify_repository
from faultproxy import FaultProxy

runner = CliRunner()


def test_a_committed_backup_whose_cleanup_cannot_finish_warns_exits_0_and_gc_finishes_it(
    s3_cut_url: str, s3_fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a").write_bytes(b"state " * 100)
    # Every answer to a tagging request is cut: the post-commit cleanup cannot make the snapshot
    # permanent, after the head that commits the backup was written.
    s3_fault_proxy.cut_when(lambda method, target: "tagging" in target)
    try:
        result = runner.invoke(app, ["backup", str(source), s3_cut_url, "--json"])
    finally:
        s3_fault_proxy.disarm()
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "backup 1" in warnings[0] and "committed" in warnings[0] and "blobstate gc" in warnings[0]
    assert "root/" in warnings[0] and "127.0.0.1" in warnings[0]  # names the key and endpoint
    done = json.loads(result.stdout)
    with open_blob_store(s3_cut_url) as store:
        assert read_snapshot(store).name == done["snapshot"]
        assert any("still pending" in p.message for p in verify_repository(store).problems)
    gc = runner.invoke(app, ["gc", s3_cut_url, "--install-lifecycle"])
    assert gc.exit_code == 0, gc.output
    with open_blob_store(s3_cut_url) as store:
        assert verify_repository(store, checksums=True).problems == []
