"""Issue 33: the report's state size plot counts only the query's own operator state; a side stream's
store (adjunct: the demo's 10,000 profiles) is drawn apart with its own label, never as open state.

Tasks record the partition's keys without its partitioned side stores' (``state_keys``) and those apart
(``adjunct_keys``); commits written before the split count them together and are drawn as such. A
broadcast side store's snapshots (an operator of its own) are no partition's state bytes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from blobstate.blobstore import open_blob_store
from blobstate.engine.task import _estimated_keys
from blobstate.ids import new_uid
from blobstate.lineage.commitlog import Commit, CommitLog, QueryMetadata
from blobstate.lineage.refs import ObjectRef, PartitionObjects
from blobstate.report import render
from blobstate.report.metrics import load_batch_metrics, state_key_series
from blobstate.state.store import RocksStateStore

PROFILES = 10_000
"""Keys of the partitioned side store, as the demo's profiles: far more than the open sessions."""


def _checkpoint() -> Any:
    """Versions 1..3 of 2 partitions with a partitioned side store ``profiles`` and a broadcast one
    ``rates`` (operator ``adjunct-rates``). Version 1 was written before the split (its ``state_keys``
    include the profiles); versions 2 and 3 record ``adjunct_keys`` apart. Snapshots at version 2."""
    store = open_blob_store(f"memory://report-state-keys-{new_uid()}")
    log = CommitLog(store)
    log.write_metadata(
        QueryMetadata.new(
            2,
            {
                "0": {"key_columns": ["user"], "adjuncts": {"profiles": "partitioned", "rates": "broadcast"}},
                "adjunct-rates": {"key_columns": ["currency"], "partitions": 1},
            },
        )
    )
    for v in (1, 2, 3):
        sessions = 10 * v
        partitions: dict[int, dict[str, Any]] = {}
        for p in (0, 1):
            profiles = PROFILES // 2
            if v == 1:
                partitions[p] = {"state_keys": sessions + p + profiles}
            else:
                partitions[p] = {"state_keys": sessions + p, "adjunct_keys": profiles}
        snapshot = ObjectRef.of(b"index") if v == 2 else None
        log.write_commit(
            Commit(
                version=v,
                checkpoints={"0": {p: new_uid() for p in (0, 1)}, "adjunct-rates": {0: new_uid()}},
                writer="w",
                objects={
                    "0": {p: PartitionObjects(ObjectRef.of(b"d" * v), snapshot) for p in (0, 1)},
                    "adjunct-rates": {0: PartitionObjects(ObjectRef.of(b"r"), snapshot)},
                },
                retained_from=1,
                metrics={
                    "seconds": 1.0,
                    "partitions": partitions,
                    "adjuncts": {
                        "profiles": {"mode": "partitioned", "rows": 200},
                        "rates": {"mode": "broadcast", "rows": 3},
                        "$held_rows": {"deferred": 0, "released": 0},
                    },
                },
            )
        )
    return store


@pytest.fixture
def snapshot_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each snapshot index reads as 1,000 bytes of files for the query's partitions, 9,999,000 for the
    broadcast side store's operator (no real index is written)."""

    def read(store: Any, name: str, **_: Any) -> Any:
        return SimpleNamespace(total_size=9_999_000 if name.startswith("adjunct-rates/") else 1_000)

    monkeypatch.setattr("blobstate.snapshot.read_snapshot_index", read)


def test_the_query_s_state_keys_leave_out_the_side_stores(snapshot_bytes: None) -> None:
    _, rows = load_batch_metrics(_checkpoint())
    series = {r.version: state_key_series(r) for r in rows}
    assert series[2] == {"state": 41, "side stores": PROFILES, "together": None}
    assert series[3] == {"state": 61, "side stores": PROFILES, "together": None}
    # before the split: drawn as state and side stores together, never as the query's state
    assert series[1] == {"state": None, "side stores": None, "together": 21 + PROFILES}
    assert rows[1].side_stores == ("profiles", "rates")
    # the broadcast store's snapshot is no partition's state
    assert {p: m.state_bytes for p, m in rows[1].partitions.items()} == {0: 1_000, 1: 1_000}


def test_the_state_size_plot_draws_the_side_stores_apart_and_labels_them(
    snapshot_bytes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    _, rows = load_batch_metrics(_checkpoint())
    drawn: dict[str, list[float]] = {}

    def keep(self: Any, fig: Any, ax: Any) -> bytes:
        for axes in fig.axes:
            for line in axes.get_lines():
                drawn[line.get_label()] = [float(y) for y in line.get_ydata()]
        self.plt.close(fig)
        return b""

    monkeypatch.setattr(render._Figures, "_png", keep)
    plot = next(p for p in render.render_plots(rows) if p.name == "state_size")
    state = drawn["the query's state keys (estimate)"]
    assert state[1:] == [41.0, 61.0] and state[0] != state[0]  # NaN: version 1 did not split them
    assert max(y for y in state if y == y) < PROFILES  # the profiles are not open state
    assert drawn["side store keys, not state (profiles, rates)"][1:] == [PROFILES, PROFILES]
    together = drawn["state and side store keys together (commits that did not split them)"]
    assert together[0] == 21 + PROFILES
    assert "RocksDB files of each snapshot (KiB), side stores' included" in drawn
    assert "drawn apart, never as state" in plot.caption
    table = render._batch_table(rows)  # the table's state keys column is the query's state too
    assert "10,021" not in table and "<td>41</td>" in table and "<td>61</td>" in table


def test_a_task_counts_its_partitioned_side_store_apart(tmp_path: Path) -> None:
    with RocksStateStore.open(tmp_path / "db") as store:
        for i in range(30):
            store.put("sessions", b"user-%04d" % i, b"open")
        for i in range(500):
            store.put("$adjunct:profiles", b"user-%04d" % i, b"gold")
        store.flush()
        state, side = _estimated_keys(store)
    assert (state, side) == (30, 500)
