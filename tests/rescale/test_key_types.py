"""A rescale keeps the state of keys whose Spark hash an earlier Python copy got wrong: DECIMAL keys above
18 digits whose unscaled value is -2^(8k-1) (-1.28 at scale 2 was placed in the wrong partition from 1
partition, and refused from 2), from 1 and from 2 partitions, through the real Spark job."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blobstate.processor import StatefulProcessor

pytestmark = pytest.mark.spark

KEYS = [
    Decimal("-1.28"),
    Decimal("-327.68"),
    Decimal("-83886.08"),
    Decimal("-21474836.48"),
    Decimal("0.00"),
    Decimal("1.27"),
    Decimal("99999999999999999.99"),
    Decimal("-99999999999999999.99"),
    Decimal("12.34"),
]
"""Unscaled -2^7, -2^15, -2^23, -2^31 and neighbours of DECIMAL(20,2)."""


class DecimalCount(StatefulProcessor):
    """A count per DECIMAL key."""

    def init(self, handle: Any) -> None:
        """Declare the count."""
        self.count = handle.getValueState("count", "n BIGINT")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Add the rows and emit the count."""
        n = sum(len(f) for f in rows) + ((self.count.get() or (0,))[0])
        self.count.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})


def _write(directory: Path, batch: int, keys: list[Decimal]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"k": pa.array(keys, type=pa.decimal128(20, 2))})
    tmp = directory / f".b{batch}.tmp"
    pq.write_table(table, tmp)
    os.utime(tmp, (time.time() - 3600 + batch,) * 2)
    os.replace(tmp, directory / f"b{batch}.parquet")


@pytest.mark.parametrize("first", [1, 2])
def test_wide_decimal_keys_keep_their_state_across_a_rescale(spark: Any, tmp_path: Path, first: int) -> None:
    import blobstate
    from blobstate.rescale import rescale_checkpoint

    seen: dict[int, dict[Decimal, int]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        seen[batch_id] = {r["k"]: r["n"] for r in frame.collect()}

    def run(partitions: int) -> None:
        query = blobstate.transform_with_state(
            spark.readStream.schema("k DECIMAL(20,2)")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "in")),
            key="k",
            processor=DecimalCount(),
            output_schema="k DECIMAL(20,2), n BIGINT",
            checkpoint=str(tmp_path / "ckpt"),
            sink=sink,
            num_partitions=partitions,
            local_dir=str(tmp_path / "local"),
            async_cleanup=False,
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    _write(tmp_path / "in", 0, KEYS + KEYS[:3])
    run(first)
    rescale_checkpoint(spark, str(tmp_path / "ckpt"), 3)
    _write(tmp_path / "in", 1, KEYS)
    run(3)
    expected = Counter(KEYS + KEYS[:3] + KEYS)
    assert seen[1] == {k: expected[k] for k in KEYS}, "a key's count restarted: its state was misplaced"
