"""Issue 32: after a rescale, ``lineage``, ``inspect`` and ``restore`` name each version by the batch its
commit records (``batch_id``), or as the rescale of one, never as ``version - 1``.

The checkpoint is built without Spark (``tests/rescale/rescale_checkpoints.py``) and rescaled twice in
this process: batches 0-2 make versions 1-3 on 2 partitions, version 4 is the rescale of batch 2 to 3
partitions, batches 3-4 make versions 5-6, version 7 is the rescale of batch 4 back to 2 partitions and
batch 5 makes version 8. A ``version - 1`` reading would call version 8 batch 7.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rescale"))
from rescale_checkpoints import batches, run_batches

from blobstate.cli.main import main
from blobstate.rescale import rescale_checkpoint


@pytest.fixture(scope="module")
def rescaled(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("rescaled")
    url = str(root / "ckpt")
    rows = batches(6, seed=3)
    run_batches(url, rows[:3], root / "local-2", 2)
    rescale_checkpoint(None, url, 3)
    run_batches(url, rows[3:5], root / "local-3", 3)
    rescale_checkpoint(None, url, 2)
    run_batches(url, rows[5:], root / "local-2b", 2)
    return url


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        main(args)
    except SystemExit as exited:
        assert exited.code in (0, None), capsys.readouterr()
    return capsys.readouterr().out


def test_lineage_names_the_recorded_batch(rescaled: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["lineage", rescaled], capsys)
    assert out.splitlines()[0] == "newest committed version: 8 (the state after batch 5)"
    rows = {
        int(line.split()[1]): line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)
    }
    assert {v: int(r[0]) for v, r in rows.items()} == {8: 5, 7: 4, 6: 4, 5: 3, 4: 2, 3: 2, 2: 1, 1: 0}
    assert "(rescale of batch 4 to 2 partitions)" in " ".join(rows[7])
    assert "(rescale of batch 2 to 3 partitions)" in " ".join(rows[4])


def test_a_partition_s_lineage_names_the_recorded_batch(
    rescaled: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(["lineage", rescaled, "--partition", "0"], capsys)
    listed = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    labels = [line.split("  ")[0] for line in listed]
    assert labels == ["batch 5", "rescale of batch 4"], out  # versions 8 and 7 (the layout starts at 7)
    assert "batch 7" not in out and "batch 6" not in out

    info = json.loads(_run(["lineage", rescaled, "--partition", "0", "--json"], capsys))
    assert (info["batch_id"], info["rescale"]) == (5, False)
    versions = info["partitions"][0]["versions"]
    assert [(r["version"], r["batch_id"], r["rescale"]) for r in versions] == [(8, 5, False), (7, 4, True)]


@pytest.mark.parametrize(
    ("version", "phrase"),
    [(None, "version 8, the state after batch 5"), ("7", "version 7, the rescale of batch 4")],
)
def test_inspect_and_restore_name_the_recorded_batch(
    rescaled: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str | None, phrase: str
) -> None:
    chosen = [] if version is None else ["--version", version]
    inspected = _run(["inspect", rescaled, "--partition", "1", *chosen], capsys)
    assert phrase in inspected.splitlines()[0], inspected
    restored = _run(["restore", rescaled, str(tmp_path / "db"), "--partition", "1", *chosen], capsys)
    assert phrase in restored.splitlines()[0], restored

    info = json.loads(_run(["inspect", rescaled, "--partition", "1", *chosen, "--json"], capsys))
    assert (info["version"], info["batch_id"], info["rescale"]) == (
        (8, 5, False) if version is None else (7, 4, True)
    )
