"""``blobstate demo`` end to end, small: killed and restarted, its sessions and the tiers they carry from
the profile side stream equal the plain-Python reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from blobstate.demo.clickstream import StreamShape
from blobstate.demo.run import run_demo


@pytest.mark.spark
@pytest.mark.slow
def test_the_demo_with_its_profile_side_stream_matches_the_reference_across_a_kill(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "demo", StreamShape(batches=5, events_per_batch=600, users=300), 2, 2)
    assert result.matches
    assert result.batches_first_run == 2 and result.batches_second_run >= 4
    assert result.sessions_emitted == result.sessions_expected > 100
