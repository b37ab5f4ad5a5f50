"""A timer callback named for the other processor API never runs: the processor is warned about at
start-up (a warning and a log line naming the class and the right method)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from processor_helpers import run

from blobstate.processor import StatefulProcessor
from blobstate.processor.api import CallbackNameWarning
from blobstate.processor.arrow_api import ArrowStatefulProcessor, check_api

OUTPUT = "key STRING, at BIGINT"
TIMED = {"key_columns": ["key"], "output_schema": OUTPUT, "time_mode": "ProcessingTime"}


class PerKeyWithVectorizedName(StatefulProcessor):
    """A per-key processor whose timer callback carries the vectorized API's name."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for _ in rows:
            pass
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 10)
        return iter(())

    def handleExpiredTimers(self, timers: Any, timerValues: Any) -> Any:
        yield pd.DataFrame({"key": ["never"], "at": [0]})


class VectorizedWithPerKeyName(ArrowStatefulProcessor):
    """A vectorized processor whose timer callback carries the per-key API's name."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputBatch(self, batch: Any, timerValues: Any) -> Any:
        self.handle.registerTimers(timerValues.getCurrentProcessingTimeInMs() + 10)
        return []

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        yield pa.table({"key": ["never"], "at": [0]})


class PerKeyRight(PerKeyWithVectorizedName):
    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        yield pd.DataFrame({"key": [key[0]], "at": [expiredTimerInfo.getExpiryTimeInMs()]})


class BothApis(ArrowStatefulProcessor):
    """Written for both APIs: the vectorized base's default handleExpiredTimers is not a misnaming."""

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputBatch(self, batch: Any, timerValues: Any) -> Any:
        return []

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        return iter(())


@pytest.mark.parametrize(
    ("processor", "api", "defined", "called"),
    [
        (PerKeyWithVectorizedName, "pandas", "handleExpiredTimers", "handleExpiredTimer"),
        (PerKeyWithVectorizedName, "row", "handleExpiredTimers", "handleExpiredTimer"),
        (VectorizedWithPerKeyName, "arrow", "handleExpiredTimer", "handleExpiredTimers"),
    ],
)
def test_a_timer_callback_of_the_other_api_is_warned_about_before_init(
    store: Any, caplog: pytest.LogCaptureFixture, processor: type, api: str, defined: str, called: str
) -> None:
    # a class not warned about yet in this process
    processor = type(f"{processor.__name__}_{api}", (processor,), {})
    data = pa.table({"key": ["a"], "value": [1]})
    with caplog.at_level(logging.WARNING), pytest.warns(CallbackNameWarning) as warned:
        assert run(processor(), store, data, api=api, batch_timestamp_ms=100, **TIMED) == []
        # the timer fires in the next batch, and the misnamed callback never runs
        assert run(processor(), store, None, api=api, batch_timestamp_ms=200, **TIMED) == []
    message = str(warned[0].message)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{processor.__qualname__} defines {defined}, ")
    assert message.endswith(f"rename {defined} to {called}")
    assert caplog.messages.count(message) == 1  # logged once per class, however many batches


def test_a_class_unpickled_again_for_each_task_is_warned_about_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A Python worker gets a class defined in the driver's __main__ as a new class object in every
    task; the warning and the log line must not repeat with every task and batch."""
    copies = [type("PerKeyUnpickled", (PerKeyWithVectorizedName,), {}) for _ in range(3)]
    data = pa.table({"key": ["a"], "value": [1]})
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", CallbackNameWarning)
        for batch, cls in enumerate(copies):
            run(cls(), store, data if batch == 0 else None, batch_timestamp_ms=100 * (batch + 1), **TIMED)
    assert len([w for w in warned if issubclass(w.category, CallbackNameWarning)]) == 1
    logged = [m for m in caplog.messages if m.startswith("PerKeyUnpickled defines handleExpiredTimers")]
    assert len(logged) == 1


def test_processors_that_name_their_callbacks_right_are_not_warned_about(store: Any) -> None:
    data = pa.table({"key": ["a"], "value": [1]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", CallbackNameWarning)
        run(PerKeyRight(), store, data, batch_timestamp_ms=100, **TIMED)
        assert run(PerKeyRight(), store, None, batch_timestamp_ms=200, **TIMED) == [{"key": "a", "at": 110}]
        for api in ("pandas", "arrow"):
            check_api(BothApis(), api)
