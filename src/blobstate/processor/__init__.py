"""PySpark ``transformWithStateInPandas``-compatible processor API and its engine-independent runner."""

from blobstate.processor.api import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from blobstate.processor.errors import (
    ImplicitKeyError,
    InvalidHandleStateError,
    InvalidTimeModeError,
    OutputSchemaError,
    StatefulProcessorError,
    StateVariableError,
)
from blobstate.processor.runner import RunStats, run_partition

__all__ = [
    "ExpiredTimerInfo",
    "ImplicitKeyError",
    "InvalidHandleStateError",
    "InvalidTimeModeError",
    "ListState",
    "MapState",
    "OutputSchemaError",
    "RunStats",
    "StateVariableError",
    "StatefulProcessor",
    "StatefulProcessorError",
    "StatefulProcessorHandle",
    "TimerValues",
    "ValueState",
    "run_partition",
]
