"""A query resuming a rescaled checkpoint, without Spark: Spark's batch ids map to versions through the
newest commit (a rescale's version has no batch of its own), every commit after a rescale carries its
layout, the partition count comes from the newest commit (``metadata.json`` is never rewritten), a
mismatch without ``allow_rescale`` is refused in one line naming both counts, standby placement forgets
the old layout, and the report, ``lineage`` and the help see the rescale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from rescale_checkpoints import KEY_SCHEMA, batches, run_batches

from blobstate.batch.contracts import BatchPlan, RunSpec
from blobstate.batch.executor import ExecutorIdentity
from blobstate.blobstore import open_blob_store
from blobstate.cli.lineage_cmds import collect_lineage
from blobstate.cli.main import main
from blobstate.engine.batch_versions import committed_batch, version_of_batch
from blobstate.engine.commit import CommitContext, build_commit
from blobstate.engine.config import QueryConfig
from blobstate.engine.query import (
    PartitionCountMismatchError,
    _ensure_metadata,
    check_partition_count,
    default_num_partitions,
)
from blobstate.layout import METADATA
from blobstate.lineage.commitlog import Commit, CommitLog
from blobstate.report.metrics import batch_row
from blobstate.rescale import rescale_checkpoint
from blobstate.standby.assignment import PartitionAssignment
from blobstate.standby.step import StandbySettings, StandbyStep
from blobstate.standby.syncer import StandbySyncer
from task_results import a_result


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 1-4 (batches 0-3, 2 partitions), rescale 5 (3 partitions), 6-7 (batches 4-5), rescale 8
    (2 partitions), 9 (batch 6)."""
    root = tmp_path_factory.mktemp("twice")
    url, local = str(root / "ckpt"), root / "local"
    data = batches(7, seed=3)
    run_batches(url, data[:4], local, 2)
    rescale_checkpoint(None, url, 3)
    run_batches(url, data[4:6], local, 3)
    rescale_checkpoint(None, url, 2)
    run_batches(url, data[6:], local, 2)
    return root / "ckpt"


