"""What restore may change: never the repository it reads, nothing unasked, no privileged mode bits."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from snapshot_helpers import read_tree, write_tree

from blobstate.blobstore import BlobStore, open_blob_store
from blobstate.snapshot import DirIndex, SnapshotIndex, backup_directory, restore_directory
from blobstate.snapshot.restore import TEMP_MARKER, RestoreTargetError, check_restore_target, restored_mode


def backup(store: BlobStore, src: Path) -> SnapshotIndex:
    return backup_directory(
        store,
        src,
        index_name="1_00000001.snapshot",
        blob_prefix="blobs/",
        previous=None,
        previous_name=None,
        checkpoint_id="1_00000001",
    ).index


def with_mode(index: SnapshotIndex, mode: int) -> SnapshotIndex:
    """``index`` with every file of its root directory recorded with ``mode``."""
    files = tuple(replace(f, metadata=replace(f.metadata, mode=mode)) for f in index.dir_index.files_present)
    return replace(index, dir_index=replace(index.dir_index, files_present=files))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize(("recorded", "restored"), [(0o6777, 0o755), (0o4755, 0o755), (0o1666, 0o644)])
def test_restore_sets_no_setuid_setgid_sticky_or_group_write_bits(
    mem_store: BlobStore, tmp_path: Path, recorded: int, restored: int
) -> None:
    index = with_mode(backup(mem_store, write_tree(tmp_path / "src", {"a.sst": b"a", "b": b"b"})), recorded)
    target = tmp_path / "t"
    restore_directory(mem_store, index, target)  # downloaded files
    assert mode_of(target / "a.sst") == mode_of(target / "b") == restored == restored_mode(recorded)
    # Files kept because their content matches get their bits fixed the same way.
    os.chmod(target / "a.sst", 0o6777)
    restore_directory(mem_store, index, target)
    assert mode_of(target / "a.sst") == restored


def test_restore_keeps_the_recorded_bits_it_allows(mem_store: BlobStore, tmp_path: Path) -> None:
    index = with_mode(backup(mem_store, write_tree(tmp_path / "src", {"a.sst": b"a"})), 0o640)
    restore_directory(mem_store, index, tmp_path / "t")
    assert mode_of(tmp_path / "t" / "a.sst") == 0o640


def test_without_delete_extra_a_target_with_other_files_is_refused_untouched(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    index = backup(mem_store, write_tree(tmp_path / "src", {"a.sst": b"new", "sub/b": b"b"}))
    target = write_tree(tmp_path / "t", {"a.sst": b"old", "notes.txt": b"mine", "photos/1.jpg": b"jpg"})
    os.symlink("/etc", target / "etc-link")
    before = read_tree(target)
    with pytest.raises(RestoreTargetError) as info:
        restore_directory(mem_store, index, target, delete_extra=False)
    message = str(info.value)
    assert "3 entries" in message
    for name in ("notes.txt", "photos", "etc-link"):
        assert repr(name) in message
    assert read_tree(target) == before


def test_without_delete_extra_leftovers_of_a_crashed_restore_are_still_cleaned(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    index = backup(mem_store, write_tree(tmp_path / "src", {"a.sst": b"a"}))
    target = write_tree(tmp_path / "t", {f".a.sst{TEMP_MARKER}0123.abcd.part": b"half"})
    stats = restore_directory(mem_store, index, target, delete_extra=False)
    assert stats.files_deleted == 1
    assert read_tree(target) == read_tree(tmp_path / "src")


def test_a_directory_where_the_snapshot_wants_one_is_never_followed_through_a_symlink(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    index = backup(mem_store, write_tree(tmp_path / "src", {"sub/a.sst": b"a"}))
    outside = write_tree(tmp_path / "outside", {"precious": b"keep", "a.sst": b"keep too"})
    before = read_tree(outside)
    target = tmp_path / "t"
    target.mkdir()
    os.symlink(outside, target / "sub")
    restore_directory(mem_store, index, target)
    assert read_tree(target) == read_tree(tmp_path / "src")
    assert read_tree(outside) == before


def local_repository(root: Path) -> BlobStore:
    store = open_blob_store(str(root))
    store.put("0_precious", b"the repository's own object")
    return store


@pytest.mark.parametrize("where", ["target", "target/deeper/repo"])
def test_a_target_containing_the_repository_is_refused(tmp_path: Path, where: str) -> None:
    source = write_tree(tmp_path / "src", {"a.sst": b"a"})
    target = write_tree(tmp_path / "target", {"mine": b"mine"})
    with local_repository(tmp_path / where) as store:
        index = backup(store, source)
        before = read_tree(target)
        with pytest.raises(RestoreTargetError, match="contains the repository"):
            restore_directory(store, index, target)
        assert read_tree(target) == before
        assert store.get("0_precious") == b"the repository's own object"


def test_a_target_inside_the_repository_is_refused(tmp_path: Path) -> None:
    with local_repository(tmp_path / "repo") as store:
        index = backup(store, write_tree(tmp_path / "src", {"a.sst": b"a"}))
        with pytest.raises(RestoreTargetError, match="inside the repository"):
            restore_directory(store, index, tmp_path / "repo" / "blobs")
        assert store.get("0_precious") == b"the repository's own object"


def test_paths_are_compared_after_resolving_symlinks(tmp_path: Path) -> None:
    (tmp_path / "data" / "repo").mkdir(parents=True)
    os.symlink(tmp_path / "data", tmp_path / "alias")
    with open_blob_store(str(tmp_path / "alias" / "repo")) as store:
        with pytest.raises(RestoreTargetError):
            check_restore_target(store, tmp_path / "data")
        with pytest.raises(RestoreTargetError):
            check_restore_target(store, f"{tmp_path}/data/./repo/../repo/x")
        check_restore_target(store, tmp_path / "elsewhere")  # no overlap: allowed
        check_restore_target(store, tmp_path / "data" / "repo-sibling")


def test_other_stores_have_no_local_root_to_protect(mem_store: BlobStore, tmp_path: Path) -> None:
    check_restore_target(mem_store, tmp_path)


def test_an_empty_snapshot_restored_with_delete_extra_empties_only_the_target(
    mem_store: BlobStore, tmp_path: Path
) -> None:
    index = replace(backup(mem_store, write_tree(tmp_path / "src", {"a": b"a"})), dir_index=DirIndex(""))
    target = write_tree(tmp_path / "t", {"x": b"x", "d/y": b"y"})
    os.symlink(tmp_path / "src", target / "link")
    stats = restore_directory(mem_store, index, target)
    assert (stats.files_deleted, stats.dirs_deleted) == (3, 1)
    assert os.listdir(target) == []
    assert (tmp_path / "src" / "a").read_bytes() == b"a"


MOUNTED_RESTORE = """
import sys, uuid
from pathlib import Path
from blobstate.blobstore import open_blob_store
from blobstate.snapshot import backup_directory, restore_directory
from blobstate.snapshot.restore import RestoreTargetError

tmp = Path(sys.argv[1])
store = open_blob_store(f"memory://{uuid.uuid4().hex}")
index = backup_directory(store, tmp / "src", index_name="1_00000001.snapshot", blob_prefix="blobs/",
                         previous=None, previous_name=None, checkpoint_id="1_00000001").index
try:
    restore_directory(store, index, tmp / "target")
except RestoreTargetError as error:
    print("refused:", error)
"""


def test_restore_never_deletes_across_a_mount_point(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    write_tree(tmp_path / "src", {"a.sst": b"a"})
    mounted = tmp_path / "target" / "mounted"
    mounted.mkdir(parents=True)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a tmpfs in a private mount namespace")
    script = (
        f"mount -t tmpfs none {mounted} && echo precious > {mounted}/file && "
        f"{sys.executable} -c '{MOUNTED_RESTORE}' {tmp_path} && cat {mounted}/file"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env)
    if "mount" in run.stderr and run.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    assert "refused:" in run.stdout and "another filesystem" in run.stdout and "mounted" in run.stdout
    assert run.stdout.strip().endswith("precious")  # the mounted filesystem's file is still there
