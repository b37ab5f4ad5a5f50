"""State values through the processor API and a real store: nothing stored is ever unpickled.

A checkpoint location is untrusted input: whoever can write one delta decides the bytes a state read
gets. These tests put such bytes into the store (as a loaded delta would) and check that every read
path refuses them with an error naming the state variable and the key, without running anything.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from processor_helpers import run, table

from blobstate.encoding import codec
from blobstate.encoding.values import ValueFormatError
from blobstate.processor import StatefulProcessor, StateVariableError

OUTPUT = "key STRING"
DATA = table(key=["a"], value=[1])
KB = codec.encode_key(("a",))
UKB = codec.encode_key(("u",))


class _CreatesFile:
    """Unpickling this opens (creates) ``path``: the stand-in for arbitrary code in a forged delta."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def forged(path: Path, expiry: bool = False) -> bytes:
    """A value in the old pickled encoding whose unpickling would create ``path``."""
    body = pickle.dumps((_CreatesFile(path),), 5)
    return (b"\x01" + (2**63 + 10**15).to_bytes(8, "big") if expiry else b"\x00") + body


class Uses(StatefulProcessor):
    """Declares v (value), l (list), m (map) and runs ``use(self)`` for every key."""

    def __init__(self, use: Any = None, ttl_ms: int | None = None) -> None:
        self.use = use
        self.ttl_ms = ttl_ms

    def init(self, handle):
        self.v = handle.getValueState("v", "n BIGINT, s STRING", self.ttl_ms)
        self.l = handle.getListState("l", "n BIGINT", self.ttl_ms)
        self.m = handle.getMapState("m", "k STRING", "n BIGINT", self.ttl_ms)

    def handleInputRows(self, key, rows, timerValues):
        if self.use:
            self.use(self)
        return iter([])


def go(store: Any, processor: Any, ts: int = 0) -> list:
    return run(
        processor, store, DATA, output_schema=OUTPUT, time_mode="ProcessingTime", batch_timestamp_ms=ts
    )


def write_all(p: Uses) -> None:
    p.v.update((1, "x"))
    p.l.put([(1,), (2,)])
    p.m.updateValue(("u",), (3,))


READS = {
    "ValueState.get": lambda p: p.v.get(),
    "ValueState.exists": lambda p: p.v.exists(),
    "ListState.get": lambda p: list(p.l.get()),
    "MapState.getValue": lambda p: p.m.getValue(("u",)),
    "MapState.containsKey": lambda p: p.m.containsKey(("u",)),
    "MapState.iterator": lambda p: list(p.m.iterator()),
    "MapState.values": lambda p: list(p.m.values()),
    "MapState.exists": lambda p: p.m.exists(),
}
TARGETS = {
    "ValueState": ("v", KB),
    "ListState": ("l", KB + (0).to_bytes(8, "big")),
    "MapState": ("m", KB + UKB),
}


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("expiry", [False, True])
def test_a_forged_pickle_in_the_store_is_refused_and_never_run(
    store: Any, tmp_path: Path, read: str, expiry: bool
) -> None:
    go(store, Uses(write_all))
    marker = tmp_path / "pwned"
    cf, key = TARGETS[read.split(".")[0]]
    store.put(cf, key, forged(marker, expiry))

    with pytest.raises(ValueFormatError) as info:
        go(store, Uses(READS[read]))
    assert not marker.exists()
    message = str(info.value)
    assert f"state variable '{cf}'" in message and "grouping key ('a',)" in message
    assert "old pickled encoding" in message and "Start a new checkpoint" in message


def test_the_ttl_sweep_refuses_forged_values_too(store: Any, tmp_path: Path) -> None:
    go(store, Uses(write_all, ttl_ms=1000))
    marker = tmp_path / "pwned"
    store.put("v", KB, forged(marker, expiry=True))
    with pytest.raises(ValueFormatError, match=f"state variable 'v' \\(stored key 0x{KB.hex()}\\)"):
        go(store, Uses(ttl_ms=1000), ts=5000)  # the sweep reads the expiry of every due value
    assert not marker.exists()