@pytest.fixture
def twice(built: Path, tmp_path: Path) -> str:
    """A copy of the twice-rescaled checkpoint of :func:`built` for one test."""
    shutil.copytree(built, tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


def test_batch_ids_map_to_versions_across_rescales(twice: str) -> None:
    with open_blob_store(twice) as store:
        log = CommitLog(store)
        latest = log.latest_commit()
        assert latest is not None and (latest.version, latest.batch_id) == (9, 6)
        assert [log.read_commit(v).batch_id for v in range(1, 10)] == [0, 1, 2, 3, 3, 4, 5, 5, 6]

        def read(version: int) -> Commit | None:
            return log.read_commit(version) if log.commit_exists(version) else None

        # A replayed batch finds its commit: the newest with its id (a rescale's for the batch before it,
        # which carries that batch's source for the replay check).
        found = {b: committed_batch(latest, b, read) for b in range(7)}
        assert {b: f[0] for b, f in found.items() if f} == {0: 1, 1: 2, 2: 3, 3: 5, 4: 6, 5: 8, 6: 9}
        assert all(f is not None and f[1] is not None and f[1].batch_id == b for b, f in found.items())
        assert found[3][1].rescaled and found[5][1].rescaled  # type: ignore[index,union-attr]
        # The next batches commit after the newest version, two higher than without the rescales.
        assert committed_batch(latest, 7, read) is None
        assert [version_of_batch(latest, b) for b in (7, 8)] == [10, 11]
        assert version_of_batch(None, 0) == 1
        # A pruned commit is reported as such, not taken for another batch's.
        store.delete("commits/2.json")
        assert committed_batch(latest, 1, read) == (2, None)


def test_a_commit_after_a_rescale_carries_its_layout_and_spark_s_batch_id(twice: str) -> None:
    with open_blob_store(twice) as store:
        log = CommitLog(store)
        previous = log.read_commit(9)
        run = RunSpec(key_columns=("key",), output_schema=pa.schema([pa.field("key", pa.string())]))
        plan = BatchPlan(version=9, uids={}, run=run, batch_id=7)
        results = {p: a_result(partition=p, version=10, uid=f"{p}" * 32) for p in (0, 1)}
        commit = build_commit(plan, results, previous, CommitContext("0", "w", 3))  # type: ignore[arg-type]
        assert (commit.version, commit.batch_id, commit.num_partitions, commit.layout_from) == (10, 7, 2, 8)
        assert commit.format_version == 4
        # Before any rescale nothing changes: batch b commits version b + 1 in format 3.
        first = build_commit(
            BatchPlan(version=0, uids={}, run=run), results, None, CommitContext("0", "w", 3)
        )  # type: ignore[arg-type]
        assert (first.batch_id, first.num_partitions, first.layout_from, first.format_version) == (
            0,
            None,
            1,
            3,
        )


def test_the_partition_count_is_the_newest_commit_s_and_metadata_json_never_changes(twice: str) -> None:
    with open_blob_store(twice) as store:
        before = store.get(METADATA)
        assert CommitLog(store).read_metadata().num_partitions == 2  # as the query first wrote it
        rescale_checkpoint(None, twice, 4)
        assert default_num_partitions(store, None) == 4  # type: ignore[arg-type]  # no session needed
        # A restart with the new count, or another one, passes the metadata check (counts are checked
        # against the newest commit); the metadata stays as written.
        for asked in (4, 5):
            metadata = _ensure_metadata(
                store, asked, QueryConfig(), ("key",), (), KEY_SCHEMA.jsonValue(), existing_layout=True
            )
            assert metadata.num_partitions == 2
        assert store.get(METADATA) == before


def test_another_partition_count_without_allow_rescale_is_refused_naming_both(twice: str) -> None:
    with open_blob_store(twice) as store:
        newest = CommitLog(store).latest_commit()
    assert not check_partition_count(twice, 2, newest, 2, allow_rescale=False)
    assert check_partition_count(twice, 2, newest, 3, allow_rescale=True)
    with pytest.raises(PartitionCountMismatchError) as refused:
        check_partition_count(twice, 2, newest, 3, allow_rescale=False)
    message = str(refused.value)
    assert message.count("\n") == 0
    assert "records 2 partitions (version 9, its newest commit), the query asks for 3" in message
    assert "allow_rescale=True" in message and twice in message
    with pytest.raises(PartitionCountMismatchError, match=r"nothing is committed yet to rescale"):
        check_partition_count(twice, 2, None, 3, allow_rescale=True)


class Alive:
    """The executors a standby step sees alive (what the JVM helper answers)."""

    def __init__(self, *executors: ExecutorIdentity) -> None:
        self.alive = list(executors)

    def executors(self) -> list[ExecutorIdentity]:
        return list(self.alive)


def test_standby_drops_the_old_layout_s_placement_and_replicas(twice: str) -> None:
    a, b = ExecutorIdentity("1", "127.0.0.2"), ExecutorIdentity("2", "127.0.0.3")
    with open_blob_store(twice) as store:
        log = CommitLog(store)
        old, rescale = log.read_commit(7), log.read_commit(8)
    syncer = StandbySyncer(
        None,
        None,
        checkpoint_url=twice,
        query_id="q",
        operator="0",
        local_dir="/nonexistent",
        budget_seconds=1,
    )
    settings = StandbySettings(num_partitions=2, operator="0", standby_replicas=1, max_warmup_replicas=0)
    step = StandbyStep(settings, Alive(b), syncer)
    # Batches of the 3-partition layout ran partition 0 on a with its standby on b, synced to version 7.
    step.assignment = {0: PartitionAssignment(a, (b,))}
    step._enter_layout(old)
    syncer.seed_versions({(0, b.host): 7, (1, a.host): 7})
    assert step._replica_versions() == {(0, b.host): 7, (1, a.host): 7}

    # a is gone and the next batch starts from the rescale (2 partitions): b's replica of old partition 0
    # is not new partition 0, so partition 0 is not failed over to it as a standby.
    plan = step._assign(rescale)
    assert step._replica_versions() == {} and syncer.replica_versions() == {}
    assert not [m for m in plan.moves if m.reason == "standby"]
    assert plan.active_failures == 0  # nothing of the old layout is taken for a failure of the new one
    assert set(plan.assignment) == {0, 1}
    # A late report of a sync to the old layout is not taken either.
    syncer.seed_versions({(0, b.host): 7})
    assert syncer.replica_versions() == {}


def test_report_and_lineage_follow_the_layout_of_each_version(twice: str) -> None:
    with open_blob_store(twice) as store:
        log = CommitLog(store)
        rows = {v: batch_row(log.read_commit(v)) for v in range(1, 10)}
        assert [rows[v].batch_id for v in range(1, 10)] == [0, 1, 2, 3, 3, 4, 5, 5, 6]
        assert [v for v, r in rows.items() if r.rescale] == [5, 8]
        # Partition 1's listing stops where its layout starts: partition 1 before version 8 is another one.
        listed = collect_lineage(store, partition=1, limit=20)["partitions"]
        assert [row["version"] for row in listed[0]["versions"]] == [9, 8]
        at_7 = collect_lineage(store, partition=2, limit=20, version=7)["partitions"]
        assert [row["version"] for row in at_7[0]["versions"]] == [7, 6, 5]


def test_help_lists_rescale(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "rescale" in capsys.readouterr().out
