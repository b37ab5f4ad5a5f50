"""Local-directory store specifics: TTL records, expiry, temporary files, directories, symlinks, URLs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from blobstate.blobstore import BlobStoreError, InvalidBlobNameError, open_blob_store
from blobstate.blobstore.local import STALE_TMP_SECONDS, TMP_DIR, TTL_DIR, LocalBlobStore


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> LocalBlobStore:
    s = open_blob_store(f"file://{root}")
    assert isinstance(s, LocalBlobStore)
    return s


def test_urls_and_plain_paths_open_the_same_directory(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_blob_store(str(root)).put("a/b", b"1")
    assert open_blob_store(f"file://{root}").get("a/b") == b"1"
    assert open_blob_store(f"file://localhost{root}").get("a/b") == b"1"
    monkeypatch.chdir(root.parent)
    relative = open_blob_store(root.name)
    assert isinstance(relative, LocalBlobStore)
    assert relative.root == root
    assert relative.get("a/b") == b"1"
    with pytest.raises(ValueError, match="names host"):
        open_blob_store("file://otherhost/data")


def test_opening_does_not_create_the_directory(root: Path) -> None:
    store = open_blob_store(str(root))
    assert store.list() == []
    assert not store.exists("x")
    assert not root.exists()


def test_ttl_is_recorded_under_the_reserved_directory(store: LocalBlobStore, root: Path) -> None:
    before = time.time()
    store.put("state/0/1/3_u.delta", b"d", ttl=600)
    record = root / TTL_DIR / "state/0/1/3_u.delta"
    assert before + 600 <= float(record.read_text()) <= time.time() + 600
    assert (root / "state/0/1/3_u.delta").read_bytes() == b"d"
    store.remove_ttl("state/0/1/3_u.delta")
    assert not record.exists()
    assert not (root / TTL_DIR / "state").exists()  # emptied record directories are pruned


def test_expire_drops_expired_records_without_objects_but_keeps_fresh_ones(
    store: LocalBlobStore, root: Path
) -> None:
    # A writer records the TTL before the object; a crash in between leaves a record alone.
    now = time.time()
    for name, expiry in (("orphan-old", now - 5), ("orphan-in-flight", now + 600)):
        (root / TTL_DIR).mkdir(parents=True, exist_ok=True)
        (root / TTL_DIR / name).write_text(repr(expiry))
    assert store.expire(now) == []
    assert not (root / TTL_DIR / "orphan-old").exists()
    assert (root / TTL_DIR / "orphan-in-flight").exists()


def test_corrupt_ttl_record_is_an_error_naming_it(store: LocalBlobStore, root: Path) -> None:
    store.put("x", b"1", ttl=60)
    (root / TTL_DIR / "x").write_text("not a number")
    with pytest.raises(BlobStoreError, match=r"corrupt TTL record .*'x'"):
        store.expire(time.time() + 3600)
    assert store.get("x") == b"1"


def test_temporary_files_are_invisible_and_stale_ones_are_removed(store: LocalBlobStore, root: Path) -> None:
    store.put("kept", b"1")
    tmp_dir = root / TMP_DIR
    tmp_dir.mkdir(exist_ok=True)
    stale, fresh = tmp_dir / "crashed.tmp", tmp_dir / "in-flight.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    assert store.list() == ["kept"]
    # Even an expire with a far-future "now" must not touch a write that is in flight.
    assert store.expire(time.time() + 10 * STALE_TMP_SECONDS) == []
    assert not stale.exists()
    assert fresh.exists()


def test_successful_writes_leave_no_temporary_files(
    store: LocalBlobStore, root: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"file")
    store.put("a", b"1", ttl=60)
    store.put("b", source)
    store.put_if_absent("c", b"3", ttl=60)
    store.put_if_absent("c", b"lost")
    assert list((root / TMP_DIR).iterdir()) == []


def test_failed_write_leaves_nothing_behind(store: LocalBlobStore, root: Path, tmp_path: Path) -> None:
    store.put("x", b"old")
    with pytest.raises(IsADirectoryError):
        store.put("x", tmp_path)  # a directory is not a readable file
    assert store.get("x") == b"old"
    assert list((root / TMP_DIR).iterdir()) == []


def test_overwrite_replaces_atomically_for_open_readers(store: LocalBlobStore, root: Path) -> None:
    store.put("obj", b"A" * 100_000)
    with open(root / "obj", "rb") as reader:
        store.put("obj", b"B" * 50)
        assert reader.read() == b"A" * 100_000  # the old file, whole; never a mix
    assert store.get("obj") == b"B" * 50


def test_delete_prunes_empty_directories_but_never_the_root(store: LocalBlobStore, root: Path) -> None:
    store.put("a/b/c/one", b"1")
    store.put("a/two", b"2")
    store.delete("a/b/c/one")
    assert not (root / "a" / "b").exists()
    assert (root / "a").is_dir()
    store.delete("a/two")
    assert not (root / "a").exists()
    assert root.is_dir()


def test_object_and_directory_name_clash_is_a_clear_error(store: LocalBlobStore) -> None:
    store.put("a/b", b"1")
    with pytest.raises(BlobStoreError, match=r"'a' in .*is a directory"):
        store.put("a", b"2")
    with pytest.raises(BlobStoreError, match=r"'a/b/c'.*not a directory"):
        store.put("a/b/c", b"3")
    assert store.list() == ["a/b"]


def test_symlink_planted_inside_the_root_is_not_followed(
    store: LocalBlobStore, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    store.put("ok", b"1")
    (root / "evil").symlink_to(outside, target_is_directory=True)
    (root / "link").symlink_to(outside / "secret")
    for name in ("evil/secret", "link"):
        with pytest.raises(InvalidBlobNameError, match="outside the store root"):
            store.get(name)
        with pytest.raises(InvalidBlobNameError):
            store.get_file(name, tmp_path / "copy")
        with pytest.raises(InvalidBlobNameError):
            store.exists(name)
        with pytest.raises(InvalidBlobNameError):
            store.delete(name)
        with pytest.raises(InvalidBlobNameError):
            store.put(name, b"overwritten")
        with pytest.raises(InvalidBlobNameError):
            store.put_if_absent(name, b"overwritten")
        with pytest.raises(InvalidBlobNameError):
            store.remove_ttl(name)
    with pytest.raises(InvalidBlobNameError):
        store.put("evil/new", b"planted")
    with pytest.raises(InvalidBlobNameError):
        store.list("evil/")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"
    assert not (tmp_path / "copy").exists()
    assert store.list() == ["ok"]  # symlinks are never listed as objects


def test_symlink_in_the_ttl_area_is_not_followed(store: LocalBlobStore, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store.put("d/x", b"1")
    (root / TTL_DIR).mkdir()
    (root / TTL_DIR / "d").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.put("d/y", b"2", ttl=60)
    assert list(outside.iterdir()) == []


def test_symlink_planted_deep_below_the_root_is_not_followed(
    store: LocalBlobStore, root: Path, tmp_path: Path
) -> None:
    """Every component below the root is checked, not only the first: a link in a directory the store
    made itself, planted after objects were written through it, is refused for reads and writes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_bytes(b"secret")
    store.put("state/op/0/1.delta", b"1", ttl=60)
    (root / "state" / "op" / "1").symlink_to(outside, target_is_directory=True)
    (root / TTL_DIR / "state" / "op" / "2").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.get("state/op/1/x")
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.put("state/op/1/y", b"planted", ttl=60)
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.put("state/op/2/y", b"planted", ttl=60)
    assert sorted(p.name for p in outside.iterdir()) == ["x"]
    assert store.get("state/op/0/1.delta") == b"1"