def test_damaged_values_are_refused_naming_variable_key_and_schema(store: Any) -> None:
    go(store, Uses(write_all))
    store.put("v", KB, store.get("v", KB)[:-1])
    with pytest.raises(ValueFormatError) as info:
        go(store, Uses(READS["ValueState.get"]))
    message = str(info.value)
    assert "state variable 'v' (grouping key ('a',))" in message
    assert "not a value of its schema STRUCT<n: BIGINT, s: STRING>" in message


def test_values_round_trip_through_the_store_as_python_values(store: Any, store_path: Path) -> None:
    seen: list = []

    def write(p: Uses) -> None:
        p.v.update((np.int64(7), np.str_("naïve ☃")))
        p.l.appendList([(np.int32(1),), (2,)])
        p.l.appendValue([3])
        p.m.updateValue((np.str_("u"),), {"n": np.uint8(4)})

    def read(p: Uses) -> None:
        seen.extend([p.v.get(), list(p.l.get()), list(p.m.iterator()), p.m.getValue(("u",))])

    go(store, Uses(write))
    store.close()
    from blobstate.state.store import RocksStateStore

    with RocksStateStore.open(store_path) as reopened:
        go(reopened, Uses(read))
    assert seen == [(7, "naïve ☃"), [(1,), (2,), (3,)], [(("u",), (4,))], (4,)]
    assert type(seen[0][0]) is int and type(seen[0][1]) is str and type(seen[1][0][0]) is int


def test_values_that_do_not_fit_name_the_state_variable_and_field(store: Any) -> None:
    cases = [
        (lambda p: p.v.update(("1", "x")), "value ('1', 'x') to state variable 'v': field 'n' (BIGINT)"),
        (lambda p: p.v.update((2**63, "x")), "field 'n' (BIGINT) 9223372036854775808 is out of range"),
        (lambda p: p.l.put([(1,), (True,)]), "list element (True,) to state variable 'l': field 'n'"),
        (lambda p: p.m.updateValue(("u",), (1.5,)), "value (1.5,) to state variable 'm': field 'n'"),
        (lambda p: p.m.updateValue((1,), (1,)), "user key (1,) to state variable 'm': field 'k' (STRING)"),
    ]
    for use, message in cases:
        with pytest.raises(StateVariableError) as info:
            go(store, Uses(use))
        assert message in str(info.value)


def test_changing_the_stored_layout_of_a_variable_is_refused(store: Any) -> None:
    class Declares(StatefulProcessor):
        def __init__(self, schema: str, write: bool = True) -> None:
            self.schema, self.write = schema, write

        def init(self, handle):
            self.v = handle.getValueState("v", self.schema)

        def handleInputRows(self, key, rows, timerValues):
            if self.write:
                self.v.update((1,))
            return iter([])

    go(store, Declares("n INT"))
    go(store, Declares("n INT NOT NULL COMMENT 'same field'"))  # nullability and comments: same bytes
    with pytest.raises(
        StateVariableError, match="schema of state variable 'v' from struct<n:int> to struct<count:int>"
    ):
        go(store, Declares("count INT", write=False))  # renamed: would read as another field
    with pytest.raises(
        StateVariableError, match="schema of state variable 'v' from struct<n:int> to struct<d:date>"
    ):
        go(store, Declares("d DATE", write=False))  # as wide as INT: would misread without this check
    with pytest.raises(StateVariableError, match="deleteIfExists"):
        go(store, Declares("n BIGINT"))


def test_a_variable_without_values_may_change_its_schema(store: Any) -> None:
    class Declares(StatefulProcessor):
        def __init__(self, schema: str) -> None:
            self.schema = schema

        def init(self, handle):
            self.v = handle.getValueState("v", self.schema)

        def handleInputRows(self, key, rows, timerValues):
            if self.v.get() is None:
                return iter([pd.DataFrame({"key": ["empty"]})])
            return iter([])

    assert go(store, Declares("n INT")) == [{"key": "empty"}]
    assert go(store, Declares("d DATE")) == [{"key": "empty"}]
