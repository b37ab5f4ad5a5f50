"""ValueState, ListState and MapState against a plain-Python model, over batches and store reopens."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processor_helpers import run

from blobstate.processor import StatefulProcessor
from blobstate.state.store import RocksStateStore

OUTPUT = "key STRING, seq BIGINT, result STRING"


class Scripted(StatefulProcessor):
    """Applies the operations given as input rows (key, seq, op, a, b) and reports each result."""

    def init(self, handle):
        self.value = handle.getValueState("v", "n BIGINT")
        self.items = handle.getListState("l", "n BIGINT")
        self.map = handle.getMapState("m", "name STRING", "n BIGINT")

    def apply(self, op: str, a: Any, b: Any) -> Any:
        if op == "v.get":
            return self.value.get()
        if op == "v.set":
            return self.value.update((b,))
        if op == "v.exists":
            return self.value.exists()
        if op == "v.clear":
            return self.value.clear()
        if op == "l.get":
            return list(self.items.get())
        if op == "l.put":
            return self.items.put([(int(x),) for x in a.split(",")])
        if op == "l.append":
            return self.items.appendValue((b,))
        if op == "l.appendList":
            return self.items.appendList([(int(x),) for x in a.split(",")])
        if op == "l.exists":
            return self.items.exists()
        if op == "l.clear":
            return self.items.clear()
        if op == "m.get":
            v = self.map.getValue((a,))
            return None if v is None else tuple(v)
        if op == "m.set":
            return self.map.updateValue((a,), (b,))
        if op == "m.contains":
            return self.map.containsKey((a,))
        if op == "m.remove":
            return self.map.removeKey((a,))
        if op == "m.items":
            return list(self.map.iterator())
        if op == "m.keys":
            return list(self.map.keys())
        if op == "m.values":
            return list(self.map.values())
        if op == "m.exists":
            return self.map.exists()
        if op == "m.clear":
            return self.map.clear()
        raise AssertionError(op)

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        results = []
        for pdf in rows:
            for seq, op, a, b in sorted(zip(pdf["seq"], pdf["op"], pdf["a"], pdf["b"], strict=True)):
                b = None if b is None or b != b else int(b)
                results.append((key[0], int(seq), repr(self.apply(op, a, b))))
        yield pd.DataFrame(results, columns=["key", "seq", "result"])


class Model:
    """What the three state kinds must do, in plain Python."""

    def __init__(self) -> None:
        self.value: dict[str, tuple] = {}
        self.items: dict[str, list[tuple]] = {}
        self.map: dict[str, dict[str, tuple]] = {}

    def apply(self, key: str, op: str, a: Any, b: Any) -> Any:
        m = self.map.setdefault(key, {})
        if op == "v.get":
            return self.value.get(key)
        if op == "v.set":
            self.value[key] = (b,)
            return None
        if op == "v.exists":
            return key in self.value
        if op == "v.clear":
            self.value.pop(key, None)
            return None
        if op == "l.get":
            return list(self.items.get(key, []))
        if op == "l.put":
            self.items[key] = [(int(x),) for x in a.split(",")]
            return None
        if op == "l.append":
            self.items.setdefault(key, []).append((b,))
            return None
        if op == "l.appendList":
            self.items.setdefault(key, []).extend((int(x),) for x in a.split(","))
            return None
        if op == "l.exists":
            return bool(self.items.get(key))
        if op == "l.clear":
            self.items.pop(key, None)
            return None
        if op == "m.get":
            return m.get(a)
        if op == "m.set":
            m[a] = (b,)
            return None
        if op == "m.contains":
            return a in m
        if op == "m.remove":
            m.pop(a, None)
            return None
        if op == "m.items":
            return [((k,), v) for k, v in sorted(m.items())]
        if op == "m.keys":
            return [(k,) for k in sorted(m)]
        if op == "m.values":
            return [m[k] for k in sorted(m)]
        if op == "m.exists":
            return bool(m)
        if op == "m.clear":
            m.clear()
            return None
        raise AssertionError(op)


ints = st.integers(-(2**40), 2**40)
int_list = st.lists(st.integers(-5, 5), min_size=1, max_size=4).map(lambda xs: ",".join(map(str, xs)))
names = st.sampled_from(["", "a", "b", "é", "a,b"])
operation = st.one_of(
    st.tuples(st.sampled_from(["v.get", "v.exists", "v.clear"]), st.none(), st.none()),
    st.tuples(st.just("v.set"), st.none(), ints),
    st.tuples(st.sampled_from(["l.get", "l.exists", "l.clear"]), st.none(), st.none()),
    st.tuples(st.sampled_from(["l.put", "l.appendList"]), int_list, st.none()),
    st.tuples(st.just("l.append"), st.none(), ints),
    st.tuples(st.sampled_from(["m.get", "m.contains", "m.remove"]), names, st.none()),
    st.tuples(st.just("m.set"), names, ints),
    st.tuples(
        st.sampled_from(["m.items", "m.keys", "m.values", "m.exists", "m.clear"]), st.none(), st.none()
    ),
)
batch = st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3"]), operation), min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(batch, st.booleans()), min_size=1, max_size=4))
def test_state_variables_match_the_model(batches: list[tuple[list, bool]]) -> None:
    model = Model()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store"
        store = RocksStateStore.open(path)
        try:
            seq = 0
            for ops, reopen in batches:
                rows = []
                expected = []
                for key, (op, a, b) in ops:
                    rows.append({"key": key, "seq": seq, "op": op, "a": a, "b": b})
                    expected.append({"key": key, "seq": seq, "result": repr(model.apply(key, op, a, b))})
                    seq += 1
                data = pa.Table.from_pylist(
                    rows,
                    schema=pa.schema(
                        [
                            ("key", pa.string()),
                            ("seq", pa.int64()),
                            ("op", pa.string()),
                            ("a", pa.string()),
                            ("b", pa.int64()),
                        ]
                    ),
                )
                got = run(Scripted(), store, data, output_schema=OUTPUT)
                assert sorted(got, key=lambda r: r["seq"]) == expected
                if reopen:
                    store.close()
                    store = RocksStateStore.open(path)
        finally:
            store.close()
