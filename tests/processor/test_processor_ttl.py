"""TTL: values are invisible from batch time >= expiry and are swept from the store at batch end."""

from __future__ import annotations

from typing import Any

import pandas as pd
from processor_helpers import run_with_stats, table

from blobstate.encoding import layout
from blobstate.processor import StatefulProcessor

OUTPUT = "key STRING, what STRING"


class TtlProbe(StatefulProcessor):
    """Rows (key, op): 'write' writes every state kind, 'append' appends to the list, 'read' reports."""

    def __init__(self, ttl_ms: int = 500) -> None:
        self.ttl_ms = ttl_ms

    def init(self, handle):
        self.value = handle.getValueState("v", "n BIGINT", self.ttl_ms)
        self.items = handle.getListState("l", "n BIGINT", self.ttl_ms)
        self.map = handle.getMapState("m", "name STRING", "n BIGINT", self.ttl_ms)

    def handleInputRows(self, key, rows, timerValues):
        out = []
        for pdf in rows:
            for op, n in zip(pdf["op"], pdf["n"], strict=True):
                if op == "write":
                    self.value.update((n,))
                    self.items.put([(n,)])
                    self.map.updateValue((f"k{n}",), (n,))
                elif op == "append":
                    self.items.appendValue((n,))
                    self.map.updateValue((f"k{n}",), (n,))
                else:
                    state = (
                        self.value.get(),
                        self.value.exists(),
                        list(self.items.get()),
                        self.items.exists(),
                        sorted(self.map.iterator()),
                        self.map.exists(),
                    )
                    out.append((key[0], repr(state)))
        yield pd.DataFrame(out, columns=["key", "what"])


def batch(store: Any, ts: int, *ops: tuple[str, int], processor: Any = None) -> Any:
    data = table(key=["a"] * len(ops), op=[o for o, _ in ops], n=[n for _, n in ops])
    return run_with_stats(
        processor or TtlProbe(),
        store,
        data,
        output_schema=OUTPUT,
        time_mode="ProcessingTime",
        batch_timestamp_ms=ts,
    )


def read(store: Any, ts: int) -> tuple:
    rows, _ = batch(store, ts, ("read", 0))
    return eval(rows[0]["what"])


def test_values_expire_when_batch_time_reaches_write_time_plus_ttl(store: Any) -> None:
    batch(store, 1_000, ("write", 7))
    assert read(store, 1_499) == ((7,), True, [(7,)], True, [(("k7",), (7,))], True)
    assert read(store, 1_500) == (None, False, [], False, [], False)


def test_expired_values_are_removed_from_the_store_at_batch_end(store: Any) -> None:
    batch(store, 1_000, ("write", 7))
    assert store.get("v", _key("a")) is not None
    _, stats = batch(store, 2_000, ("read", 0))
    # one value, one list element, one map entry
    assert stats.ttl_values_removed == 3
    assert store.get("v", _key("a")) is None
    assert list(store.items("l")) == []
    assert list(store.items("m")) == []
    assert list(store.items(layout.ttl_cf("v"))) == []


def test_update_restarts_the_ttl(store: Any) -> None:
    batch(store, 1_000, ("write", 1))
    batch(store, 1_400, ("write", 2))
    # k1 was written at 1_000 and expired at 1_500; everything written at 1_400 lives until 1_900
    assert read(store, 1_600) == ((2,), True, [(2,)], True, [(("k2",), (2,))], True)
    assert read(store, 1_900) == (None, False, [], False, [], False)


def test_list_elements_and_map_entries_expire_individually(store: Any) -> None:
    batch(store, 1_000, ("write", 1))
    batch(store, 1_300, ("append", 2))
    state = read(store, 1_600)
    assert state[2] == [(2,)]
    assert state[4] == [(("k2",), (2,))]
    assert state[3] and state[5]
    _, stats = batch(store, 1_600, ("read", 0))
    assert stats.ttl_values_removed == 0  # swept in the previous batch at 1_600 already
    assert [k for k, _ in store.items("m")] == [_key("a") + _key("k2")]


def test_sweep_happens_even_for_keys_without_input(store: Any) -> None:
    batch(store, 1_000, ("write", 1))
    data = table(key=["other"], op=["read"], n=[0])
    _, stats = run_with_stats(
        TtlProbe(), store, data, output_schema=OUTPUT, time_mode="ProcessingTime", batch_timestamp_ms=5_000
    )
    assert stats.ttl_values_removed == 3
    assert store.get("v", _key("a")) is None


def test_ttl_state_survives_while_fresh_and_index_is_pruned(store: Any) -> None:
    for ts in range(1_000, 1_400, 100):
        batch(store, ts, ("write", ts))
    # the index holds one entry per write time; entries at or before the sweep time are dropped
    _, stats = batch(store, 1_400, ("read", 0))
    assert stats.ttl_values_removed == 0
    assert read(store, 1_799)[0] == (1_300,)
    index = [k for k, _ in store.items(layout.ttl_cf("v"))]
    assert index and all(len(k) > 8 for k in index)
    assert read(store, 1_800)[0] is None


def _key(name: str) -> bytes:
    from blobstate.encoding import codec

    return codec.encode_key((name,))


def test_rows_without_ttl_processor_are_unaffected(store: Any) -> None:
    class NoTtl(TtlProbe):
        def init(self, handle):
            self.value = handle.getValueState("v", "n BIGINT")
            self.items = handle.getListState("l", "n BIGINT")
            self.map = handle.getMapState("m", "name STRING", "n BIGINT")

    batch(store, 1_000, ("write", 3), processor=NoTtl())
    rows, _ = batch(store, 10**12, ("read", 0), processor=NoTtl())
    assert eval(rows[0]["what"]) == ((3,), True, [(3,)], True, [(("k3",), (3,))], True)
