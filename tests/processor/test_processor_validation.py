"""What Spark's transformWithStateInPandas rejects is rejected here too, with errors naming the culprit."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from processor_helpers import run, table
from pyspark.errors import PySparkRuntimeError

from blobstate.processor import (
    ImplicitKeyError,
    InvalidHandleStateError,
    InvalidTimeModeError,
    StatefulProcessor,
    StatefulProcessorError,
    StateVariableError,
)
from blobstate.processor.schema import SchemaParseError

OUTPUT = "key STRING"
DATA = table(key=["a"], value=[1])


class Declares(StatefulProcessor):
    """Runs ``declare(handle)`` in init and ``use(self)`` for every key."""

    def __init__(self, declare: Any = None, use: Any = None, on_close: Any = None) -> None:
        self.declare = declare
        self.use = use
        self.on_close = on_close

    def init(self, handle):
        self.handle = handle
        if self.declare:
            self.declare(self, handle)

    def handleInputRows(self, key, rows, timerValues):
        if self.use:
            self.use(self)
        return iter([])

    def close(self):
        if self.on_close:
            self.on_close(self)


def go(store: Any, processor: Any, time_mode: str = "None", **kw: Any) -> list:
    return run(processor, store, DATA, output_schema=OUTPUT, time_mode=time_mode, batch_timestamp_ms=0, **kw)


def test_errors_are_pyspark_runtime_errors() -> None:
    assert issubclass(StatefulProcessorError, PySparkRuntimeError)
    assert issubclass(StatefulProcessorError, RuntimeError)


def test_state_variables_only_in_init(store: Any) -> None:
    with pytest.raises(InvalidHandleStateError, match="getValueState in handle state INITIALIZED"):
        go(store, Declares(use=lambda p: p.handle.getValueState("late", "n INT")))
    with pytest.raises(InvalidHandleStateError, match="deleteIfExists in handle state"):
        go(store, Declares(use=lambda p: p.handle.deleteIfExists("x")))


@pytest.mark.parametrize("mode", ["None", "EventTime"])
def test_ttl_needs_processing_time(store: Any, mode: str) -> None:
    declare = lambda p, h: h.getValueState("v", "n INT", 1000)  # noqa: E731
    with pytest.raises(InvalidTimeModeError, match=f"'v' with time mode {mode}"):
        go(store, Declares(declare), time_mode=mode, watermark_ms=0)


@pytest.mark.parametrize("ttl", [0, -5, 1.5, "10"])
def test_ttl_must_be_a_positive_int(store: Any, ttl: Any) -> None:
    with pytest.raises(StateVariableError, match="ttlDurationMs of state variable 'v'"):
        go(store, Declares(lambda p, h: h.getListState("v", "n INT", ttl)), time_mode="ProcessingTime")


def test_duplicate_and_reserved_names(store: Any) -> None:
    def twice(p, h):
        h.getValueState("v", "n INT")
        h.getMapState("v", "k INT", "n INT")

    with pytest.raises(StateVariableError, match="'v' is already defined"):
        go(store, Declares(twice))
    for name in ["_private", "$ttl:x", "", " padded", "default"]:
        with pytest.raises(StateVariableError, match="Invalid state variable name"):
            go(store, Declares(lambda p, h, n=name: h.getValueState(n, "n INT")))


def test_state_only_inside_a_grouping_key(store: Any) -> None:
    def read_in_init(p, h):
        h.getValueState("v", "n INT").get()

    with pytest.raises(ImplicitKeyError, match=r"'v'.*no grouping key"):
        go(store, Declares(read_in_init))

    def declare(p, h):
        p.v = h.getValueState("v", "n INT")

    with pytest.raises(ImplicitKeyError, match="update state variable 'v'"):
        go(store, Declares(declare, on_close=lambda p: p.v.update((1,))))


def test_bad_values_name_the_state_variable(store: Any) -> None:
    def declare(p, h):
        p.v = h.getValueState("v", "n INT, s STRING")
        p.l = h.getListState("l", "n INT")
        p.m = h.getMapState("m", "k STRING", "n INT")

    cases = [
        (lambda p: p.v.update(None), "null value to state variable 'v'"),
        (lambda p: p.v.update(5), "must be a tuple"),
        (lambda p: p.v.update((1,)), r"has 1 field\(s\) but the schema struct<n:int,s:string> has 2"),
        (lambda p: p.l.put([]), "empty list to state variable 'l'"),
        (lambda p: p.l.appendList([]), "empty list to state variable 'l'"),
        (lambda p: p.l.put([(1,), None]), "null list element to state variable 'l'"),
        (lambda p: p.l.put(None), "null list to state variable 'l'"),
        (lambda p: p.l.appendValue(None), "null list element"),
        (lambda p: p.m.updateValue(None, (1,)), "null user key to state variable 'm'"),
        (lambda p: p.m.getValue("k"), "user key for state variable 'm' must be a tuple"),
        (lambda p: p.m.updateValue(("k",), (1, 2)), "state variable 'm' has 2 field"),
    ]
    for use, message in cases:
        with pytest.raises(StateVariableError, match=message):
            go(store, Declares(declare, use))


def test_values_as_lists_and_dicts_are_accepted(store: Any) -> None:
    seen = []

    def declare(p, h):
        p.v = h.getValueState("v", "n INT, s STRING")

    def use(p):
        p.v.update([1, "x"])
        seen.append(p.v.get())
        p.v.update({"s": "y", "n": 2})
        seen.append(p.v.get())

    go(store, Declares(declare, use))
    assert seen == [(1, "x"), (2, "y")]


def test_changing_a_variable_kind_between_restarts_is_rejected(store: Any) -> None:
    go(store, Declares(lambda p, h: h.getValueState("v", "n INT")))
    with pytest.raises(StateVariableError, match="from value state to list state"):
        go(store, Declares(lambda p, h: h.getListState("v", "n INT")))


def test_delete_if_exists_allows_redeclaring_with_another_kind(store: Any) -> None:
    def write(p):
        p.v.update((1,))

    def declare_value(p, h):
        p.v = h.getValueState("v", "n INT")

    go(store, Declares(declare_value, write))

    def delete_then_list(p, h):
        h.deleteIfExists("v")
        p.l = h.getListState("v", "n INT")

    seen = []
    go(store, Declares(delete_then_list, lambda p: seen.append(list(p.l.get()))))
    assert seen == [[]]
    assert list(store.items("v")) == []


def test_delete_if_exists_of_unknown_state_writes_nothing(store: Any) -> None:
    go(store, Declares())
    store.take_changelog()
    go(store, Declares(lambda p, h: h.deleteIfExists("never")))
    assert list(store.take_changelog()) == []


def test_time_and_output_mode_are_checked(store: Any) -> None:
    with pytest.raises(InvalidTimeModeError, match="Unsupported time mode 'Wallclock'"):
        go(store, Declares(), time_mode="Wallclock")
    with pytest.raises(StatefulProcessorError, match="Complete output mode is not supported"):
        go(store, Declares(), output_mode="Complete")
    with pytest.raises(StatefulProcessorError, match="Invalid output mode 'sometimes'"):
        go(store, Declares(), output_mode="sometimes")
    with pytest.raises(InvalidTimeModeError, match="ProcessingTime needs batch_timestamp_ms"):
        run(Declares(), store, DATA, output_schema=OUTPUT, time_mode="processingtime")
    with pytest.raises(InvalidTimeModeError, match="EventTime needs watermark_ms"):
        run(Declares(), store, DATA, output_schema=OUTPUT, time_mode="EventTime")


def test_time_mode_cannot_change_between_restarts(store: Any) -> None:
    go(store, Declares(), time_mode="ProcessingTime")
    go(store, Declares(), time_mode="processingTIME")  # case-insensitive, same mode
    with pytest.raises(
        StatefulProcessorError, match="time mode of this state changed from ProcessingTime to None"
    ):
        go(store, Declares(), time_mode="None")


def test_schemas_as_ddl_or_struct_type_and_bad_ddl(store: Any) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    def declare(p, h):
        p.a = h.getValueState("a", StructType([StructField("n", LongType())]))
        p.b = h.getValueState("b", "struct<n: bigint, tags: array<string>, m: map<string, double>>")

    go(store, Declares(declare, lambda p: p.b.update((1, ["x"], {"k": 1.0}))))
    with pytest.raises(SchemaParseError, match=r"schema of state variable 'c'.*unknown type 'bigwhat'"):
        go(store, Declares(lambda p, h: h.getValueState("c", "n bigwhat")))


def test_key_columns_and_processor_are_checked(store: Any) -> None:
    with pytest.raises(
        ValueError, match=r"key column\(s\) \['nope'\] not in the input columns \['key', 'value'\]"
    ):
        run(Declares(), store, DATA, key_columns=["nope"], output_schema=OUTPUT)
    with pytest.raises(TypeError, match="processor must be a StatefulProcessor"):
        run(object(), store, DATA, output_schema=OUTPUT)


def test_user_errors_propagate_with_the_key_noted(store: Any) -> None:
    def boom(p):
        raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError, match="user bug") as info:
        go(store, Declares(use=boom))
    assert "in handleInputRows for grouping key ('a',)" in "".join(info.value.__notes__)


def test_processor_factories_are_accepted(store: Any) -> None:
    class Emit(StatefulProcessor):
        def init(self, handle):
            pass

        def handleInputRows(self, key, rows, timerValues):
            yield pd.DataFrame({"key": [key[0]]})

    assert go(store, Emit) == [{"key": "a"}]
    assert go(store, lambda: Emit()) == [{"key": "a"}]
