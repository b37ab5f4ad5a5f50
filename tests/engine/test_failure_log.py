"""What a user sees when the processor fails: the cause first, and not pages of Spark's task logs.

The failing query runs in a subprocess with Spark's default logging (``failure_log_job.py``); its stderr
is what a user's console shows. A processor's exception does not fail a Spark task (``engine/task.py``),
so no executor, task set or block manager logs it, and Spark does not retry it; what remains is Spark's
one report of the stopped query, whose first line naming the error is blobstate's one-line cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

JOB = Path(__file__).resolve().parent / "failure_log_job.py"

MAX_STDERR_LINES = 120
"""Spark's start-up warnings and its one report of the stopped query (with a Java stack trace): about
80 lines here; before, each failed task was logged four times with both tracebacks (about 350)."""
CAUSE_WITHIN = 40
"""The cause is on one of the first lines of stderr."""


def run_job(key: str) -> tuple[dict, list[str]]:
    """Run the failing query for ``key``; its outcome (stdout's JSON line) and its stderr lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(JOB), key], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.splitlines()


@pytest.mark.parametrize(
    ("key", "cause"),
    [
        (
            "boom",
            "ValueError: the processor cannot take key boom (in handleInputRows for grouping key ('boom',))",
        ),
        ("misfit", "OutputSchemaError: output column 'n' (bigint) cannot hold 'not a number' (str)"),
    ],
)
def test_a_failing_processor_prints_its_cause_first_and_few_lines(key: str, cause: str) -> None:
    outcome, stderr = run_job(key)

    naming = [i for i, line in enumerate(stderr) if key in line or "not a number" in line]
    assert naming, "\n".join(stderr)
    assert cause in stderr[naming[0]] and "ProcessorFailedError" in stderr[naming[0]], stderr[naming[0]]
    assert naming[0] < CAUSE_WITHIN, "\n".join(stderr[: naming[0] + 1])
    assert len(stderr) < MAX_STDERR_LINES, "\n".join(stderr)
    quiet = ("ERROR Executor", "TaskSetManager", "BlockManager")  # no Spark task failed, none retried
    assert not [line for line in stderr if any(name in line for name in quiet)], "\n".join(stderr)

    assert outcome["raised"] == "ProcessorQueryError" and outcome["sink_calls"] == []
    first = outcome["message"].splitlines()[0]
    assert cause in first and "batch 0" in first, first
    if key == "boom":  # the processor's own frame follows the first line
        assert f'{JOB.name}", line' in outcome["message"] and "raise ValueError" in outcome["message"]
