"""Telling a replay from a lost or replaced Spark checkpoint (no Spark: the decision alone)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from blobstate.engine.replay import SourceProgress, SparkCheckpointMismatchError, check_batch

A = SourceProgress("query-a", "1" * 64)


def commit(version: int, source: SourceProgress | None) -> SimpleNamespace:
    return SimpleNamespace(version=version, source=None if source is None else source.to_json())


def check(batch_id: int, committed, latest, current: SourceProgress) -> bool:
    return check_batch(
        batch_id, committed, latest, current, checkpoint="ckpt", spark_checkpoint="ckpt/_spark"
    )


def test_a_replay_with_the_same_query_and_offsets_is_skipped() -> None:
    assert check(3, commit(4, A), None, A) is True


def test_a_batch_not_committed_yet_runs() -> None:
    assert check(4, None, commit(4, A), A) is False
    assert check(0, None, None, A) is False


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (SourceProgress("query-b", "1" * 64), "was lost or replaced"),
        (SourceProgress("query-a", "2" * 64), "other source offsets"),
    ],
)
def test_a_committed_batch_from_elsewhere_stops_the_query(current: SourceProgress, expected: str) -> None:
    with pytest.raises(SparkCheckpointMismatchError, match=expected) as raised:
        check(0, commit(1, A), None, current)
    assert "restore Spark's checkpoint directory (ckpt/_spark)" in str(raised.value)


def test_a_spark_checkpoint_of_another_query_at_the_right_batch_stops_the_query() -> None:
    with pytest.raises(SparkCheckpointMismatchError, match="do not belong together"):
        check(4, None, commit(4, A), SourceProgress("query-b", "3" * 64))


def test_commits_without_a_recorded_source_are_trusted_as_before() -> None:
    assert check(3, commit(4, None), None, A) is True
    assert check(4, None, commit(4, None), A) is False


def test_reading_spark_files() -> None:
    metadata = json.dumps({"id": "5c7e0000-0000-0000-0000-000000000001"}).encode()
    progress = SourceProgress.read(metadata, b'v1\n{}\n{"logOffset":0}')
    assert progress.spark_query_id == "5c7e0000-0000-0000-0000-000000000001"
    assert SourceProgress.from_json(progress.to_json()) == progress
    with pytest.raises(SparkCheckpointMismatchError, match="query id"):
        SourceProgress.read(b"not json", b"")
