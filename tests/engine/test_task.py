"""A processor's failure as a task reports it (``engine/task.py``) and the driver raises it
(``engine/outputs.py``), without Spark."""

from __future__ import annotations

from typing import Any

import pytest

from blobstate.engine.outputs import StageFailedError, raise_failed
from blobstate.engine.task import failure_record, processor_frames
from blobstate.processor.runner import _call


def handler(key: Any) -> None:
    """A processor's handler that fails."""
    raise ValueError(f"no such thing as {key[0]}")


def failing_through_blobstate() -> BaseException:
    """The exception of ``handler`` called by blobstate's runner, with its traceback from the runner's
    frame on (as in a task, whose first frame is blobstate's ``run_task``)."""
    try:
        _call(handler, "handleInputRows", ("k1",))
    except ValueError as error:
        assert error.__traceback__ is not None
        return error.with_traceback(error.__traceback__.tb_next)
    raise AssertionError("handler did not raise")


def test_failure_record_is_one_line_and_the_processors_frames() -> None:
    error = failing_through_blobstate()
    error.add_note("(partition 1 of operator 0, batch 3)")

    record = failure_record(error)

    assert record["error"] == (
        "ValueError: no such thing as k1 (in handleInputRows for grouping key ('k1',))"
        " (partition 1 of operator 0, batch 3)"
    )
    frames = record["traceback"]
    assert "in handler" in frames and 'raise ValueError(f"no such thing as {key[0]}")' in frames
    assert "runner.py" not in frames  # blobstate's frames above the processor are left out


def test_processor_frames_is_none_when_every_frame_is_blobstates() -> None:
    tb = failing_through_blobstate().__traceback__
    assert tb is not None and tb.tb_frame.f_code.co_name == "_call"
    assert processor_frames(tb).tb_frame.f_code.co_name == "handler"  # type: ignore[union-attr]
    tb.tb_next = None  # only blobstate's frame left (an output that does not fit fails there)
    assert processor_frames(tb) is None


def test_a_failed_partition_raises_its_exception_first() -> None:
    ok = {"partition": 0, "version": 4, "uid": "u0"}
    metas = {
        0: ok,
        2: {"partition": 2, "failed": {"error": "ValueError: late (partition 2)", "traceback": "  File b\n"}},
        1: {"partition": 1, "failed": {"error": "ValueError: bad (partition 1)", "traceback": "  File a\n"}},
    }
    with pytest.raises(StageFailedError) as raised:
        raise_failed(metas, "batch 3")
    assert str(raised.value) == (
        "batch 3: a task of the processing stage failed: ValueError: bad (partition 1) (1 more partition(s)"
        " failed too)"
    )
    assert raised.value.processor_traceback == "  File a\n"
    raise_failed({0: ok}, "batch 3")  # nothing failed: nothing raised
