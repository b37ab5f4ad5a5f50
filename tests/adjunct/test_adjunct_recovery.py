"""The adjunct recovery decision table (docs/DESIGN.md), every row, on one checkpoint restarted with
different options.

| start | store          | bootstrap | expected                                               |
|-------|----------------|-----------|--------------------------------------------------------|
| 1     | not found      | yes       | created; main rows held until the backlog is in        |
| (e2e) | not found      | no        | created; continue (test_adjunct_engine's enrichment)   |
| 2     | found, valid   | yes       | continue from the recorded offset                      |
| 3     | found, too old | yes       | re-created; history reloaded up to the recorded offset |
| 4     | found, too old | no        | re-created empty; continue from the recorded offset    |
| 5     | non-persistent | yes       | re-created; history reloaded                           |
| 6     | non-persistent | no        | re-created empty; continue                             |
| 7     | found, source  | yes       | re-created; reloaded from the files the source has     |
|       | lost a file    |           |                                                        |

Each start's outputs are checked against :class:`adjunct_jobs.Model`, which empties and refills its
stores exactly as the table says; stores that continue and stores that are reloaded are told apart by
what the processor sees and by the start recorded in the commit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from adjunct_jobs import Model, RecordingSink, clicks, discounts, profiles, start_query, write_files

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import CommitLog

pytestmark = pytest.mark.spark

C = [
    clicks([("a", 1), ("b", 2)]),
    clicks([("c", 3)]),
    clicks([("a", 4), ("d", 5)]),
    clicks([("d", 6), ("b", 7)]),
    clicks([("a", 8), ("c", 9)]),
    clicks([("a", 10), ("d", 11)]),
    clicks([("b", 12), ("c", 13)]),
    clicks([("a", 14)]),
    clicks([("b", 15), ("d", 16)]),
]
P = [
    profiles([("a", "gold"), ("b", "silver")]),
    profiles([("c", "gold")]),
    profiles([("a", "silver"), ("d", "gold")]),
    profiles([("d", "silver"), ("c", None)]),
    profiles([("a", "gold")]),
]
D = [discounts([("gold", 10)]), discounts([("silver", 5)]), discounts([("gold", 15)])]


def _run(spark: Any, base: Path, sink: RecordingSink, until_version: int, **options: Any) -> None:
    """Start the query, let it process everything, wait for commit ``until_version``, stop it."""
    query = start_query(spark, base, str(base / "ckpt"), sink, local_dir=str(base / "local"), **options)
    log = CommitLog(open_blob_store(str(base / "ckpt")))
    try:
        deadline = time.monotonic() + 90
        while True:
            query.processAllAvailable()
            latest = log.latest_commit()
            if latest is not None and latest.version >= until_version:
                break
            assert time.monotonic() < deadline, f"no commit {until_version} (at {latest and latest.version})"
            time.sleep(0.5)
    finally:
        query.stop()


def _adjuncts(base: Path, version: int) -> dict[str, Any]:
    return CommitLog(open_blob_store(str(base / "ckpt"))).read_commit(version).metrics["adjuncts"]


def test_every_row_of_the_recovery_decision_table(spark: Any, tmp_path: Path) -> None:
    model = Model()
    sink = RecordingSink()
    write_files(tmp_path / "clicks", C[:3])
    write_files(tmp_path / "profiles", P[:3])
    write_files(tmp_path / "discounts", D)

    # 1. Not found, bootstrap, rate-limited side streams (one file per batch): the clicks of batches
    # 0-2 are held while the side files load; batch 3 (asked for without new input) releases them.
    _run(spark, tmp_path, sink, 4, bootstrap=True)
    model.side(P[0], D[0])
    model.side(P[1], D[1])
    model.side(P[2], D[2])
    assert sink.rows == {3: model.clicks(C[0], C[1], C[2])}
    held = [_adjuncts(tmp_path, v)["$held_rows"] for v in (1, 2, 3, 4)]
    assert [h["deferred"] for h in held] == [2, 1, 2, 0]
    assert held[3]["released"] == 5
    assert _adjuncts(tmp_path, 1)["profiles"]["start"]["found"] == "not found"
    assert _adjuncts(tmp_path, 4)["profiles"]["waiting_for_backlog"] is False

    # 2. Found and valid (updated well within max_age_seconds): continue from the recorded offset.
    write_files(tmp_path / "profiles", P[3:4], first=3)
    write_files(tmp_path / "clicks", C[3:4], first=3)
    sink.rows.clear()
    _run(spark, tmp_path, sink, 5, bootstrap=True, max_age_seconds=3600)
    model.side(P[3])
    assert sink.rows == {4: model.clicks(C[3])}
    start = _adjuncts(tmp_path, 5)["profiles"]["start"]
    assert (start["found"], start["recreate"]) == ("found and valid", False)

    # 3. Found but too old, bootstrap: re-created and its history (every side file read so far) loaded
    # again before the batch's clicks.
    time.sleep(0.05)
    write_files(tmp_path / "clicks", C[4:5], first=4)
    sink.rows.clear()
    _run(spark, tmp_path, sink, 6, bootstrap=True, max_age_seconds=0.01)
    model.reset_sides()
    for p in P[:4]:
        model.side(p)
    for d in D:
        model.side(discount=d)
    assert sink.rows == {5: model.clicks(C[4])}
    recorded = _adjuncts(tmp_path, 6)
    assert recorded["profiles"]["start"]["reload"] is True
    assert recorded["profiles"]["rows"] == sum(p.num_rows for p in P[:4])  # the history was read again
    assert recorded["discounts"]["rows"] == sum(d.num_rows for d in D)

    # 4. Found but too old, no bootstrap: re-created empty; only new side rows fill it.
    write_files(tmp_path / "profiles", P[4:5], first=4)
    write_files(tmp_path / "clicks", C[5:6], first=5)
    sink.rows.clear()
    time.sleep(0.05)
    _run(spark, tmp_path, sink, 7, bootstrap=False, max_age_seconds=0.01)
    model.reset_sides()
    model.side(P[4])
    assert sink.rows == {6: model.clicks(C[5])}  # d's profile and every discount are gone

    # 5. Not persistent, bootstrap: always re-created and reloaded at a start.
    write_files(tmp_path / "clicks", C[6:7], first=6)
    sink.rows.clear()
    _run(spark, tmp_path, sink, 8, bootstrap=True, persistent=False)
    model.reset_sides()
    for p in P:
        model.side(p)
    for d in D:
        model.side(discount=d)
    assert sink.rows == {7: model.clicks(C[6])}

    # 6. Not persistent, no bootstrap: re-created empty, continue.
    write_files(tmp_path / "clicks", C[7:8], first=7)
    sink.rows.clear()
    _run(spark, tmp_path, sink, 9, bootstrap=False, persistent=False)
    model.reset_sides()
    assert sink.rows == {8: model.clicks(C[7])}
    start = _adjuncts(tmp_path, 9)["discounts"]["start"]
    assert (start["found"], start["recreate"], start["reload"]) == ("found but not valid", True, False)

    # 7. Persistent and recent, but the side source no longer has a file of the recorded offset (the
    # first profile file was deleted): not valid; re-created and reloaded from what the source has.
    (tmp_path / "profiles" / "batch-00000.parquet").unlink()
    write_files(tmp_path / "clicks", C[8:9], first=8)
    sink.rows.clear()
    _run(spark, tmp_path, sink, 10, bootstrap=True, max_age_seconds=3600)
    model.profile.clear()  # the discounts store is valid (and still empty since start 6): it continues
    for p in P[1:]:
        model.side(p)
    assert sink.rows == {9: model.clicks(C[8])}
    start = _adjuncts(tmp_path, 10)["profiles"]["start"]
    assert (start["found"], start["reload"]) == ("found but not valid", True)
    assert "batch-00000.parquet" in start["reason"]
