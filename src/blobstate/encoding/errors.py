"""Errors raised by the processor API, the runner and the state value encoding (:mod:`.values`).

They derive from PySpark's ``PySparkRuntimeError`` (which is a ``RuntimeError``) because that is
what PySpark's own ``transformWithStateInPandas`` client raises for the same mistakes, so
``except`` clauses written for Spark keep working. Each message names the state variable, the
operation or the column at fault.
"""

from __future__ import annotations

from pyspark.errors import PySparkRuntimeError

from blobstate.errors import ProcessorError


class StatefulProcessorError(ProcessorError, PySparkRuntimeError):
    """Base class: a processor used the API in a way Spark's transformWithStateInPandas rejects."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)


class InvalidHandleStateError(StatefulProcessorError):
    """An operation was called in a phase that does not allow it (e.g. getValueState outside init)."""


class InvalidTimeModeError(StatefulProcessorError):
    """Timers or TTL were used with a time mode that does not support them."""


class StateVariableError(StatefulProcessorError):
    """A state variable name, declaration, value or TTL is invalid."""


class ImplicitKeyError(StatefulProcessorError):
    """State was read or written outside a grouping key (e.g. in init or close)."""


class OutputSchemaError(StatefulProcessorError):
    """The DataFrames a processor yielded do not match the declared output schema."""
