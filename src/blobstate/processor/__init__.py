"""PySpark ``transformWithStateInPandas``-compatible processor API and its engine-independent runner."""

from blobstate.batch.contracts import RunSpec
from blobstate.processor.api import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from blobstate.processor.arrow_api import ArrowHandle, ArrowStatefulProcessor, ExpiredTimers, KeyedBatch
from blobstate.processor.errors import (
    ImplicitKeyError,
    InvalidHandleStateError,
    InvalidTimeModeError,
    OutputSchemaError,
    StatefulProcessorError,
    StateVariableError,
)
from blobstate.processor.runner import RunInputs, RunStats, run_partition

__all__ = [
    "ArrowHandle",
    "ArrowStatefulProcessor",
    "ExpiredTimerInfo",
    "ExpiredTimers",
    "ImplicitKeyError",
    "InvalidHandleStateError",
    "InvalidTimeModeError",
    "KeyedBatch",
    "ListState",
    "MapState",
    "OutputSchemaError",
    "RunInputs",
    "RunSpec",
    "RunStats",
    "StateVariableError",
    "StatefulProcessor",
    "StatefulProcessorError",
    "StatefulProcessorHandle",
    "TimerValues",
    "ValueState",
    "run_partition",
]
