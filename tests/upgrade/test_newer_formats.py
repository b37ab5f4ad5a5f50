"""Every stored format carries its version, and one newer than this build is refused with one line
naming the object and both versions (the objects are the upgrade fixture's, with the version raised)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from blobstate.lineage.commitlog import (
    COMMIT_FORMATS_READ,
    METADATA_FORMAT_VERSION,
    content_digest,
    parse_commit,
    parse_metadata,
)
from blobstate.lineage.delta import FORMAT_VERSION as DELTA_FORMAT_VERSION
from blobstate.lineage.delta import MAGIC, decode_delta
from blobstate.snapshot.heads import HEAD_FORMAT_VERSION, HeadRecord, parse_head
from blobstate.snapshot.index import SCHEMA_VERSION, SnapshotIndex

FIXTURE = Path(__file__).parent / "checkpoint"


def _one_line(error: BaseException, name: str, newer: int, current: int) -> str:
    text = str(error)
    assert "\n" not in text
    assert name in text, text
    assert re.search(rf"\b{newer}\b", text) and re.search(rf"\b{current}\b", text), text
    return text


def _resealed(path: Path, **changes: object) -> bytes:
    """A commit log object with ``changes`` and a matching digest (so only the version is at fault)."""
    obj = json.loads(path.read_bytes())
    obj.update(changes)
    obj["sha256"] = content_digest(obj)
    return json.dumps(obj).encode()


def test_a_newer_metadata_is_refused_naming_both_versions() -> None:
    newer = METADATA_FORMAT_VERSION + 1
    data = _resealed(FIXTURE / "metadata.json", format_version=newer)
    with pytest.raises(ValueError) as error:
        parse_metadata(data, "metadata.json in file:///ckpt")
    text = _one_line(error.value, "metadata.json in file:///ckpt", newer, METADATA_FORMAT_VERSION)
    assert "newer blobstate" in text


def test_a_newer_commit_is_refused_naming_both_versions() -> None:
    metadata = parse_metadata((FIXTURE / "metadata.json").read_bytes())
    newest = max(COMMIT_FORMATS_READ)  # a rescaled checkpoint's commits are this build's newest format
    newer = newest + 1
    data = _resealed(FIXTURE / "commits" / "5.json", format_version=newer)
    with pytest.raises(ValueError) as error:
        parse_commit(data, "commits/5.json", 5, metadata)
    _one_line(error.value, "commits/5.json", newer, newest)


def test_the_commits_of_the_previous_format_still_read() -> None:
    metadata = parse_metadata((FIXTURE / "metadata.json").read_bytes())
    commit = parse_commit((FIXTURE / "commits" / "5.json").read_bytes(), "commits/5.json", 5, metadata)
    assert commit.format_version == 2 and commit.horizon == 1  # nothing pruned before format 3


def test_a_newer_delta_is_refused_naming_both_versions() -> None:
    path = next((FIXTURE / "state" / "0" / "0").glob("*.delta"))
    data = bytearray(path.read_bytes())
    newer = DELTA_FORMAT_VERSION + 1
    struct.pack_into("<H", data, len(MAGIC), newer)
    with pytest.raises(ValueError) as error:
        decode_delta(bytes(data), name=path.name)
    _one_line(error.value, path.name, newer, DELTA_FORMAT_VERSION)


def test_a_newer_snapshot_index_is_refused_naming_both_versions() -> None:
    path = next((FIXTURE / "state" / "0" / "0").glob("*.snapshot"))
    obj = json.loads(path.read_bytes())
    newer = SCHEMA_VERSION + 1
    obj["schemaVersion"] = newer
    with pytest.raises(ValueError) as error:
        SnapshotIndex.from_json(json.dumps(obj), name=path.name)
    _one_line(error.value, path.name, newer, SCHEMA_VERSION)


def test_a_newer_backup_head_is_refused_naming_both_versions() -> None:
    head = HeadRecord(1, "1_" + "a" * 32 + ".snapshot", 10, 7, None, "a" * 32)
    obj = json.loads(head.to_json())
    newer = HEAD_FORMAT_VERSION + 1
    obj["format_version"] = newer
    with pytest.raises(ValueError) as error:
        parse_head(json.dumps(obj).encode(), "heads/1.json", 1)
    _one_line(error.value, "heads/1.json", newer, HEAD_FORMAT_VERSION)
