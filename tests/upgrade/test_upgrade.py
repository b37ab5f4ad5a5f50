"""A checkpoint written by an earlier release (``checkpoint/``, from ``make_checkpoint.py``) opens in
this one: the query continues on it with exact outputs, ``verify`` finds it restorable and its state
reads back."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from make_checkpoint import NUM_PARTITIONS, OPTIONS, ROOT_PLACEHOLDER, run_query, write_inputs

from blobstate.blobstore import open_blob_store
from blobstate.lineage.commitlog import COMMIT_FORMAT_VERSION, CommitLog
from blobstate.state.verify import verify

HERE = Path(__file__).parent
MORE: list[list[tuple[str, int]]] = [
    [("a", 20), ("i", 21), ("b", 22)],
    [("c", 23), ("c", 24)],
    [("j", 25), ("a", 26), ("h", 27)],
    [("d", 28)],
    [("e", 29), ("f", 30), ("g", 31)],
]
"""Batches the test adds: enough for the retention and the pruning of the old commits to run."""


def reference(batches: list[list[tuple[str, int]]]) -> dict[int, list[list[Any]]]:
    """The running count's output per batch id: each key of the batch with its count and total so far."""
    count: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    out = {}
    for batch_id, rows in enumerate(batches):
        for key, value in rows:
            count[key] += 1
            total[key] += value
        out[batch_id] = sorted([k, count[k], total[k]] for k in {k for k, _ in rows})
    return out


def copy_fixture(root: Path) -> None:
    """The stored checkpoint under ``root/checkpoint``, its paths made those of ``root``."""
    shutil.copytree(HERE / "checkpoint", root / "checkpoint")
    for path in (root / "checkpoint" / "_spark").rglob("*"):
        if path.is_file() and ROOT_PLACEHOLDER.encode() in path.read_bytes():
            path.write_bytes(path.read_bytes().replace(ROOT_PLACEHOLDER.encode(), str(root).encode()))


@pytest.mark.spark
def test_a_checkpoint_of_the_earlier_release_continues_verifies_and_reads(spark: Any, tmp_path: Path) -> None:
    import blobstate

    expected = json.loads((HERE / "expected.json").read_text())
    old = [[tuple(r) for r in batch] for batch in expected["batches"]]
    assert expected["options"] == OPTIONS and expected["num_partitions"] == NUM_PARTITIONS
    everything = reference(old + MORE)
    assert {int(b): rows for b, rows in expected["outputs"].items()} == {
        b: everything[b] for b in range(len(old))
    }

    root = tmp_path.resolve() / "upgrade"
    copy_fixture(root)
    write_inputs(root / "input", old + MORE)
    outputs = run_query(spark, root, tmp_path / "local")

    assert outputs == {b: everything[b] for b in range(len(old), len(old) + len(MORE))}
    url = str(root / "checkpoint")
    with open_blob_store(url) as store:
        log = CommitLog(store)
        latest = log.latest_commit()
        assert latest is not None and latest.version == len(old) + len(MORE)
        assert latest.format_version == COMMIT_FORMAT_VERSION
        # The earlier release's commits below the horizon were pruned; the rest is complete.
        assert latest.horizon > 1 and log.versions() == list(range(latest.horizon, latest.version + 1))
        report = verify(store)
        assert report.problems == [], [str(p) for p in report.problems]
        assert report.versions_checked > 0

    rows = blobstate.read_state(spark, url).collect()
    counts = {r["key"]["key"]: (r["value"]["count"], r["value"]["total"]) for r in rows}
    final = {k: (c, t) for rows_ in everything.values() for k, c, t in rows_}
    assert counts == final
