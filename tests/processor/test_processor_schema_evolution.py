"""A state variable's schema changed between restarts: appended nullable fields evolve, the rest is refused.

Each test runs a processor over a real RocksDB store, closes and reopens the store (a restart), and runs
the processor again declaring another schema; what the processor reads is compared with a plain model.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from processor_helpers import run, table

from blobstate.encoding.layout import META_CF
from blobstate.processor import StatefulProcessor, StateVariableError
from blobstate.state.store import RocksStateStore

OUTPUT = "key STRING, seen STRING"
KEYS = ["a", "b", "c"]


class Versioned(StatefulProcessor):
    """Declares v (value), l (list) and m (map) with the given value schema; writes ``row`` to each when
    given, and emits what it read before writing, as text."""

    def __init__(self, schema: str, row: tuple | None = None, ttl_ms: int | None = None) -> None:
        self.schema, self.row, self.ttl_ms = schema, row, ttl_ms

    def init(self, handle: Any) -> None:
        self.v = handle.getValueState("v", self.schema, self.ttl_ms)
        self.l = handle.getListState("l", self.schema, self.ttl_ms)
        self.m = handle.getMapState("m", "k STRING", self.schema, self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        seen = (
            self.v.get(),
            list(self.l.get()),
            {k: v for k, v in self.m.iterator()},
        )
        if self.row is not None:
            self.v.update(self.row)
            self.l.appendValue(self.row)
            self.m.updateValue(("x",), self.row)
        yield pd.DataFrame({"key": [key[0]], "seen": [repr(_plain(seen))]})


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {tuple(k): tuple(v) for k, v in value.items()}
    if isinstance(value, list):
        return [tuple(v) for v in value]
    if isinstance(value, tuple) and value and isinstance(value[0], (tuple, list, dict)):
        return tuple(_plain(v) for v in value)
    return None if value is None else tuple(value)


def _batch(path: Path, processor: Any, ts: int = 1_000) -> dict[str, Any]:
    """One batch in a freshly opened store at ``path`` (a restart), returning what each key read."""
    store = RocksStateStore.open(path)
    try:
        rows = run(
            processor,
            store,
            table(key=KEYS, value=[1] * len(KEYS)),
            output_schema=OUTPUT,
            time_mode="ProcessingTime",
            batch_timestamp_ms=ts,
        )
        store.take_changelog()
    finally:
        store.close()
    return {r["key"]: ast.literal_eval(r["seen"]) for r in rows}


def _expect(v: tuple | None, listed: list[tuple], mapped: dict) -> dict[str, Any]:
    return {k: (v, listed, mapped) for k in KEYS}


@pytest.mark.parametrize("ttl_ms", [None, 3_600_000], ids=["plain", "ttl"])
def test_nullable_fields_appended_at_the_end_are_read_as_null_after_each_evolution(
    tmp_path: Path, ttl_ms: int | None
) -> None:
    path = tmp_path / "store"
    v1 = (1, "one")
    assert _batch(path, Versioned("n BIGINT, s STRING", v1, ttl_ms)) == _expect(None, [], {})
    v2 = (2, "two", 2.5)
    read = _batch(path, Versioned("n BIGINT, s STRING, f DOUBLE", v2, ttl_ms))
    assert read == _expect((1, "one", None), [(1, "one", None)], {("x",): (1, "one", None)})
    read = _batch(path, Versioned("n BIGINT, s STRING, f DOUBLE, t STRING, d DATE", None, ttl_ms))
    assert read == _expect(
        (2, "two", 2.5, None, None),
        [(1, "one", None, None, None), (2, "two", 2.5, None, None)],
        {("x",): (2, "two", 2.5, None, None)},
    )
    # The schema recorded is the new one: the next restart with it rewrites nothing.
    store = RocksStateStore.open(path)
    try:
        assert b'"name": "d"' in bytes(store.get(META_CF, b"var:v"))
    finally:
        store.close()


def test_the_rewrite_is_part_of_the_batchs_changes(tmp_path: Path) -> None:
    """The evolved values go through the store's changelog, so the version the task commits holds them."""
    path = tmp_path / "store"
    _batch(path, Versioned("n BIGINT", (7,)))
    store = RocksStateStore.open(path)
    try:
        run(
            Versioned("n BIGINT, s STRING"),
            store,
            table(key=["a"], value=[1]),
            output_schema=OUTPUT,
            time_mode="ProcessingTime",
            batch_timestamp_ms=1,
        )
        changed = {(cf, bytes(key)) for _, cf, key, _ in store.take_changelog()}
    finally:
        store.close()
    # every key's value, list chunk and map entry was rewritten, not only the key of this batch
    assert sum(1 for cf, _ in changed if cf == "v") == len(KEYS)
    assert sum(1 for cf, _ in changed if cf == "m") == len(KEYS)
    assert sum(1 for cf, _ in changed if cf == "l") >= len(KEYS)


@pytest.mark.parametrize(
    ("new", "why"),
    [
        ("n BIGINT", "a field removed"),
        ("s STRING, n BIGINT, f DOUBLE", "reordered"),
        ("n INT, s STRING, f DOUBLE", "a type changed"),
        ("n BIGINT, s STRING, f DOUBLE NOT NULL", "a new field that is NOT NULL"),
        ("f DOUBLE, n BIGINT, s STRING", "a field added in front"),
        ("m BIGINT, s STRING", "a field renamed"),
    ],
)
def test_other_changes_are_refused_naming_the_variable_and_both_schemas(
    tmp_path: Path, new: str, why: str
) -> None:
    path = tmp_path / "store"
    _batch(path, Versioned("n BIGINT, s STRING", (1, "one")))
    with pytest.raises(StateVariableError) as info:
        _batch(path, Versioned(new))
    message = str(info.value)
    assert "state variable 'v'" in message, why
    assert "struct<n:bigint, s:string>" in message and "new nullable fields" in message, message
    # nothing was rewritten: the old schema still reads the old values
    assert _batch(path, Versioned("n BIGINT, s STRING")) == _expect(
        (1, "one"), [(1, "one")], {("x",): (1, "one")}
    )


def test_two_fields_of_one_type_swapped_are_refused_though_their_bytes_fit(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _batch(path, Versioned("a BIGINT, b BIGINT", (1, 2)))
    with pytest.raises(
        StateVariableError, match="from struct<a:bigint, b:bigint> to struct<b:bigint, a:bigint>"
    ):
        _batch(path, Versioned("b BIGINT, a BIGINT"))
    # nullability and comments do not change what is stored: accepted as before
    assert _batch(path, Versioned("a BIGINT NOT NULL COMMENT 'x', b BIGINT")) == _expect(
        (1, 2), [(1, 2)], {("x",): (1, 2)}
    )


def test_a_changed_map_user_key_schema_is_refused(tmp_path: Path) -> None:
    class KeyedMap(StatefulProcessor):
        def __init__(self, key_schema: str) -> None:
            self.key_schema = key_schema

        def init(self, handle: Any) -> None:
            self.m = handle.getMapState("m", self.key_schema, "n BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            self.m.updateValue(("x",) if "STRING" in self.key_schema else (1,), (1,))
            return iter([])

    path = tmp_path / "store"
    _batch(path, KeyedMap("k STRING"))
    with pytest.raises(StateVariableError, match="user key schema of state variable 'm'"):
        _batch(path, KeyedMap("k BIGINT"))
