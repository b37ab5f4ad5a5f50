"""The snapshot index format: JSON round trip and rejection of everything a restore must not trust."""

from __future__ import annotations

import copy
import json
import zlib

import pytest

from blobstate.snapshot import (
    SCHEMA_VERSION,
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    SnapshotFormatError,
    SnapshotIndex,
    SnapshotMetadata,
)
from blobstate.snapshot.checksum import crc32_combine

INDEX_NAME = "state/0/1/5_0123456789abcdef.snapshot"


def make_file(name: str, data: bytes, *, chunk: int = 0, prefix: str = "blobs/0/1/") -> FileIndex:
    """A FileIndex for ``data`` split into chunks of ``chunk`` bytes (0: one blob)."""
    chunk = chunk or max(len(data), 1)
    blobs = tuple(
        FileBlob(f"{prefix}{name}-{off}", off, zlib.crc32(data[off : off + chunk]))
        for off in range(0, len(data), chunk)
    )
    return FileIndex(
        name, blobs, FileMetadata(len(data), 1_700_000_000_000, 1_700_000_000_000, 0o644), zlib.crc32(data)
    )


def sample_index() -> SnapshotIndex:
    root = DirIndex(
        "",
        files_present=(
            make_file("000009.sst", b"x" * 3000, chunk=1024),
            make_file("CURRENT", b"MANIFEST-1\n"),
        ),
        files_removed=(make_file("OLD.sst", b"old", prefix="blobs/0/1/old-"),),
        subdirs_present=(
            DirIndex("sub", files_present=(make_file("empty", b""),), subdirs_present=(DirIndex("deeper"),)),
        ),
        subdirs_removed=(
            DirIndex("gone", files_present=(make_file("g", b"gone", prefix="blobs/0/1/gone-"),)),
        ),
    )
    return SnapshotIndex(
        checkpoint_id="5_0123456789abcdef",
        created_time_ms=1_700_000_000_123,
        metadata=SnapshotMetadata("main", "0", 1, {"query": "q1"}),
        dir_index=root,
        prev_snapshot_index="state/0/1/4_fedcba9876543210.snapshot",
        lineage=("fedcba9876543210",),
    )


def raw_sample() -> dict:
    return json.loads(sample_index().to_json())


def parse(raw: dict) -> SnapshotIndex:
    return SnapshotIndex.from_json(json.dumps(raw).encode(), name=INDEX_NAME)


def test_round_trip_preserves_every_field() -> None:
    index = sample_index()
    data = index.to_json()
    back = SnapshotIndex.from_json(data, name=INDEX_NAME)
    assert back == index
    raw = json.loads(data)
    assert raw["schemaVersion"] == SCHEMA_VERSION == 1
    assert raw["dirIndex"]["filesPresent"][0]["checksum"] == {
        "algorithm": "crc32",
        "value": zlib.crc32(b"x" * 3000),
    }
    assert [b["offset"] for b in raw["dirIndex"]["filesPresent"][0]["blobs"]] == [0, 1024, 2048]
    assert back.metadata.properties["query"] == "q1"
    assert back.present_blob_ids() == {
        "blobs/0/1/000009.sst-0",
        "blobs/0/1/000009.sst-1024",
        "blobs/0/1/000009.sst-2048",
        "blobs/0/1/CURRENT-0",
    }
    assert back.removed_blob_ids() == {"blobs/0/1/old-OLD.sst-0", "blobs/0/1/gone-g-0"}
    assert [p for p, _ in back.iter_present_files()] == ["000009.sst", "CURRENT", "sub/empty"]


def test_chunks_have_lengths_from_offsets() -> None:
    f = make_file("a", b"y" * 2500, chunk=1000)
    assert [(b.offset, n) for b, n in f.chunks()] == [(0, 1000), (1000, 1000), (2000, 500)]
    assert make_file("empty", b"", chunk=1000).chunks() == []  # found by the repository crash model


