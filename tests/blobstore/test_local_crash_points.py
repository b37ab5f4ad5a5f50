"""A local-directory store's pending writes cut off between their two steps (the TTL record and the
object): whatever is left must expire, so a killed writer never leaks an object forever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.blobstore.local import TTL_DIR, LocalBlobStore
from blobstate.snapshot.repository import backup_to_repository, gc_repository, root_indexes

FAR_FUTURE = 2**40


class Killed(BaseException):
    """The process died here (a BaseException: no handler of the code under test swallows it)."""


def kill_at_second_step(monkeypatch: pytest.MonkeyPatch, matches: Any) -> list[str]:
    """Make the second placement (record or object, whichever comes second) of a matching name die."""
    placed: list[str] = []
    place = LocalBlobStore._place

    def dying_place(self: LocalBlobStore, name: str, *args: Any, **kwargs: Any) -> bool:
        if matches(name):
            placed.append(name)
            if placed.count(name) == 2:
                raise Killed(f"killed between the two steps of writing {name!r}")
        return place(self, name, *args, **kwargs)

    monkeypatch.setattr(LocalBlobStore, "_place", dying_place)
    return placed


@pytest.mark.parametrize("create", [True, False], ids=["put_if_absent", "put"])
def test_a_pending_write_killed_between_its_steps_leaves_nothing_that_outlives_expiry(
    create: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_blob_store(str(tmp_path / "store"))
    placed = kill_at_second_step(monkeypatch, lambda name: name == "x/1_abc.snapshot")
    with pytest.raises(Killed):
        if create:
            store.put_if_absent("x/1_abc.snapshot", b"index", ttl=60)
        else:
            store.put("x/1_abc.snapshot", b"index", ttl=60)
    assert placed == ["x/1_abc.snapshot"] * 2, "the kill did not fall between the two steps"
    monkeypatch.undo()
    store.expire(now=FAR_FUTURE)
    assert store.list() == [], "a pending object outlived its expiry"
    assert not any((tmp_path / "store" / TTL_DIR).rglob("*.snapshot"))


def test_a_backup_killed_between_its_index_and_expiry_record_is_expired_by_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_blob_store(str(tmp_path / "repo"))
    source = tmp_path / "source"
    source.mkdir()
    (source / "a").write_bytes(b"first")
    first = backup_to_repository(store, source)
    (source / "a").write_bytes(b"second")
    kill_at_second_step(monkeypatch, lambda name: name.endswith(".snapshot"))
    with pytest.raises(Killed):
        backup_to_repository(store, source)
    monkeypatch.undo()
    gc_repository(store, full=False, now=FAR_FUTURE)
    assert root_indexes(store) == [first.result.index_name], "the uncommitted index never expires"
    assert gc_repository(store, full=True, now=FAR_FUTURE).newest == first.result.index_name
