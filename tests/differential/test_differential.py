"""Generated jobs of every key and state type, session time zone and partition count: blobstate against
a plain-Python model and against Spark's own ``transformWithStateInPandas`` (:mod:`differential`), with a
rescale and a restart under another zone in between. CI runs a few seeds; ``long_run.py`` runs
thousands by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from differential import generate_job, run_job

pytestmark = pytest.mark.spark

CI_SEEDS = [3, 5, 8, 1026]
"""Seeds whose jobs cover a TIMESTAMP in a composite key across a zone change, a float key, TIMESTAMP and
TIMESTAMP_NTZ state, DST zones and rescales both ways, and (1026) a struct key holding a TIMESTAMP, whose
state a change of zone once lost."""


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_generated_job_agrees_with_the_model_and_with_spark(spark: Any, tmp_path: Path, seed: int) -> None:
    job = generate_job(seed)
    verdict = run_job(spark, job, tmp_path)
    assert verdict.ok, "\n".join([job.describe(), *verdict.disagreements])


def test_the_generator_covers_every_type_and_zone() -> None:
    """Over the long run's seeds the generator draws every key type, zone and partition count."""
    from differential import ZONES

    seen: set[str] = set()
    zones: set[str] = set()
    counts: set[tuple[int, int]] = set()
    for seed in range(1000, 1300):
        job = generate_job(seed)
        seen.update(t.typeName() for t in job.key_types)
        zones.update((job.first_zone, job.second_zone))
        counts.add((job.m, job.n))
    assert {
        "byte",
        "short",
        "integer",
        "long",
        "float",
        "double",
        "decimal",
        "string",
        "binary",
        "boolean",
        "date",
        "timestamp",
        "timestamp_ntz",
        "struct",
    } <= seen
    assert zones == set(ZONES)
    assert {(1, 3), (3, 1), (2, 4)} <= counts