def test_metadata_from_flat_mapping() -> None:
    md = SnapshotMetadata.from_mapping({"store": "s", "operator": "op", "partition": "7", "extra": "v"})
    assert (md.store, md.operator, md.partition, dict(md.properties)) == ("s", "op", 7, {"extra": "v"})


def expect_error(raw: dict, *fragments: str) -> SnapshotFormatError:
    with pytest.raises(SnapshotFormatError) as info:
        parse(raw)
    message = str(info.value)
    assert INDEX_NAME in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


@pytest.mark.parametrize("version", [0, 2, 99, "1", None, True])
def test_unknown_schema_version_is_rejected(version: object) -> None:
    raw = raw_sample()
    raw["schemaVersion"] = version
    expect_error(raw, "schema version")


def test_not_json_is_rejected() -> None:
    with pytest.raises(SnapshotFormatError, match="not valid JSON"):
        SnapshotIndex.from_json(b"\x00garbage", name=INDEX_NAME)


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ((), "checkpointId"),
        ((), "dirIndex"),
        (("dirIndex", "filesPresent", 1), "blobs"),
        (("dirIndex", "filesPresent", 1, "metadata"), "size"),
        (("dirIndex", "filesPresent", 1, "blobs", 0), "offset"),
        (("dirIndex", "filesPresent", 1, "checksum"), "algorithm"),
        (("dirIndex", "subDirsPresent", 0), "name"),
    ],
)
def test_missing_required_field_is_rejected(path: tuple, key: str) -> None:
    raw = raw_sample()
    target = raw
    for step in path:
        target = target[step]
    del target[key]
    expect_error(raw, "missing required field", key)


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (("createdTimeMs",), "yesterday", "createdTimeMs"),
        (("dirIndex", "filesPresent"), {"a": 1}, "filesPresent"),
        (("dirIndex", "filesPresent", 1, "metadata", "size"), "11", "size"),
        (("dirIndex", "filesPresent", 1, "blobs", 0, "offset"), 0.0, "offset"),
        (("dirIndex", "filesPresent", 1, "name"), 7, "name"),
        (("prevSnapshotIndex",), 5, "prevSnapshotIndex"),
        (("lineage",), "abc", "lineage"),
        (("metadata", "properties"), {"a": 1}, "properties"),
    ],
)
def test_wrong_types_are_rejected(path: tuple, value: object, fragment: str) -> None:
    raw = raw_sample()
    target = raw
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    expect_error(raw, fragment)


def with_unknown_fields(raw: dict) -> dict:
    """``raw`` with a field this reader does not know added at every level of the index."""
    raw["encryption"] = {"scheme": "none"}
    raw["metadata"]["hostname"] = "h1"
    raw["dirIndex"]["xattrs"] = []
    file = raw["dirIndex"]["filesPresent"][0]
    file["owner"] = "root"
    file["blobs"][0]["storageClass"] = "STANDARD"
    file["metadata"]["atimeMs"] = 1
    file["checksum"]["seed"] = 0
    raw["dirIndex"]["subDirsPresent"][0]["owner"] = "root"
    return raw


def test_unknown_fields_are_ignored_within_a_schema_version() -> None:
    # Forward compatibility: a newer writer of schema version 1 may add optional fields.
    assert parse(with_unknown_fields(raw_sample())) == sample_index()


def test_unknown_schema_version_is_rejected_even_when_the_fields_look_familiar() -> None:
    raw = with_unknown_fields(raw_sample())
    raw["schemaVersion"] = SCHEMA_VERSION + 1
    expect_error(raw, "unsupported schema version 2")


