"""Issue 33: ``lineage --partition P`` (or ``--operator``) that the checkpoint's layout does not have exits
1 with one line naming the partitions it has, instead of exiting 0 and listing nothing.

The checkpoint is built without Spark (``tests/rescale/rescale_checkpoints.py``): batches 0-2 on 4
partitions (versions 1-3), version 4 the rescale of batch 2 to 2 partitions, batch 3 version 5.
"""

from __future__ import annotations

import json
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
    rows = batches(4, seed=11)
    run_batches(url, rows[:3], root / "local-4", 4)
    rescale_checkpoint(None, url, 2)
    run_batches(url, rows[3:], root / "local-2", 2)
    return url


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize("flags", [[], ["--json"], ["--limit", "1"]])
def test_a_partition_the_current_layout_does_not_have_is_one_error_line(
    rescaled: str, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails(["lineage", rescaled, "--partition", "7", *flags], capsys)
    assert line.startswith(
        f"error: the checkpoint {rescaled} has no partition 7: it has partitions 0..1 (its layout since the"
        " rescale at version 4)"
    ), line


def test_a_partition_of_the_old_layout_only_is_refused_at_the_newest_version(
    rescaled: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails(["lineage", rescaled, "--partition", "3"], capsys)
    assert "has no partition 3: it has partitions 0..1" in line
    # at version 3, before the rescale, partition 3 exists: shown, exit 0
    with pytest.raises(SystemExit) as exited:
        main(["lineage", rescaled, "--partition", "3", "--version", "3", "--json"])
    assert exited.value.code in (0, None)
    listed = json.loads(capsys.readouterr().out)["partitions"]
    shown = [(part["partition"], [row["version"] for row in part["versions"]]) for part in listed]
    assert shown == [(3, [3])]
    line = _fails(["lineage", rescaled, "--partition", "4", "--version", "3"], capsys)
    assert "has no partition 4 at version 3: it has partitions 0..3" in line


def test_an_operator_the_checkpoint_does_not_have_is_one_error_line(
    rescaled: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails(["lineage", rescaled, "--operator", "7", "--partition", "0"], capsys)
    assert line.startswith(f"error: the checkpoint {rescaled} has no operator '7': it has 0"), line


def test_a_partition_it_has_is_listed(rescaled: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lineage", rescaled, "--partition", "1"])
    assert exited.value.code in (0, None)
    assert "operator 0 partition 1:" in capsys.readouterr().out
