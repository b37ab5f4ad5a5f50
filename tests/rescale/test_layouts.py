"""Partition layouts without Spark: a rescale commit's format and the commit log's guard, a rescale version
whose snapshot is gone never loads as an empty state, a key schema that does not match the stored keys
stops the rescale before it commits, and the CLI's one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rescale_checkpoints import QUERY_ID, batches, run_batches

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.ids import CheckpointId
from blobstate.layout import METADATA, LocalPartitionLayout, snapshot_name
from blobstate.lineage.commitlog import CommitLog, CommitLogError, parse_commit
from blobstate.rescale import RescaleError, rescale_checkpoint
from blobstate.state.errors import MissingObjectError
from blobstate.state.history import CommitCache, PartitionHistory
from blobstate.state.loader import catch_up
from blobstate.state.store import RocksStateStore


@pytest.fixture
def rescaled(tmp_path: Path) -> str:
    """A checkpoint of 4 versions with 2 partitions, rescaled in process to 3 (version 5)."""
    url = str(tmp_path / "ckpt")
    run_batches(url, batches(4, seed=2), tmp_path / "local", 2)
    rescale_checkpoint(None, url, 3)
    return url


def test_a_rescale_commit_is_format_4_and_the_log_refuses_a_mixed_layout(rescaled: str) -> None:
    with open_blob_store(rescaled) as store:
        log = CommitLog(store)
        raw = json.loads(store.get("commits/5.json"))
        assert (raw["format_version"], raw["num_partitions"], raw["layout_from"], raw["batch_id"]) == (
            4,
            3,
            5,
            3,
        )
        assert json.loads(store.get("commits/4.json"))["format_version"] == 3
        commit = parse_commit(store.get("commits/5.json"), "commits/5.json", 5, log.read_metadata())
        assert commit.rescaled and len(commit.checkpoints["0"]) == 3
        # A next commit with the old layout's two partitions is refused, naming both layouts.
        old = log.read_commit(4)
        from dataclasses import replace

        mixed = replace(old, version=6, batch_id=4, layout_from=5, num_partitions=2, writer="w")
        with pytest.raises(CommitLogError, match=r"it has 2 partitions .* commits/5.json has 3"):
            log.write_commit(mixed)


def test_a_rescale_version_without_its_snapshot_is_an_error_not_an_empty_state(
    rescaled: str, tmp_path: Path
) -> None:
    with open_blob_store(rescaled) as store:
        log = CommitLog(store)
        commit = log.read_commit(5)
        cid = CheckpointId(5, commit.checkpoints["0"][1])
        store.delete_if_exists(snapshot_name("0", 1, cid))
        layout = LocalPartitionLayout(tmp_path / "fresh", QUERY_ID, "0", 1)
        history = PartitionHistory(CommitCache(log), "0", 1)
        with pytest.raises(MissingObjectError, match=r"state/0/1/5_.*\.snapshot.*not reset to empty"):
            catch_up(store, layout, tmp_path / "db", cid, RocksStateStore.open, history)


def test_a_key_schema_that_does_not_fit_the_stored_keys_stops_the_rescale(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    run_batches(url, batches(2, seed=4), tmp_path / "local", 2)
    with open_blob_store(url) as store:
        meta = json.loads(store.get(METADATA))
        meta["operators"]["0"]["key_schema"] = {
            "type": "struct",
            "fields": [{"name": "key", "type": "binary", "nullable": True, "metadata": {}}],
        }
        # Rewrite metadata.json as a different build would have (a consistent digest).
        from blobstate.lineage.commitlog import _dump

        store.delete_if_exists(METADATA)
        store.put(METADATA, _dump(meta, METADATA))
        before = sorted(store.list(""))
    with pytest.raises(
        RescaleError, match=r"partition 0 at version 2 .* does not fit .*nothing was committed"
    ):
        rescale_checkpoint(None, url, 3)
    with open_blob_store(url) as store:
        assert CommitLog(store).latest_version() == 2
        assert {n for n in store.list("") if n.startswith("commits/")} == {
            n for n in before if n.startswith("commits/")
        }


def test_the_cli_refuses_a_rescale_its_workers_python_cannot_run_in_one_line(
    spark: Any,
    bare_python: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``blobstate rescale`` checks the executors' Python before its job (it once failed inside the job
    with a worker's whole traceback), and changes nothing."""
    url = str(tmp_path / "ckpt")
    run_batches(url, batches(2, seed=3), tmp_path / "local", 2)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(bare_python))
    with pytest.raises(SystemExit) as exit_:
        main(["rescale", url, "--partitions", "3"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: the rescale did not start: the executors run the Python"
    )
    assert "cannot import 'blobstate'" in err[0]
    with open_blob_store(url) as store:
        assert CommitLog(store).latest_commit().version == 2  # nothing committed


@pytest.mark.parametrize(
    ("made", "says"), [(False, "nothing does not exist"), (True, "is not a readable query checkpoint")]
)
def test_cli_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], made: bool, says: str
) -> None:
    if made:
        (tmp_path / "nothing").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["rescale", str(tmp_path / "nothing"), "--partitions", "3"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


@pytest.mark.parametrize(
    ("count", "message"),
    [
        ("three", "--partitions must be a positive integer, not 'three'"),
        ("2.5", "--partitions must be a positive integer, not '2.5'"),
        ("0", "--partitions must be a positive integer, not 0"),
        ("100000", "--partitions is 100000, above blobstate's limit of 10000"),
        ("100000000000", "--partitions is 100000000000, above blobstate's limit of 10000"),
    ],
)
def test_a_bad_partition_count_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], count: str, message: str
) -> None:
    """Refused before anything is read or written (it once reached Spark as a Py4JError, or ran on for
    minutes leaving pending objects; a word was click's four-line usage with exit 2)."""
    url = str(tmp_path / "ckpt")
    run_batches(url, batches(2, seed=3), tmp_path / "local", 2)
    with pytest.raises(SystemExit) as exit_:
        main(["rescale", url, "--partitions", count])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    with open_blob_store(url) as store:
        assert CommitLog(store).latest_commit().version == 2
        assert not [n for n in store.list("state/") if n.rsplit("/", 1)[-1].startswith("3_")]  # no version 3
    with pytest.raises(RescaleError, match="above blobstate's limit"):
        rescale_checkpoint(None, url, 10_001)
