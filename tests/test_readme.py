"""README's examples run as written (each in its own process, as a user would run it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = [pytest.mark.spark]


def snippet(heading: str) -> str:
    """The first Python block of a README section, unchanged."""
    section = README.read_text().split(f"## {heading}", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no Python block in README's {heading!r}"
    return match.group(1)


def run_example(tmp_path: Path, code: str) -> None:
    """Run ``code`` as ``example.py`` in ``tmp_path``, with the environment a user's shell would give."""
    (tmp_path / "example.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_the_using_it_example_runs_as_written_and_counts_per_key(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    batches = [
        pa.table({"key": ["a", "b", "a"], "value": [1, 2, 3]}),
        pa.table({"key": ["b", "c"], "value": [10, 20]}),
    ]
    for i, table in enumerate(batches):
        pq.write_table(table, tmp_path / "in" / f"part-{i}.parquet")
    run_example(tmp_path, snippet("Using it"))
    rows = {}
    for part in sorted((tmp_path / "out").glob("batch=*")):
        for row in pq.read_table(part).to_pylist():
            rows[row["key"]] = (row["count"], row["total"])
    # Both files may land in one batch or in two; the final totals are the same.
    assert rows == {"a": (2, 4), "b": (2, 12), "c": (1, 20)}


def test_the_side_stream_example_runs_as_written_and_enriches_every_click(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "clicks").mkdir()
    pq.write_table(
        pa.table({"user": ["a", "b"], "tier": ["gold", "silver"]}), tmp_path / "profiles" / "p0.parquet"
    )
    pq.write_table(
        pa.table({"user": ["a", "b", "c", "a"], "page": [1, 2, 3, 4]}), tmp_path / "clicks" / "c0.parquet"
    )
    run_example(tmp_path, snippet("Side streams (adjunct stores)"))
    rows = sorted(
        (r["user"], r["page"], r["tier"])
        for part in (tmp_path / "enriched").glob("batch=*")
        for r in pq.read_table(part).to_pylist()
    )
    assert rows == [("a", 1, "gold"), ("a", 4, "gold"), ("b", 2, "silver"), ("c", 3, None)]


def section_snippets(heading: str) -> list[str]:
    """Every Python block of a README section, unchanged, in order."""
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_moving_example_moves_a_job_to_blobstate_and_back_keeping_its_counts(tmp_path: Path) -> None:
    blocks = section_snippets("Moving a job to or from blobstate")
    assert len(blocks) == 2, "the section has a block for each direction"
    run_example(tmp_path, "\n".join(blocks))

    def outputs(run: str) -> dict[str, tuple[int, int]]:
        parts = sorted((tmp_path / "out" / run).glob("batch=*"))
        assert [p.name for p in parts] == ["batch=0"], f"{run}: {parts}"
        return {r["key"]: (r["count"], r["total"]) for r in pq.read_table(parts[0]).to_pylist()}

    assert outputs("spark") == {"a": (2, 4), "b": (1, 2)}
    assert outputs("blobstate") == {"a": (3, 14), "c": (1, 7)}  # a's count came from Spark's state
    assert outputs("spark-again") == {"a": (4, 19), "b": (2, 8)}  # b was never seen by blobstate
