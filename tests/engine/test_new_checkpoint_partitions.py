"""Issue 33: a new checkpoint that takes its partition count from ``spark.sql.shuffle.partitions`` (the
query names no ``num_partitions``) says so once in the driver's log, with how to choose; an existing
checkpoint says nothing. No Spark: ``default_num_partitions`` reads only the session's conf."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.engine.query import default_num_partitions
from blobstate.lineage.commitlog import CommitLog, QueryMetadata


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    """What ``default_num_partitions`` reads of a SparkSession: its runtime conf."""

    def __init__(self, **conf: str) -> None:
        self.conf = _Conf(conf)


def _said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "blobstate" and "new checkpoint" in r.getMessage()]


@pytest.mark.parametrize(
    ("conf", "count", "level"),
    [({}, 200, logging.WARNING), ({"spark.sql.shuffle.partitions": "8"}, 8, logging.INFO)],
)
def test_a_new_checkpoint_logs_its_partition_count_where_it_came_from_and_how_to_choose(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, conf: dict[str, str], count: int, level: int
) -> None:
    caplog.set_level(logging.INFO, logger="blobstate")
    url = str(tmp_path / "ckpt")
    with open_blob_store(url) as store:
        assert default_num_partitions(store, _Session(**conf)) == count  # type: ignore[arg-type]
    (record,) = _said(caplog)
    message = record.getMessage()
    assert record.levelno == level
    assert message.startswith(f"new checkpoint {url}: {count} state partitions, taken from"), message
    assert "spark.sql.shuffle.partitions" in message and "num_partitions=N" in message
    assert ("Spark's default" in message) == (count == 200)
    assert "\n" not in message


def test_an_existing_checkpoint_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blobstate")
    with open_blob_store(str(tmp_path / "ckpt")) as store:
        CommitLog(store).write_metadata(QueryMetadata.new(3, {"0": {"key_columns": ["k"]}}))
        assert default_num_partitions(store, _Session()) == 3  # type: ignore[arg-type]
    assert _said(caplog) == []
