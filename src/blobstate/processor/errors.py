"""Errors raised by the processor API and the runner (defined in :mod:`blobstate.encoding.errors`, where
the state byte format that also raises them lives; this module keeps their public import path)."""

from __future__ import annotations

from blobstate.encoding.errors import (
    ImplicitKeyError,
    InvalidHandleStateError,
    InvalidTimeModeError,
    OutputSchemaError,
    StatefulProcessorError,
    StateVariableError,
)

__all__ = [
    "ImplicitKeyError",
    "InvalidHandleStateError",
    "InvalidTimeModeError",
    "OutputSchemaError",
    "StateVariableError",
    "StatefulProcessorError",
]
