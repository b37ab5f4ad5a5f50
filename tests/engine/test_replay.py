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


# The check compares Spark's offset log entry as bytes: the same for every source. Offsets as Spark's
# sources write them (one line per source after the version and the batch metadata; "-" for a source
# without an offset yet); Kafka's cannot run here, its shape is that of Spark's Kafka source.
SOURCE_OFFSETS = {
    "file": ('{"logOffset":3}', '{"logOffset":4}'),
    "rate": ("12", "13"),
    "rate-micro-batch": ('{"offset":6,"timestamp":1000}', '{"offset":9,"timestamp":1000}'),
    "memory": ("5", "6"),
    "kafka": ('{"clicks":{"0":1200,"1":1187}}', '{"clicks":{"0":1200,"1":1188}}'),
    "none yet": ("-", "0"),
}
METADATA = b'{"id":"5c7e0000-0000-0000-0000-000000000002"}'


def offset_log(*sources: str) -> bytes:
    batch = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'
    return "\n".join(["v1", batch, *sources]).encode()


@pytest.mark.parametrize("kind", sorted(SOURCE_OFFSETS))
def test_replays_and_changed_offsets_are_told_apart_for_every_source(kind: str) -> None:
    offsets, moved = SOURCE_OFFSETS[kind]
    main = '{"logOffset":0}'
    ran = SourceProgress.read(METADATA, offset_log(main, offsets, "0"))
    assert ran.batch_timestamp_ms == 1700000000000
    again = SourceProgress.read(METADATA, offset_log(main, offsets, "0"))
    assert check(2, commit(3, ran), commit(3, ran), again) is True  # Spark's rerun of the same batch
    with pytest.raises(SparkCheckpointMismatchError, match="other source offsets"):  # as a side stream
        check(2, commit(3, ran), None, SourceProgress.read(METADATA, offset_log(main, moved, "0")))

    alone = SourceProgress.read(METADATA, offset_log(offsets, "0"))  # as the main stream
    assert check(2, commit(3, alone), None, SourceProgress.read(METADATA, offset_log(offsets, "0")))
    with pytest.raises(SparkCheckpointMismatchError, match="other source offsets"):
        check(2, commit(3, alone), None, SourceProgress.read(METADATA, offset_log(moved, "0")))
