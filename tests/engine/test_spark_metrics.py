"""blobstate's per-batch figures in Spark's own metrics system: the gauges of the source
``blobstate.<query>`` on the driver, read where a dashboard reads them (the Prometheus servlet, over
HTTP, from a running query), equal to what the query's progress says; the source goes when the query
stops. ``metrics_job.py`` runs the query in its own SparkSession (sinks are fixed at start)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from blobstate.engine.ticks import gauges, metrics_source_name

pytestmark = pytest.mark.spark

JOB = Path(__file__).resolve().parent / "metrics_job.py"
GAUGE = r'metrics_metricsjob_driver_blobstate_counts_(\w+)_Value\{type="gauges"\} (\S+)'
"""A gauge of the query ``counts`` as Spark's Prometheus servlet writes it (namespace ``metricsjob``)."""


def test_gauges_are_the_numbers_of_a_batchs_metrics() -> None:
    metrics = {
        "batchId": 3,
        "skipped": False,
        "seconds": 1.5,
        "loadRules": {"working": 2, "empty": 1},
        "standby": {"failovers": 1, "moves": [{"partition": 0}]},
        "partitions": {"0": {"input_rows": 4}},
        "note": "text",
    }
    assert gauges(metrics) == {
        "batchId": 3.0,
        "skipped": 0.0,
        "seconds": 1.5,
        "loadRules.working": 2.0,
        "loadRules.empty": 1.0,
        "standby.failovers": 1.0,
    }
    assert metrics_source_name("fraud scores", "q") == "blobstate.fraud_scores"
    assert metrics_source_name(None, "5f0c3f3e-9d7e") == "blobstate.5f0c3f3e-9d7e"


def test_the_prometheus_endpoint_of_a_running_query_shows_blobstates_figures() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(JOB)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    progress = out["progress"]
    found: dict[str, float] = {}
    for line in out["lines"]:
        # metrics_metricsjob_driver_blobstate_counts_inputRows_Value{type="gauges"} 2.0
        match = re.fullmatch(
            r'metrics_metricsjob_driver_blobstate_counts_(\w+)_Value\{type="gauges"\} (\S+)', line
        )
        if match:
            found[match[1]] = float(match[2])
    assert found, "\n".join(out["lines"]) or done.stderr[-3000:]
    assert progress["batchId"] == 1 and progress["inputRows"] == 2
    for name in ("batchId", "version", "inputRows", "outputRows", "stateKeys", "bytesUploaded", "seconds"):
        assert found[name] == pytest.approx(float(progress[name])), (name, found, progress)
    assert found["loadRules_working"] == progress["loadRules"]["working"]
    assert out["after_stop"] == [], "the query's source stayed registered after it stopped"
