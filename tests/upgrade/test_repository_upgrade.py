"""A backup repository written by an earlier release (``repository/``, from ``make_repository.py``, head
format 1, blobs under ``blobs/``, no guard) opens in this one: it verifies and restores as it is, and
backups continue on it, after which its old heads are pruned like any others, it has the guard and its
blobs have moved to ``data/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from make_repository import BACKUPS, source_content, write_source

from blobstate.blobstore import open_blob_store
from blobstate.snapshot.heads import HEAD_FORMAT_VERSION, HeadLog, HeadLogError, head_name
from blobstate.snapshot.repository import (
    BLOB_PREFIX,
    FORMER_BLOB_PREFIX,
    GUARD_INDEX,
    backup_to_repository,
    gc_repository,
    read_snapshot,
    restore_repository,
    root_indexes,
    verify_repository,
)

HERE = Path(__file__).parent


def restored(store: object, target: Path) -> dict[str, bytes]:
    restore_repository(store, target)  # type: ignore[arg-type]
    return {p.name: p.read_bytes() for p in target.iterdir()}


def test_a_repository_of_the_earlier_release_verifies_restores_and_continues(tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    shutil.copytree(HERE / "repository", repo)
    with open_blob_store(str(repo)) as store:
        heads = HeadLog(store).read_all()
        assert [(h.version, h.format_version, h.horizon) for h in heads] == [(v, 1, 1) for v in (1, 2, 3)]
        assert store.list(FORMER_BLOB_PREFIX) and not store.exists(GUARD_INDEX)
        result = verify_repository(store, checksums=True)
        assert result.problems == [] and (result.version, result.heads) == (BACKUPS, BACKUPS)
        assert restored(store, tmp_path / "as-stored") == source_content(BACKUPS)

        for backup in (BACKUPS + 1, BACKUPS + 2):
            write_source(tmp_path / "source", backup)
            done = backup_to_repository(store, tmp_path / "source")
            assert done.warning is None and done.version == backup
            assert (done.head.format_version, done.head.horizon) == (HEAD_FORMAT_VERSION, backup - 1)
            if backup == BACKUPS + 1:
                # Its unchanged SSTs were uploaded again, under data/; its cleanup deleted blobs/.
                assert done.result.stats.files_retained == 0 and store.list(FORMER_BLOB_PREFIX) == []
                assert store.exists(GUARD_INDEX)
            else:
                assert done.result.stats.files_retained == BACKUPS + 1
        # The first new backup pruned the old heads below its horizon, the second the last old one.
        assert store.list("heads/") == [head_name(BACKUPS + 1), head_name(BACKUPS + 2)]
        assert verify_repository(store, checksums=True).problems == []
        assert restored(store, tmp_path / "continued") == source_content(BACKUPS + 2)
        gc_repository(store, full=True)
        newest = read_snapshot(store)
        assert root_indexes(store) == [newest.name] and store.exists(GUARD_INDEX)
        assert set(store.list(BLOB_PREFIX)) == newest.index.present_blob_ids()


def test_a_missing_head_of_the_earlier_release_is_a_hole(tmp_path: Path) -> None:
    """Its heads have no horizon: its log was never pruned, so a missing head 1 is damage."""
    repo = tmp_path / "repository"
    shutil.copytree(HERE / "repository", repo)
    (repo / "heads" / "1.json").unlink()
    with open_blob_store(str(repo)) as store:
        with pytest.raises(HeadLogError, match=r"hole: heads/1\.json missing"):
            read_snapshot(store)
        (problem,) = verify_repository(store).problems
        assert "hole: heads/1.json" in problem.message