def test_a_symlinked_tmp_area_that_points_out_is_refused(
    store: LocalBlobStore, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store.put("a", b"1")
    os.rmdir(root / TMP_DIR)
    (root / TMP_DIR).symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.put("b", b"2")
    assert list(outside.iterdir()) == []


def test_a_symlink_that_stays_inside_the_root_is_followed(store: LocalBlobStore, root: Path) -> None:
    store.put("real/a", b"1")
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    assert store.get("alias/a") == b"1"
    store.put("alias/b", b"2", ttl=60)
    assert (root / "real" / "b").read_bytes() == b"2"


def test_store_root_may_itself_be_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    store = open_blob_store(str(tmp_path / "alias"))
    store.put("a/b", b"1", ttl=60)
    assert store.get("a/b") == b"1"
    assert (real / "a" / "b").read_bytes() == b"1"


def test_scratch_store_without_fsync_keeps_the_same_contract(root: Path) -> None:
    store = open_blob_store(str(root), fsync=False)
    assert store.put_if_absent("c", b"1", ttl=60) is True
    assert store.put_if_absent("c", b"2") is False
    store.remove_ttl("c")
    assert (store.get("c"), store.has_ttl("c"), store.list()) == (b"1", False, ["c"])


def test_object_operations_intern_no_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that runs for years: every interned name that comes and goes makes Python rebuild its
    interned-string table now and then (1.9 MB blocks that stayed resident); pathlib interns every path
    part, so the store's per-object work must not build paths."""
    import sys

    store = open_blob_store(str(tmp_path / "store"))
    store.put("commits/0.json", b"c")  # the store's own directories exist before counting
    interned: list[str] = []
    real_intern = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real_intern(s))
    for version in range(1, 4):
        name = f"state/0/{version}_{version:032x}.delta"
        store.put(name, b"d", ttl=60)
        store.put_if_absent(f"commits/{version}.json", b"c")
        store.remove_ttl(name)
        assert store.get(name) == b"d" and store.exists(name)
        assert f"commits/{version}.json" in store.list("commits/")
        store.delete(name)
    store.expire()
    assert interned == []


