"""Issue 33: ``verify`` after a rescale names the partition count of the checkpoint's current layout, not
a sum over the layouts it checked; when the retained versions span a rescale it says so, layout by layout.

The checkpoints are built without Spark (``tests/rescale/rescale_checkpoints.py``, 3 versions retained)
and rescaled in this process, as ``tests/cli/test_batch_ids_cli.py`` does.
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
    """Batches 0-2 on 4 partitions (versions 1-3), then version 4: the rescale of batch 2 to 2."""
    root = tmp_path_factory.mktemp("rescaled")
    url = str(root / "ckpt")
    run_batches(url, batches(3, seed=5), root / "local-4", 4)
    rescale_checkpoint(None, url, 2)
    return url


def _verify(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        main(["verify", *args])
    except SystemExit as exited:
        assert exited.code in (0, None), capsys.readouterr()
    return capsys.readouterr().out


def test_verify_after_a_rescale_names_the_current_layout_s_partitions(
    rescaled: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _verify([rescaled], capsys)
    first = out.splitlines()[0]
    # versions 1..4 are retained: version 4 on the 2 partitions of the new layout, 1..3 on the old 4
    assert first == (
        "checked versions 1..4 (the retained ones) of 2 partition(s) in the current layout (version 4)"
        " and, before a rescale, 4 partition(s) at versions 1..3: 14 partition versions"
    ), out
    assert "6 partition(s)" not in out
    assert out.splitlines()[-1] == "ok: every retained version is restorable"
    checked = json.loads(_verify([rescaled, "--json"], capsys))["checked"]
    assert checked[0] == first


def test_once_the_old_layout_is_no_longer_retained_only_the_current_count_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "ckpt")
    rows = batches(6, seed=7)
    run_batches(url, rows[:3], tmp_path / "local-4", 4)
    rescale_checkpoint(None, url, 2)
    # versions 5..7 retained: the rescale (version 4) no longer is
    run_batches(url, rows[3:], tmp_path / "local-2", 2)
    out = _verify([url], capsys)
    assert out.splitlines()[0] == (
        "checked versions 5..7 (the retained ones) of 2 partition(s): 6 partition versions"
    ), out