HOSTILE = ["..", ".", "", "/etc/passwd", "a/b", "..\\..\\x", "a\\b", "nul\x00byte", "lone\ud800surrogate"]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("where", ["filesPresent", "filesRemoved", "subDirsPresent", "subDirsRemoved"])
def test_names_that_could_escape_are_rejected(name: str, where: str) -> None:
    raw = raw_sample()
    if where.startswith("files"):
        entry = copy.deepcopy(raw["dirIndex"]["filesPresent"][1])
        entry["blobs"][0]["blobId"] = "blobs/0/1/hostile"
    else:
        entry = {"name": ""}
    entry["name"] = name
    raw["dirIndex"].setdefault(where, []).append(entry)
    err = expect_error(raw, "unsafe name", where)
    assert repr(name) in str(err)


def test_hostile_name_in_nested_directory_names_the_path() -> None:
    raw = raw_sample()
    entry = copy.deepcopy(raw["dirIndex"]["filesPresent"][1])
    entry["name"] = ".."
    entry["blobs"][0]["blobId"] = "blobs/0/1/other"
    raw["dirIndex"]["subDirsPresent"][0]["subDirsPresent"][0]["filesPresent"] = [entry]
    expect_error(raw, "'sub/deeper/..'")


def test_root_directory_must_be_unnamed() -> None:
    raw = raw_sample()
    raw["dirIndex"]["name"] = "../up"
    expect_error(raw, "root")


@pytest.mark.parametrize("blob_id", ["../outside", "/abs", "a//b", ".blobstate-ttl/x", ""])
def test_unsafe_blob_ids_are_rejected(blob_id: str) -> None:
    raw = raw_sample()
    raw["dirIndex"]["filesPresent"][1]["blobs"][0]["blobId"] = blob_id
    expect_error(raw, "CURRENT", "invalid blob name")


def test_unsafe_previous_index_name_is_rejected() -> None:
    raw = raw_sample()
    raw["prevSnapshotIndex"] = "../../etc/passwd"
    expect_error(raw, "prevSnapshotIndex")


def test_duplicate_file_names_are_rejected() -> None:
    raw = raw_sample()
    dup = copy.deepcopy(raw["dirIndex"]["filesPresent"][1])
    dup["blobs"][0]["blobId"] = "blobs/0/1/dup"
    raw["dirIndex"]["filesPresent"].append(dup)
    expect_error(raw, "duplicate file name 'CURRENT'")


def test_duplicate_directory_names_are_rejected() -> None:
    raw = raw_sample()
    raw["dirIndex"]["subDirsPresent"].append({"name": "sub"})
    expect_error(raw, "duplicate directory name 'sub'")


def test_file_and_directory_with_the_same_name_are_rejected() -> None:
    raw = raw_sample()
    raw["dirIndex"]["subDirsPresent"].append({"name": "CURRENT"})
    expect_error(raw, "both a file and a directory")


def test_directory_both_present_and_removed_is_rejected() -> None:
    raw = raw_sample()
    raw["dirIndex"]["subDirsRemoved"].append({"name": "sub"})
    expect_error(raw, "both present and removed", "'sub'")


def test_blob_listed_present_and_removed_is_rejected() -> None:
    raw = raw_sample()
    # The same file (same blobs) listed as removed: cleanup would delete a blob the snapshot needs.
    raw["dirIndex"]["filesRemoved"].append(copy.deepcopy(raw["dirIndex"]["filesPresent"][1]))
    expect_error(raw, "blobs/0/1/CURRENT-0", "also listed as present", "CURRENT")


def test_blob_of_removed_subdirectory_present_elsewhere_is_rejected() -> None:
    raw = raw_sample()
    raw["dirIndex"]["subDirsRemoved"][0]["filesPresent"][0]["blobs"][0]["blobId"] = "blobs/0/1/CURRENT-0"
    expect_error(raw, "blobs/0/1/CURRENT-0")


def test_same_blob_in_two_present_files_is_rejected() -> None:
    raw = raw_sample()
    other = copy.deepcopy(raw["dirIndex"]["filesPresent"][1])
    other["name"] = "CURRENT2"
    raw["dirIndex"]["filesPresent"].append(other)
    expect_error(raw, "blobs/0/1/CURRENT-0", "CURRENT2")


