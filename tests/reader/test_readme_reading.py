"""README's "Reading state" example runs as written, on the checkpoint its "Using it" example leaves (here
built by the real partition and commit code with the same processor, then read through the session)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from checkpoints import write_checkpoint

import blobstate
from blobstate.demo.running_count import RUNNING_COUNT_OUTPUT, RunningCount

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.spark


def reading_state_snippet() -> str:
    """The first Python block of README's "Reading state" section, unchanged."""
    section = README.read_text().split("## Reading state", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no Python block in README's 'Reading state'"
    return match.group(1)


def test_the_reading_state_example_runs_as_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    batches = [[("a", 1), ("b", 2), ("a", 3)], [("b", 10), ("c", 20)]]
    write_checkpoint(
        str(tmp_path / "checkpoints" / "counts"), batches, tmp_path / "local", RunningCount,
        RUNNING_COUNT_OUTPUT, num_partitions=4,
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scope = {"spark": spark, "blobstate": blobstate, "os": os}
    exec(compile(reading_state_snippet(), "README.md (Reading state)", "exec"), scope)
    shown = capsys.readouterr().out
    rows = {tuple(r) for r in scope["counts"].select("key.key", "value.count", "value.total").collect()}
    assert rows == {("a", 2, 4), ("b", 2, 12), ("c", 1, 20)}
    assert "|key|count|total|partition_id|" in shown
    # version 1, partition 0: the keys of partition 0 after the first batch only
    old = {(r.key.key, r.value.count) for r in scope["old"].collect()}
    assert all(k in ("a", "b") for k, _ in old) and {r.partition_id for r in scope["old"].collect()} <= {0}
