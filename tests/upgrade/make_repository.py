"""Write the backup repository upgrade fixture: a small repository as this release stores it.

Run once per release whose repository formats the upgrade test must keep opening, from the repository
root::

    PYTHONPATH=src python tests/upgrade/make_repository.py

It backs up :func:`source_content` of backups ``1..BACKUPS`` (each a small directory whose files change
from one backup to the next) into a local backup repository in a temporary directory, then copies the
repository to ``tests/upgrade/repository/`` (every object committed and permanent, so there are no TTL
records to copy). The contents are a pure function of the backup number, so a test knows what each
backup held without storing it twice.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKUPS = 3
"""Backups the fixture holds (heads ``1..BACKUPS``)."""


def source_content(backup: int) -> dict[str, bytes]:
    """The files of the directory backed up as backup ``backup``: one file unchanged throughout, one
    rewritten each time, one added per backup, and one removed after the first."""
    files = {
        "CURRENT": b"MANIFEST-000001\n",
        "OPTIONS": f"options of backup {backup}\n".encode() * 40,
    }
    for k in range(1, backup + 1):
        files[f"{k:06d}.sst"] = bytes((k * 31 + i) % 251 for i in range(2000 + 100 * k))
    if backup == 1:
        files["LOG.old"] = b"removed by the second backup\n"
    return files


def write_source(directory: Path, backup: int) -> None:
    """Make ``directory`` hold exactly :func:`source_content` of ``backup``."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for name, data in source_content(backup).items():
        (directory / name).write_bytes(data)


def main() -> None:
    """Write ``tests/upgrade/repository/``."""
    from blobstate.blobstore import open_blob_store
    from blobstate.blobstore.local import TMP_DIR, TTL_DIR
    from blobstate.snapshot.repository import backup_to_repository

    target = HERE / "repository"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repository"
        with open_blob_store(str(repo)) as store:
            for backup in range(1, BACKUPS + 1):
                write_source(Path(tmp) / "source", backup)
                done = backup_to_repository(store, Path(tmp) / "source", metadata={"source": "fixture"})
                assert done.warning is None and done.version == backup
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(repo, target, ignore=shutil.ignore_patterns(TTL_DIR, TMP_DIR))


if __name__ == "__main__":
    main()