def test_replaced_file_same_name_new_blobs_is_allowed() -> None:
    # A mutable file re-uploaded under the same name: the old entry is removed, the new one present.
    raw = raw_sample()
    old = copy.deepcopy(raw["dirIndex"]["filesPresent"][1])
    old["blobs"][0]["blobId"] = "blobs/0/1/CURRENT-old"
    raw["dirIndex"]["filesRemoved"].append(old)
    assert "blobs/0/1/CURRENT-old" in parse(raw).removed_blob_ids()


def set_offsets(raw: dict, offsets: list[int], size: int | None = None) -> None:
    f = raw["dirIndex"]["filesPresent"][0]
    f["blobs"] = [{"blobId": f"blobs/0/1/c{i}", "offset": o, "checksum": 0} for i, o in enumerate(offsets)]
    if size is not None:
        f["metadata"]["size"] = size


@pytest.mark.parametrize(
    ("offsets", "size", "fragment"),
    [
        ([1, 1024, 2048], None, "first blob must start at offset 0"),
        ([0, 2048, 1024], None, "does not increase"),
        ([0, 1024, 1024], None, "does not increase"),
        ([0, 1024, 3000], None, "not below the file size"),
        ([0, 1024, 5000], None, "not below the file size"),
        ([], None, "at least one blob"),
        ([0], 0, "empty file must have no blobs"),
        ([0, -5], None, "does not increase"),
    ],
)
def test_bad_chunk_offsets_are_rejected(offsets: list[int], size: int | None, fragment: str) -> None:
    raw = raw_sample()
    set_offsets(raw, offsets, size)
    expect_error(raw, fragment, "000009.sst")


def test_file_checksum_must_match_its_blobs() -> None:
    raw = raw_sample()
    raw["dirIndex"]["filesPresent"][0]["checksum"]["value"] ^= 1
    expect_error(raw, "does not match its blobs", "000009.sst")


@pytest.mark.parametrize("value", [-1, 2**32, "12"])
def test_checksum_out_of_range_is_rejected(value: object) -> None:
    raw = raw_sample()
    raw["dirIndex"]["filesPresent"][1]["checksum"]["value"] = value
    expect_error(raw, "CURRENT")


def test_unknown_checksum_algorithm_is_rejected() -> None:
    raw = raw_sample()
    raw["dirIndex"]["filesPresent"][1]["checksum"]["algorithm"] = "md5"
    expect_error(raw, "unsupported checksum algorithm 'md5'")


@pytest.mark.parametrize("mode", [-1, 0o10000])
def test_bad_mode_is_rejected(mode: int) -> None:
    raw = raw_sample()
    raw["dirIndex"]["filesPresent"][1]["metadata"]["mode"] = mode
    expect_error(raw, "mode", "CURRENT")


def test_to_json_refuses_an_invalid_index() -> None:
    bad = SnapshotIndex(
        "1_abcdef01", 0, SnapshotMetadata(), DirIndex("", files_present=(make_file("..", b"x"),))
    )
    with pytest.raises(SnapshotFormatError, match="unsafe name"):
        bad.to_json()


def test_combined_blob_checksums_equal_whole_file_checksum() -> None:
    data = bytes(range(256)) * 40
    f = make_file("f", data, chunk=777)
    total = 0
    for b, n in f.chunks():
        total = crc32_combine(total, b.checksum, n)
    assert total == zlib.crc32(data) == f.checksum


def test_deeply_nested_json_is_a_format_error() -> None:
    data = b'{"dirIndex":' * 100_000 + b"{}" + b"}" * 100_000
    with pytest.raises(SnapshotFormatError, match=INDEX_NAME):
        SnapshotIndex.from_json(data, name=INDEX_NAME)
