"""The order side rows are applied in: by file in the source's log order, then by position in the file."""

from __future__ import annotations

import json

import pyarrow as pa

from blobstate.adjunct.order import batch_files, file_key, ranked_by_file
from blobstate.adjunct.records import in_order, split_side_rows
from blobstate.adjunct.spec import FILE_COLUMN, PHASE_COLUMN, RANK_COLUMN, ROW_COLUMN, TAG_COLUMN

BIG = 1 << 33
"""``monotonically_increasing_id`` of a row in read partition 1 (partition index in the upper bits)."""


def side_rows(rows: list[tuple[str, int, int, str | None, int]]) -> pa.Table:
    """Side rows of ``profiles``: (value, phase, rank, file, row)."""
    return pa.table(
        {
            "user": ["k"] * len(rows),
            "__bsadj_profiles__tier": [r[0] for r in rows],
            TAG_COLUMN: ["profiles"] * len(rows),
            PHASE_COLUMN: pa.array([r[1] for r in rows], pa.int32()),
            RANK_COLUMN: pa.array([r[2] for r in rows], pa.int64()),
            FILE_COLUMN: pa.array([r[3] for r in rows], pa.string()),
            ROW_COLUMN: pa.array([r[4] for r in rows], pa.int64()),
        }
    )


def values(table: pa.Table) -> list[str]:
    return table.column("__bsadj_profiles__tier").to_pylist()


def test_a_batch_s_files_are_applied_in_log_order_then_rows_in_file_order() -> None:
    # Spark read the large newer file in partition 0 and the small older one in partition 1.
    small, large = "file:///in/z-small.parquet", "file:///in/a-large.parquet"
    table = side_rows(
        [
            ("large-1", 1, 0, large, 7),
            ("small", 1, 0, small, BIG),
            ("large-0", 1, 0, large, 3),
            ("history", 0, 4, None, BIG + 1),
        ]
    )
    assert values(in_order(table)) == ["history", "large-0", "large-1", "small"]  # read partition order
    assert values(in_order(table, [small, large])) == ["history", "small", "large-0", "large-1"]
    _, sides = split_side_rows(table.to_batches(), TAG_COLUMN, ["profiles"], {"profiles": [small, large]})
    assert values(sides["profiles"]) == ["history", "small", "large-0", "large-1"]


def test_file_names_match_however_spark_spells_them_and_unlisted_files_come_last() -> None:
    assert file_key("file:///tmp/in%20dir/a.parquet") == file_key("file:/tmp/in dir/a.parquet")
    assert file_key("s3a://bucket/a.parquet") != file_key("s3a://other/a.parquet")
    table = side_rows(
        [
            ("unlisted", 1, 0, "file:/in/x.parquet", 0),
            ("second", 1, 0, "file:/in/b.parquet", 1),
            ("first", 1, 0, "file:/in/a.parquet", BIG),
            ("no file", 1, 0, None, 5),
        ]
    )
    ranked = ranked_by_file(table, ["file:///in/a.parquet", "file:///in/b.parquet"])
    assert ranked.column(RANK_COLUMN).to_pylist() == [2, 1, 0, 0]
    assert values(in_order(table, ["file:///in/a.parquet", "file:///in/b.parquet"])) == [
        "no file",
        "first",
        "second",
        "unlisted",
    ]


def entries(*items: tuple[str, int]) -> bytes:
    lines = ["v1"] + [json.dumps({"path": p, "timestamp": 0, "batchId": b}) for p, b in items]
    return "\n".join(lines).encode()


def test_a_batch_s_files_come_from_its_own_log_entries_or_the_compacted_one() -> None:
    logs = {
        "sources/1/9.compact": entries(("f0", 0), ("f1", 8), ("f2", 9), ("f3", 9)),
        "sources/1/10": entries(("f5", 10), ("f4", 10)),
        "sources/1/11": entries(("f6", 11)),
        "sources/2/0": entries(("g0", 0), ("g1", 0)),
    }
    read: list[str] = []

    def list_dir(path: str) -> list[str]:
        return sorted(n.rsplit("/", 1)[1] for n in logs if n.startswith(path + "/"))

    def read_file(path: str) -> bytes:
        read.append(path)
        return logs[path]

    sources = {"profiles": (1, 1), "discounts": (2, 1), "rates": (3, 1)}
    offsets = {"profiles": [{"logOffset": 10}], "discounts": [{"logOffset": 0}], "rates": [{"0": 5}]}
    before = {"profiles": [{"logOffset": 8}]}
    found = batch_files(sources, offsets, before, list_dir, read_file)
    assert found == {"profiles": ("f2", "f3", "f5", "f4"), "discounts": ("g0", "g1")}
    assert sorted(read) == ["sources/1/10", "sources/1/9.compact", "sources/2/0"]
    # one file in the batch: nothing to order by file
    after = {"profiles": [{"logOffset": 10}]}
    assert batch_files(sources, {"profiles": [{"logOffset": 11}]}, after, list_dir, read_file) == {}
