"""The commit log on every blob store backend: create-only writes, ownership, and read validation."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from blobstate.blobstore import BlobNotFoundError, BlobStore
from blobstate.ids import new_uid
from blobstate.lineage.commitlog import (
    Commit,
    CommitConflictError,
    CommitLog,
    CommitLogError,
    CommitLogFormatError,
    IncompleteCommitLogError,
    MetadataConflictError,
    QueryMetadata,
)
from blobstate.lineage.refs import ObjectRef, PartitionObjects

N = 3
OPERATORS = {"0": {"key_columns": ["user"]}, "agg-2": {"key_columns": ["a", "b"], "note": "free-form"}}


def metadata(num_partitions: int = N, operators: dict[str, Any] | None = None) -> QueryMetadata:
    return QueryMetadata.new(num_partitions, OPERATORS if operators is None else operators)


def refs(seed: int = 0) -> PartitionObjects:
    return PartitionObjects(
        ObjectRef.of(b"delta %d" % seed), ObjectRef.of(b"index %d" % seed) if seed % 2 else None
    )


def all_refs() -> dict[str, dict[int, PartitionObjects]]:
    return {op: {p: refs(p) for p in range(N)} for op in OPERATORS}


def commit(version: int, writer: str = "driver-a", **changes: Any) -> Commit:
    fields: dict[str, Any] = {
        "version": version,
        "checkpoints": {op: {p: new_uid() for p in range(N)} for op in OPERATORS},
        "writer": writer,
        "objects": all_refs(),
        "retained_from": max(1, version - 2),
        "placement": {0: "exec-1", 1: {"executor_id": "exec-2", "host": "10.0.0.2"}},
        "watermark_ms": 1_700_000_000_000,
        "adjunct_offsets": {"prices": {"0": 41}},
        "metrics": {"partitions": {0: {"rows": 5}}},
    }
    fields.update(changes)
    return Commit(**fields)


@pytest.fixture
def log(blob_store: BlobStore) -> CommitLog:
    commit_log = CommitLog(blob_store)
    commit_log.write_metadata(metadata())
    return commit_log


# ---------------------------------------------------------------------------------------------- metadata
def test_metadata_round_trip_and_fresh_log_reads_it(blob_store: BlobStore) -> None:
    written = CommitLog(blob_store).write_metadata(metadata())
    assert CommitLog(blob_store).read_metadata() == written
    assert written.operators["agg-2"]["note"] == "free-form"


def test_metadata_is_create_only_and_a_restart_adopts_the_stored_one(blob_store: BlobStore) -> None:
    first = CommitLog(blob_store).write_metadata(metadata())
    stored = blob_store.get("metadata.json")
    again = CommitLog(blob_store).write_metadata(metadata())  # a restart: new random query id
    assert again == first and again.query_id == first.query_id
    assert blob_store.get("metadata.json") == stored


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (metadata(num_partitions=N + 1), f"records {N} partitions, the query asks for {N + 1}"),
        (metadata(operators={"0": {"key_columns": ["session"]}}), "operators and key columns"),
    ],
)
def test_metadata_with_another_identity_conflicts(
    blob_store: BlobStore, wanted: QueryMetadata, message: str
) -> None:
    CommitLog(blob_store).write_metadata(metadata())
    stored = blob_store.get("metadata.json")
    with pytest.raises(MetadataConflictError, match=message) as caught:
        CommitLog(blob_store).write_metadata(wanted)
    assert "metadata.json" in str(caught.value)
    assert blob_store.get("metadata.json") == stored


def test_missing_metadata_names_the_object(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError, match=r"metadata\.json"):
        CommitLog(blob_store).read_metadata()


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"format_version": 3}, "format_version", "unknown format version 3"),
        ({"format_version": 1}, "format_version", "stored state values pickled"),
        ({"format_version": "1"}, "format_version", "expected an integer"),
        ({"query_id": "not-a-uuid"}, "query_id", "expected a lowercase UUID"),
        ({"num_partitions": 0}, "num_partitions", "expected an integer >= 1"),
        ({"num_partitions": True}, "num_partitions", "expected an integer"),
        ({"operators": {}}, "operators", "no operators"),
        ({"operators": {"../x": {"key_columns": []}}}, "operators['../x']", "invalid operator id"),
        ({"operators": {"0": {}}}, "operators['0'].key_columns", "missing"),
        ({"operators": {"0": {"key_columns": [1]}}}, "operators['0'].key_columns", "list of column names"),
        ({"created_time_ms": None}, "created_time_ms", "expected an integer"),
    ],
)
def test_metadata_read_validation_names_the_field(
    blob_store: BlobStore, change: dict[str, Any], field: str, problem: str
) -> None:
    obj = metadata().to_json() | change
    blob_store.put("metadata.json", json.dumps(obj).encode())
    with pytest.raises(CommitLogFormatError, match=problem) as caught:
        CommitLog(blob_store).read_metadata()
    assert caught.value.field == field
    assert "metadata.json" in str(caught.value) and blob_store.url in str(caught.value)


# ---------------------------------------------------------------------------------------------- writing
def test_commit_round_trip(log: CommitLog) -> None:
    written = commit(1)
    assert log.write_commit(written) is True
    read = log.read_commit(1)
    assert read.same_content(written) and read.created_time_ms == written.created_time_ms
    assert read.batch_id == 0 and read.checkpoints == written.checkpoints
    assert read.placement == {0: "exec-1", 1: {"executor_id": "exec-2", "host": "10.0.0.2"}}
    assert read.checkpoint_id("agg-2", 2).name == f"1_{written.checkpoints['agg-2'][2]}"
    assert CommitLog(log.store).read_commit(1).same_content(written)


def test_metrics_keyed_by_partition_number_round_trip_beyond_ten_partitions(tmp_path) -> None:
    # The driver keys metrics.partitions by int; JSON stores "10" before "2", so the digest must be of
    # the stored form or every commit of a query with more than 10 partitions is refused.
    from blobstate.blobstore import open_blob_store

    n = 12
    with open_blob_store(str(tmp_path / "checkpoint")) as store:
        log_ = CommitLog(store)
        log_.write_metadata(QueryMetadata.new(n, {"0": {"key_columns": ["k"]}}))
        written = Commit(
            version=1,
            checkpoints={"0": {p: new_uid() for p in range(n)}},
            writer="w",
            objects={"0": {p: refs(p) for p in range(n)}},
            retained_from=1,
            metrics={
                "partitions": {p: {"input_rows": p} for p in range(n)},
                "objects": {p: [] for p in range(n)},
            },
        )
        assert log_.write_commit(written) is True
        read = CommitLog(store).read_commit(1)
        assert read.same_content(written)
        assert read.metrics is not None and read.metrics["partitions"]["11"] == {"input_rows": 11}


def test_optional_fields_may_be_absent(log: CommitLog) -> None:
    bare = Commit(
        version=1, checkpoints=commit(1).checkpoints, writer="w", objects=all_refs(), retained_from=1
    )
    log.write_commit(bare)
    read = log.read_commit(1)
    assert (read.placement, read.watermark_ms, read.adjunct_offsets, read.metrics) == (None,) * 4


def test_identical_retry_by_the_same_writer_is_a_no_op(log: CommitLog) -> None:
    first = commit(1)
    assert log.write_commit(first) is True
    stored = log.store.get("commits/1.json")
    assert log.write_commit(first) is False
    # A retry that rebuilt the commit object (new creation time) is still the same commit.
    rebuilt = Commit(**{**first.__dict__, "created_time_ms": first.created_time_ms + 5})
    assert log.write_commit(rebuilt) is False
    assert log.store.get("commits/1.json") == stored


def test_another_writer_gets_a_conflict_naming_version_and_both_writers(log: CommitLog) -> None:
    mine = commit(1, writer="driver-a")
    log.write_commit(mine)
    stored = log.store.get("commits/1.json")
    theirs = Commit(**{**mine.__dict__, "writer": "driver-b"})  # even with the same uids
    with pytest.raises(CommitConflictError, match="another driver owns the query") as caught:
        log.write_commit(theirs)
    message = str(caught.value)
    assert "version 1" in message and "'driver-a'" in message and "'driver-b'" in message
    assert (caught.value.version, caught.value.existing_writer, caught.value.writer) == (
        1,
        "driver-a",
        "driver-b",
    )
    assert log.store.get("commits/1.json") == stored


def test_same_writer_with_different_content_is_a_conflict(log: CommitLog) -> None:
    log.write_commit(commit(1))
    with pytest.raises(CommitConflictError, match="with different content"):
        log.write_commit(commit(1))  # fresh uids


def test_racing_writers_one_wins_the_others_conflict(log: CommitLog) -> None:
    writers = [f"driver-{i}" for i in range(6)]
    barrier = threading.Barrier(len(writers))
    outcomes: dict[str, object] = {}

    def attempt(writer: str) -> None:
        mine = commit(1, writer=writer)
        own_log = CommitLog(log.store)
        own_log.read_metadata()
        barrier.wait()
        try:
            outcomes[writer] = own_log.write_commit(mine)
        except CommitConflictError as error:
            outcomes[writer] = error

    threads = [threading.Thread(target=attempt, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [w for w, outcome in outcomes.items() if outcome is True]
    assert len(winners) == 1
    losers = [outcome for w, outcome in outcomes.items() if w not in winners]
    assert len(losers) == len(writers) - 1
    assert all(isinstance(e, CommitConflictError) and e.existing_writer == winners[0] for e in losers)
    assert log.read_commit(1).writer == winners[0]


def test_a_version_needs_its_predecessor(log: CommitLog) -> None:
    with pytest.raises(CommitLogError, match=r"commits/1\.json does not exist"):
        log.write_commit(commit(2))
    assert not log.commit_exists(2)
    log.write_commit(commit(1))
    assert log.write_commit(commit(2)) is True


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"checkpoints": {"0": {0: "a" * 32}}}, "partitions missing"),
        ({"checkpoints": {"0": {p: "../../x" for p in range(N)}, "agg-2": {}}}, "invalid uid"),
        ({"writer": ""}, "non-empty string"),
        ({"placement": {N: "exec-9"}}, f"the query has {N} partitions"),
    ],
)
def test_an_invalid_commit_is_never_written(log: CommitLog, changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(CommitLogFormatError, match=problem):
        log.write_commit(commit(1, **changes))
    assert not log.commit_exists(1)


def test_writing_a_commit_needs_metadata(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError, match=r"metadata\.json"):
        CommitLog(blob_store).write_commit(commit(1))


def test_batch_id_must_be_version_minus_one() -> None:
    assert commit(4).batch_id == 3
    with pytest.raises(ValueError, match="batch_id 3"):
        commit(4, batch_id=4)


# ---------------------------------------------------------------------------------------------- reading
def good_json(version: int = 1) -> dict[str, Any]:
    return commit(version).to_json()


def edit(obj: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    """``obj`` with ``obj[path...] = value`` (``...`` as value deletes the entry)."""
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        (["format_version"], 9, "format_version", "unknown format version 9"),
        (["format_version"], 1, "format_version", "pickled"),
        (["objects"], ..., "objects", "missing"),
        (["objects", "0", "1"], ..., "objects['0']", "partitions missing: 1"),
        (["objects", "agg-2"], ..., "objects", "operators missing: agg-2"),
        (["objects", "0", "1", "delta", "sha256"], "0" * 63, "objects['0']['1']", "64 lowercase hex"),
        (["objects", "0", "1", "delta", "size"], -1, "objects['0']['1']", "integer >= 0"),
        (["objects", "0", "1", "snapshot"], {"size": 1}, "objects['0']['1']", "exactly size and sha256"),
        (["retained_from"], ..., "retained_from", "missing"),
        (["retained_from"], 0, "retained_from", "integer >= 1"),
        (["retained_from"], 2, "retained_from", "above the commit's version 1"),
        (["version"], 2, "version", "does not match the object name"),
        (["batch_id"], 1, "batch_id", "is the state after batch 0"),
        (["batch_id"], ..., "batch_id", "missing"),
        (["checkpoints", "0", "1"], "../../x", "checkpoints['0']['1']", "invalid uid"),
        (["checkpoints", "0", "1"], "ABCDEF0123", "checkpoints['0']['1']", "invalid uid"),
        (["checkpoints", "0", "1"], 12345678, "checkpoints['0']['1']", "invalid uid"),
        (["checkpoints", "0", "2"], ..., "checkpoints['0']", "partitions missing: 2"),
        (["checkpoints", "0", "3"], "a" * 32, "checkpoints['0']['3']", f"the query has {N} partitions"),
        (["checkpoints", "0", "01"], "a" * 32, "checkpoints['0']['01']", "bad partition '01'"),
        (["checkpoints", "0", "-1"], "a" * 32, "checkpoints['0']['-1']", "bad partition '-1'"),
        (["checkpoints", "../../etc"], {}, "checkpoints['../../etc']", "invalid operator id"),
        (["checkpoints", "other"], {}, "checkpoints['other']", "not declared in metadata.json"),
        (["checkpoints", "agg-2"], ..., "checkpoints", "operators missing: agg-2"),
        (["checkpoints", "0"], ["a" * 32], "checkpoints['0']", "partition -> uid"),
        (["placement", "1"], {"host": "h"}, "placement['1']", "executor id"),
        (["placement", "x"], "exec", "placement['x']", "bad partition"),
        (["watermark_ms"], "soon", "watermark_ms", "expected an integer"),
        (["metrics"], [1], "metrics", "expected a JSON object"),
        (["writer"], ..., "writer", "missing"),
        (["created_time_ms"], -1, "created_time_ms", "integer >= 0"),
    ],
)
def test_read_validation_names_object_and_field(
    log: CommitLog, path: list[Any], value: Any, field: str, problem: str
) -> None:
    log.store.put("commits/1.json", json.dumps(edit(good_json(), path, value)).encode())
    with pytest.raises(CommitLogFormatError, match=problem) as caught:
        log.read_commit(1)
    assert caught.value.field == field
    assert "commits/1.json" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not valid JSON"),
        (b'{"version": 1', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"version": 1, "version": 1}', "duplicate key"),
        (b'{"watermark_ms": NaN}', "NaN is not valid JSON"),
    ],
)
def test_unreadable_commit_is_named(log: CommitLog, data: bytes, problem: str) -> None:
    log.store.put("commits/1.json", data)
    with pytest.raises(CommitLogFormatError, match=problem) as caught:
        log.read_commit(1)
    assert "commits/1.json" in str(caught.value)


def test_a_corrupt_existing_commit_is_reported_not_replaced(log: CommitLog) -> None:
    log.store.put("commits/1.json", b"garbage")
    with pytest.raises(CommitLogFormatError, match=r"commits/1\.json"):
        log.write_commit(commit(1))
    assert log.store.get("commits/1.json") == b"garbage"


def test_missing_commit_names_the_object(log: CommitLog) -> None:
    with pytest.raises(BlobNotFoundError, match=r"commits/7\.json"):
        log.read_commit(7)


# ---------------------------------------------------------------------------------------------- listing
def test_empty_store_is_at_version_zero(log: CommitLog) -> None:
    assert log.latest_version() == 0
    assert log.versions() == []
    assert log.latest_commit() is None


def test_versions_and_latest(log: CommitLog) -> None:
    for version in range(1, 12):
        log.write_commit(commit(version))
    log.store.put("commits/notes.txt", b"not a commit")
    log.store.put("commits/007.json", b"{}")
    assert log.versions() == list(range(1, 12))
    assert log.latest_version() == 11  # numeric, not lexicographic ("9" > "11")
    latest = log.latest_commit()
    assert latest is not None and latest.version == 11
    assert log.commit_exists(11) and not log.commit_exists(12)


def test_new_queries_get_distinct_canonical_uuids() -> None:
    a, b = metadata(), metadata()
    assert a.query_id != b.query_id
    assert str(uuid.UUID(a.query_id)) == a.query_id


def test_complete_versions_names_the_holes(log: CommitLog) -> None:
    assert log.complete_versions() == []
    for version in (1, 2, 3, 4):
        log.write_commit(commit(version))
    assert log.complete_versions() == [1, 2, 3, 4]
    log.store.delete("commits/2.json")
    with pytest.raises(IncompleteCommitLogError, match=r"commits/2\.json") as caught:
        log.complete_versions()
    assert caught.value.missing == [2]


def test_object_references_round_trip_and_check_bytes() -> None:
    ref = ObjectRef.of(b"some bytes")
    assert ObjectRef.from_json(ref.to_json()) == ref
    assert ref.problem(b"some bytes") is None
    assert "bytes where the commit recorded" in (ref.problem(b"some byte") or "")
    assert "SHA-256" in (ref.problem(b"some bytez") or "")


@pytest.mark.parametrize(
    ("field", "value"),
    [("watermark_ms", 1_700_000_000_001), ("retained_from", 2), ("metrics", {"partitions": {}})],
)
def test_a_changed_value_in_a_valid_commit_is_detected(log: CommitLog, field: str, value: Any) -> None:
    version = 3 if field == "retained_from" else 1
    for v in range(1, version + 1):
        log.write_commit(commit(v))
    name = f"commits/{version}.json"
    raw = json.loads(log.store.get(name))
    assert raw[field] != value
    raw[field] = value  # still valid JSON with valid fields
    log.store.put(name, json.dumps(raw, indent=1).encode())
    with pytest.raises(CommitLogFormatError, match="does not match its checksum") as caught:
        log.read_commit(version)
    assert caught.value.field == "sha256" and name in str(caught.value)


def test_a_changed_value_in_metadata_is_detected(blob_store: BlobStore) -> None:
    CommitLog(blob_store).write_metadata(metadata())
    raw = json.loads(blob_store.get("metadata.json"))
    raw["num_partitions"] += 1
    blob_store.put("metadata.json", json.dumps(raw).encode())
    with pytest.raises(CommitLogFormatError, match="does not match its checksum"):
        CommitLog(blob_store).read_metadata()


def test_a_late_snapshot_record_round_trips_and_must_name_an_earlier_version(tmp_path) -> None:
    from blobstate.blobstore import open_blob_store
    from blobstate.lineage.refs import LateSnapshot

    log = CommitLog(open_blob_store(str(tmp_path)))
    log.write_metadata(metadata())
    for v in (1, 2):
        log.write_commit(commit(v))
    late = LateSnapshot(2, new_uid(), ObjectRef.of(b"index of version 2"))
    objects = all_refs()
    objects["0"][1] = PartitionObjects(objects["0"][1].delta, None, late)
    log.write_commit(commit(3, objects=objects))
    read = log.read_commit(3)
    assert read.objects_of("0", 1).late_snapshot == late
    assert read.objects_of("0", 0).late_snapshot is None
    stored = json.loads(log.store.get("commits/3.json"))
    assert "late_snapshot" not in stored["objects"]["0"]["0"]  # absent when none: older commits unchanged
    objects["0"][1] = PartitionObjects(objects["0"][1].delta, None, LateSnapshot(4, late.uid, late.index))
    with pytest.raises(CommitLogFormatError, match=r"late_snapshot.*version 4.*commit of version 4"):
        log.write_commit(commit(4, objects=objects))
    assert not log.commit_exists(4)
