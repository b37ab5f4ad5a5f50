"""CRC-32 helpers and the checksum cache of immutable files."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from blobstate.snapshot import checksum
from blobstate.snapshot.checksum import ChecksumCache, cached_file_crc32, crc32, crc32_combine, file_crc32


def test_crc32_matches_zlib() -> None:
    data = os.urandom(100_000)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[5000:], crc32(data[:5000])) == zlib.crc32(data)


@pytest.mark.parametrize("split", [0, 1, 17, 4096, 99_999, 100_000])
def test_combine_equals_crc_of_concatenation(split: int) -> None:
    data = os.urandom(100_000)
    a, b = data[:split], data[split:]
    expected = zlib.crc32(data)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == expected
    # The pure-Python fallback used when ISA-L is not installed gives the same answer.
    assert checksum._python_crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == expected


def test_file_crc32_streams_whole_file(tmp_path: Path) -> None:
    data = os.urandom(3 * checksum.READ_BUFFER_SIZE + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert file_crc32(path) == (zlib.crc32(data), len(data))


def age(path: Path, seconds: float = 60) -> None:
    """Move the file's mtime into the past, as for any file not written just now."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def test_cache_hits_for_a_hard_link_of_the_same_sst(tmp_path: Path) -> None:
    cache = ChecksumCache()
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "000009.sst").write_bytes(b"content")
    age(a / "000009.sst")
    os.link(a / "000009.sst", b / "000009.sst")
    crc, _ = cached_file_crc32(a / "000009.sst", cache)
    assert cache.misses == 1 and cache.hits == 0
    crc2, _ = cached_file_crc32(b / "000009.sst", cache)
    assert crc == crc2 == zlib.crc32(b"content")
    assert cache.hits == 1


def test_cache_misses_after_the_file_changes(tmp_path: Path) -> None:
    cache = ChecksumCache()
    path = tmp_path / "000010.sst"
    path.write_bytes(b"aaaa")
    age(path)
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"aaaa")
    assert len(cache) == 1
    path.write_bytes(b"bbbbb")  # different size
    age(path)
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"bbbbb")
    st = path.stat()
    path.write_bytes(b"ccccc")  # same size, new mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"ccccc")


def test_just_written_files_are_not_cached(tmp_path: Path) -> None:
    # A same-size rewrite within one timestamp tick would keep the mtime: such files are not trusted.
    cache = ChecksumCache()
    path = tmp_path / "000011.sst"
    path.write_bytes(b"xxxx")
    st = path.stat()
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"xxxx")
    assert len(cache) == 0
    path.write_bytes(b"yyyy")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same mtime, as a coarse clock would give
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"yyyy")


def test_mutable_files_are_never_cached(tmp_path: Path) -> None:
    cache = ChecksumCache()
    path = tmp_path / "MANIFEST-000005"
    path.write_bytes(b"one")
    cached_file_crc32(path, cache)
    assert len(cache) == 0
    st = path.stat()
    path.write_bytes(b"two")  # same size, and mtime forced back: only a re-read can notice
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached_file_crc32(path, cache)[0] == zlib.crc32(b"two")


def test_cache_is_bounded(tmp_path: Path) -> None:
    cache = ChecksumCache(max_entries=3)
    for i in range(10):
        path = tmp_path / f"{i}.sst"
        path.write_bytes(b"%d" % i)
        age(path)
        cached_file_crc32(path, cache)
    assert len(cache) == 3


def test_mapped_crc32_equals_streamed(tmp_path: Path) -> None:
    from blobstate.snapshot.checksum import mapped_file_crc32

    data = os.urandom(2 * checksum.READ_BUFFER_SIZE + 7)
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert mapped_file_crc32(tmp_path / "f") == file_crc32(tmp_path / "f") == (zlib.crc32(data), len(data))
    assert mapped_file_crc32(tmp_path / "empty") == (0, 0)