def test_a_symlink_to_a_sibling_whose_name_extends_the_root_is_outside(
    store: LocalBlobStore, root: Path
) -> None:
    """Containment is by path components: ``<root>-evil`` starts with the root's text but is outside."""
    sibling = root.with_name(root.name + "-evil")
    sibling.mkdir()
    (sibling / "secret").write_bytes(b"secret")
    store.put("ok", b"1")
    (root / "link").symlink_to(sibling / "secret")
    with pytest.raises(InvalidBlobNameError, match="outside the store root"):
        store.get("link")
    assert (sibling / "secret").read_bytes() == b"secret"


@pytest.mark.parametrize(
    ("path", "directory", "below"),
    [
        ("/a", "/", True),  # a store rooted at / prunes up to, never including, /
        ("/", "/", False),
        ("/a/b", "/a", True),
        ("/a", "/a", False),
        ("/ab", "/a", False),
        ("/a", "/a/b", False),
    ],
)
def test_below_is_strictly_inside_by_components(path: str, directory: str, below: bool) -> None:
    """The rule the symlink check and the pruning of emptied directories share."""
    from blobstate.blobstore.local import _below

    assert _below(path, directory) is below


def test_a_put_survives_a_concurrent_prune_inside_makedirs(
    store: LocalBlobStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune between makedirs' mkdir of a parent and of its child fails makedirs with ENOENT.

    That is what a background snapshot upload met while the driver's cleanup emptied a TTL directory:
    the put must make the directories again, not fail.
    """
    import blobstate.blobstore.local as local_module

    real_makedirs = os.makedirs
    fired = []

    def racing_makedirs(path: str, exist_ok: bool = False) -> None:
        if not fired and TTL_DIR in path:
            parent = os.path.dirname(path)
            real_makedirs(parent, exist_ok=True)
            os.rmdir(parent)  # the concurrent prune
            fired.append(path)
            raise FileNotFoundError(2, "No such file or directory", path)
        real_makedirs(path, exist_ok=exist_ok)

    monkeypatch.setattr(local_module.os, "makedirs", racing_makedirs)
    store.put("state/0/0/obj", b"x", ttl=60)
    assert fired, "the injected prune did not fire"
    assert store.get("state/0/0/obj") == b"x"
    assert (root / TTL_DIR / "state" / "0" / "0" / "obj").is_file()
