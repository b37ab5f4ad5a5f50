"""Adjunct stores without Spark: side rows into a real RocksDB store, the read-only view, held-back main
rows, the decision table, the file source history and the broadcast store's writer and executor copies."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from blobstate.adjunct.broadcast import open_replica, write_version
from blobstate.adjunct.decision import INVALID, NOT_FOUND, VALID, decide
from blobstate.adjunct.deferred import DEFERRED_CF, DeferredRowsError, defer, take_deferred
from blobstate.adjunct.history import files_up_to
from blobstate.adjunct.records import apply_side_rows, in_order, split_side_rows
from blobstate.adjunct.spec import (
    PHASE_COLUMN,
    RANK_COLUMN,
    ROW_COLUMN,
    TAG_COLUMN,
    AdjunctError,
    AdjunctRecordError,
    AdjunctSpec,
    column_name,
)
from blobstate.adjunct.view import AdjunctView
from blobstate.blobstore import open_blob_store
from blobstate.ids import CheckpointId
from blobstate.layout import LocalPartitionLayout, delta_name
from blobstate.state.errors import StateLoadError
from blobstate.state.store import RocksStateStore

QID = "ab" * 16
TIERS = StructType([StructField("tier", StringType()), StructField("level", LongType())])


def spec(name: str = "profiles", **overrides: Any) -> AdjunctSpec:
    values: dict[str, Any] = {
        "name": name,
        "mode": "partitioned",
        "key_in_union": ("user",),
        "side_key_columns": ("uid",),
        "side_columns": ("uid", "tier", "level"),
        "value_columns": ("tier", "level"),
        "schema_json": TIERS.json(),
        "transform": None,
        "on_bad_record": "fail",
        "bootstrap": True,
        "persistent": True,
        "max_age_seconds": None,
    }
    values.update(overrides)
    return AdjunctSpec(**values)


def side_table(s: AdjunctSpec, rows: list[tuple[Any, ...]], key: str = "user") -> pa.Table:
    """Rows ``(key, uid, tier, level)`` in the layout of the query's input."""
    return pa.table(
        {
            key: [r[0] for r in rows],
            column_name(s.name, "uid"): [r[1] for r in rows],
            column_name(s.name, "tier"): [r[2] for r in rows],
            column_name(s.name, "level"): pa.array([r[3] for r in rows], pa.int64()),
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with RocksStateStore.open(tmp_path / "db") as opened:
        yield opened


def view(store: Any, s: AdjunctSpec) -> AdjunctView:
    return AdjunctView(s.name, store, s.column_family, s.schema, 1)


def test_side_rows_upsert_delete_and_skip_null_keys(store: Any) -> None:
    s = spec()
    rows = [("a", "a", "gold", 3), ("b", "b", "silver", 2), (None, None, "gold", 1), ("a", "a", "bronze", 1)]
    stats = apply_side_rows(store, s, side_table(s, rows))
    assert (stats.rows, stats.upserts, stats.null_keys) == (4, 3, 1)
    v = view(store, s)
    assert v.get("a") == ("bronze", 1)  # the later row of a key wins
    assert v.get(("b",)) == ("silver", 2)
    assert v.get("zz") is None and v.get("zz", "none") == "none"
    assert "b" in v and not v.contains("c")
    assert v.get_many(["a", "c", "b"]) == [("bronze", 1), None, ("silver", 2)]
    assert list(v.items()) == [(("a",), ("bronze", 1)), (("b",), ("silver", 2))]
    # Every value column null: the key is deleted.
    stats = apply_side_rows(store, s, side_table(s, [("a", "a", None, None)]))
    assert stats.deletes == 1 and v.get("a") is None
    with pytest.raises(ValueError, match="1 key column"):
        v.get(("a", "b"))


def test_a_transform_projects_rows_and_none_deletes(store: Any) -> None:
    def transform(row: dict[str, Any]) -> Any:
        return None if row["tier"] == "gone" else {"tier": row["tier"].upper(), "level": row["level"] * 10}

    s = spec(transform=transform, value_columns=())
    apply_side_rows(store, s, side_table(s, [("a", "a", "gold", 1), ("b", "b", "x", 2)]))
    apply_side_rows(store, s, side_table(s, [("b", "b", "gone", 0)]))
    assert list(view(store, s).items()) == [(("a",), ("GOLD", 10))]


def test_a_bad_record_fails_naming_the_adjunct_and_key_or_is_skipped_and_counted(store: Any) -> None:
    def transform(row: dict[str, Any]) -> Any:
        return (row["tier"], "not a number")

    failing = spec(transform=transform, value_columns=())
    with pytest.raises(AdjunctRecordError, match=r"adjunct 'profiles'.*key \('a',\).*on_bad_record='skip'"):
        apply_side_rows(store, failing, side_table(failing, [("a", "a", "gold", 1)]))
    skipping = spec(transform=transform, value_columns=(), on_bad_record="skip")
    stats = apply_side_rows(
        store, skipping, side_table(skipping, [("a", "a", "gold", 1), ("b", "b", "x", 1)])
    )
    assert (stats.bad_records, stats.upserts) == (2, 0)


def test_split_keeps_main_rows_and_orders_side_rows_history_first_then_input_order() -> None:
    s = spec()
    side = side_table(s, [("a", "a", "late", 1), ("a", "a", "early", 1), ("a", "a", "history", 1)])
    side = side.append_column(TAG_COLUMN, pa.array(["profiles"] * 3))
    side = side.append_column(PHASE_COLUMN, pa.array([1, 1, 0], pa.int32()))
    side = side.append_column(RANK_COLUMN, pa.array([0, 0, 5], pa.int64()))
    side = side.append_column(ROW_COLUMN, pa.array([9, 4, 1], pa.int64()))
    main = pa.table({"user": ["x"], "n": [1]})
    table = pa.concat_tables([side, main], promote_options="default")
    main_rows, sides = split_side_rows(table.to_batches(), TAG_COLUMN, ["profiles"])
    assert pa.Table.from_batches(main_rows).to_pylist() == [{"user": "x", "n": 1}]
    ordered = sides["profiles"].column(column_name("profiles", "tier")).to_pylist()
    assert ordered == ["history", "early", "late"]
    assert in_order(pa.table({"x": [2, 1]})).column("x").to_pylist() == [2, 1]  # no order columns


def test_held_main_rows_round_trip_in_batch_order_and_refuse_another_schema(store: Any) -> None:
    first = pa.record_batch({"user": ["a"], "n": [1]})
    second = pa.record_batch({"user": ["b", "c"], "n": [2, 3]})
    assert defer(store, 3, [second]) == 2
    assert defer(store, 2, [first]) == 1
    assert defer(store, 4, []) == 0
    taken = take_deferred(store, first.schema)
    assert pa.Table.from_batches(taken).to_pylist() == [
        {"user": "a", "n": 1},
        {"user": "b", "n": 2},
        {"user": "c", "n": 3},
    ]
    assert list(store.items(DEFERRED_CF)) == []
    defer(store, 5, [first])
    with pytest.raises(DeferredRowsError, match="held back by the batch of version 5 have schema"):
        take_deferred(store, pa.schema([("user", pa.string())]))
    store.put(DEFERRED_CF, (6).to_bytes(8, "big"), b"not arrow")
    with pytest.raises(DeferredRowsError, match="the batch of version 6 cannot be read"):
        take_deferred(store, None)


@pytest.mark.parametrize(
    ("persistent", "max_age", "recorded_age", "bootstrap", "rate_limited", "expected"),
    [
        (True, None, None, True, True, (NOT_FOUND, False, False, True)),
        (True, None, None, True, False, (NOT_FOUND, False, False, False)),
        (True, None, None, False, True, (NOT_FOUND, False, False, False)),
        (True, 60, 120, True, False, (INVALID, True, True, False)),
        (True, 60, 120, False, False, (INVALID, True, False, False)),
        (True, 60, 10, True, False, (VALID, False, False, False)),
        (True, None, 10**6, False, False, (VALID, False, False, False)),
        (False, None, 1, True, False, (INVALID, True, True, False)),
        (False, None, 1, False, False, (INVALID, True, False, False)),
        # The side source no longer has a file of the recorded offset: the store is not valid.
        (True, None, ["gone.parquet"], True, False, (INVALID, True, True, False)),
        (True, None, ["gone.parquet"], False, False, (INVALID, True, False, False)),
    ],
)
def test_the_decision_table(
    persistent: bool,
    max_age: float | None,
    recorded_age: float | list[str] | None,
    bootstrap: bool,
    rate_limited: bool,
    expected: tuple[str, bool, bool, bool],
) -> None:
    now = 10**9
    s = spec(persistent=persistent, max_age_seconds=max_age, bootstrap=bootstrap)
    lost = recorded_age if isinstance(recorded_age, list) else None
    if lost is not None:
        recorded_age = 1
    recorded = None if recorded_age is None else {"updated_ms": now - int(recorded_age * 1000)}
    d = decide(s, recorded, now, rate_limited=rate_limited, lost=lost)
    if lost:
        assert "no longer has 1 file(s)" in d.reason and "gone.parquet" in d.reason
    assert (d.found, d.recreate, d.reload, d.wait_for_backlog) == expected


def test_file_source_history_up_to_an_offset_reads_compacted_and_later_entries() -> None:
    def entries(*items: tuple[str, int]) -> bytes:
        lines = ["v1"] + [json.dumps({"path": p, "timestamp": 0, "batchId": b}) for p, b in items]
        return "\n".join(lines).encode()

    logs = {
        "9.compact": entries(("f0", 0), ("f1", 3), ("f2", 9)),
        "10": entries(("f3", 10)),
        "11": entries(("f4", 11), ("f5", 11)),
        "12": entries(("f6", 12)),
    }
    assert files_up_to(logs, 11) == ["f0", "f1", "f2", "f3", "f4", "f5"]
    assert files_up_to(logs, 3) == ["f0", "f1"]
    with pytest.raises(AdjunctError, match="v1"):
        files_up_to({"0": b"v2\n{}"}, 0)


# ---------------------------------------------------------------------------------------------- broadcast
def broadcast_spec() -> AdjunctSpec:
    return spec(
        name="tiers",
        mode="broadcast",
        key_in_union=(column_name("tiers", "uid"),),
        side_columns=("uid", "tier", "level"),
    )


def broadcast_rows(rows: list[tuple[str, str, int]]) -> pa.Table:
    s = broadcast_spec()
    return side_table(s, [(k, k, t, lv) for k, t, lv in rows], key="unused").drop_columns(["unused"])


def commit_version(store: Any, version: int, written: Any, s: AdjunctSpec) -> None:
    """Commit ``written`` as the checkpoint's version (a real commit log with the broadcast operator)."""
    from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata

    log = CommitLog(store)
    log.write_metadata(
        QueryMetadata.new(
            2, {"0": {"key_columns": ["k"]}, s.operator: {"key_columns": ["k"], "partitions": 1}}
        )
    )
    from blobstate.lineage.refs import ObjectRef, PartitionObjects

    dummy = PartitionObjects(ObjectRef.of(b"x"))
    log.write_commit(
        Commit(
            version=version,
            batch_id=version - 1,
            checkpoints={"0": {0: "a" * 32, 1: "b" * 32}, s.operator: {0: written.pending.uid}},
            objects={"0": {0: dummy, 1: dummy}, s.operator: {0: written.objects}},
            retained_from=1,
            writer="test",
        )
    )


def test_broadcast_store_one_writer_executor_copies_follow_versions_and_share_reads(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "remote"))
    s = broadcast_spec()
    driver_dir, executor_dir = str(tmp_path / "driver"), str(tmp_path / "executor")
    options = {"snapshot_every": 2, "snapshot_delta_bytes": 10**9}
    w1 = write_version(
        store, driver_dir, QID, s, None, broadcast_rows([("a", "gold", 1)]), uid="1" * 32, **options
    )
    # Tasks of batch 0 read version 1 before it is committed: the pending delta, checked and applied.
    with open_replica(store, executor_dir, QID, s, w1.pending) as (replica, _):
        assert list(view(replica, s).items()) == [(("a",), ("gold", 1))]
    commit_version(store, 1, w1, s)
    w2 = write_version(
        store,
        driver_dir,
        QID,
        s,
        w1.pending.checkpoint_id,
        broadcast_rows([("b", "silver", 2), ("a", "bronze", 3)]),
        uid="2" * 32,
        **options,
    )
    assert w2.snapshot  # snapshot_every=2
    commit_version(store, 2, w2, s)
    w3 = write_version(
        store,
        driver_dir,
        QID,
        s,
        w2.pending.checkpoint_id,
        broadcast_rows([("c", "x", 1)]),
        uid="3" * 32,
        **options,
    )
    # Many tasks of one executor at once: one brings the copy to version 3, all read it at that version.
    seen: list[Any] = []

    def task() -> None:
        with open_replica(store, executor_dir, QID, s, w3.pending) as (replica, _):
            seen.append(list(view(replica, s).items()))

    threads = [threading.Thread(target=task) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [[(("a",), ("bronze", 3)), (("b",), ("silver", 2)), (("c",), ("x", 1))]] * 4
    # A fresh executor copy starts from the snapshot of version 2, then the pending delta of version 3.
    with open_replica(store, str(tmp_path / "new-executor"), QID, s, w3.pending) as (replica, _):
        assert len(list(view(replica, s).items())) == 3


def test_a_changed_pending_delta_is_refused_naming_it(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "remote"))
    s = broadcast_spec()
    options = {"snapshot_every": 10, "snapshot_delta_bytes": 10**9}
    w1 = write_version(
        store, str(tmp_path / "d"), QID, s, None, broadcast_rows([("a", "g", 1)]), uid="1" * 32, **options
    )
    name = delta_name(s.operator, 0, CheckpointId(1, "1" * 32))
    data = bytearray(store.get(name))
    data[-1] ^= 0xFF
    (tmp_path / "remote" / name).write_bytes(bytes(data))
    with (
        pytest.raises(StateLoadError, match=name),
        open_replica(store, str(tmp_path / "e"), QID, s, w1.pending),
    ):
        pass
    layout = LocalPartitionLayout(tmp_path / "e", QID, s.operator, 0)
    assert not (layout.standby / "CHECKPOINT-ID").exists()  # never claims a version it does not hold


def test_adjuncts_are_part_of_the_checkpoint_identity(tmp_path: Path) -> None:
    from blobstate.lineage.commitlog import CommitLog, MetadataConflictError, QueryMetadata

    log = CommitLog(open_blob_store(str(tmp_path / "c")))
    first = QueryMetadata.new(2, {"0": {"key_columns": ["k"], "adjuncts": {"p": "partitioned"}}})
    log.write_metadata(first)
    assert log.read_metadata().partitions_of("0") == 2
    with pytest.raises(MetadataConflictError, match=r"adjunct stores \['p \(partitioned\)'\].*side stream"):
        log.write_metadata(QueryMetadata.new(2, {"0": {"key_columns": ["k"]}}))
    broadcast = SimpleNamespace(operators={"adjunct-t": {"key_columns": ["t"], "partitions": 1}})
    assert QueryMetadata.partitions_of(broadcast, "adjunct-t") == 1  # type: ignore[arg-type]
