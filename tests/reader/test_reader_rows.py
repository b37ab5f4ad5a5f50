"""The state reader's planning and decoding without Spark, on a checkpoint built by the real partition and
commit code: every retained version's rows equal the reference; the TTL's expiry is the one written;
errors name what exists; reading leaves the checkpoint as it was and no temporary directory behind."""

from __future__ import annotations

import glob
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from checkpoints import T0_MS, build_checkpoint, write_checkpoint
from reader_jobs import OUTPUT, TTL_MS, EveryState, batches

from blobstate.blobstore import open_blob_store
from blobstate.reader import TIMERS, StateReadError
from blobstate.reader.plan import plan_read
from blobstate.reader.rows import partition_rows

BATCHES = 5


def fingerprint(url: str) -> dict[str, str]:
    """Every object under ``url`` with the SHA-256 of its bytes."""
    with open_blob_store(url) as store:
        return {name: hashlib.sha256(store.get(name)).hexdigest() for name in store.list("")}


def read_all(url: str, version: int, state_var: str) -> list[tuple]:
    plan = plan_read(url, version=version, state_var=state_var)
    return [
        row
        for p in plan.partitions
        for row in partition_rows(url, plan.version, plan.operator, p, plan.state_var, plan.schema)
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("reader")
    url = str(root / "ckpt")
    return url, build_checkpoint(url, batches(BATCHES, seed=3), root / "local", num_partitions=2, retain=3)


def test_rows_of_every_retained_version_equal_the_reference(checkpoint: tuple[str, list]) -> None:
    url, expected = checkpoint
    before = fingerprint(url)
    leftovers = set(glob.glob(str(Path(tempfile.gettempdir()) / "blobstate-read-*")))
    for version in (3, 4, 5):
        want = expected[version - 1]
        rows = read_all(url, version, "totals")
        assert {key[0]: value for key, value, _ in rows} == want["totals"] and len(rows) == len(
            want["totals"]
        )
        recent: dict[str, list] = {}
        for key, element, _ in read_all(url, version, "recent"):
            recent.setdefault(key[0], []).append(element)
        assert recent == want["recent"]
        rows = read_all(url, version, "buckets")
        assert {(k[0], uk[0]): v for k, uk, v, _ in rows} == want["buckets"] and len(rows) == len(
            want["buckets"]
        )
        rows = read_all(url, version, "visits")
        assert {key[0]: value for key, value, _, _ in rows} == want["visits"]
        assert sorted((key[0], ts) for key, ts, _ in read_all(url, version, TIMERS)) == want["$timers"]
    assert fingerprint(url) == before
    assert set(glob.glob(str(Path(tempfile.gettempdir()) / "blobstate-read-*"))) == leftovers


def test_ttl_expiry_is_the_one_written(checkpoint: tuple[str, list]) -> None:
    url, _ = checkpoint
    rows = read_all(url, 5, "visits")
    data = batches(BATCHES, seed=3)
    last_seen = {k: i for i, b in enumerate(data) for k, _ in b}
    assert {key[0]: expiry for key, _, expiry, _ in rows} == {
        k: T0_MS + i * 1000 + TTL_MS for k, i in last_seen.items()
    }
    plan = plan_read(url, state_var="visits")
    assert plan.schema.fieldNames() == ["key", "value", "expiration_timestamp_ms", "partition_id"]
    assert plan.schema["key"].dataType.simpleString() == "struct<key:string>"
    assert plan.schema["value"].dataType.simpleString() == "struct<batches:int>"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"state_var": "nope"},
            r"has no state variable 'nope'; its state variables are 'buckets', 'recent', ",
        ),
        ({"state_var": None}, r"choose a state variable .* 'buckets', 'recent', 'totals', 'visits'; timers"),
        ({"version": 2, "state_var": "totals"}, r"version 2 of .* no longer retained \(versions 3\.\.5 are"),
        ({"version": 6, "state_var": "totals"}, r"version 6 of .* is not committed \(the latest is 5"),
        ({"partition": 2, "state_var": "totals"}, r"has no partition 2: it has partitions 0\.\.1"),
        ({"operator": "x", "state_var": "totals"}, r"has no operator 'x'; it has \['0'\]"),
    ],
)
def test_errors_name_what_exists(checkpoint: tuple[str, list], kwargs: dict, message: str) -> None:
    url, _ = checkpoint
    with pytest.raises(StateReadError, match=message):
        plan_read(url, **kwargs)


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(StateReadError, match=r"not a blobstate query checkpoint: it has no metadata\.json"):
        plan_read(str(tmp_path / "empty"), state_var="totals")


def test_a_recorded_key_schema_types_the_key(tmp_path: Path) -> None:
    """A checkpoint whose operator records ``key_schema`` (StructType JSON) gets exactly those key types;
    without one they are read off the stored keys (a string here)."""
    key_schema = {
        "type": "struct",
        "fields": [{"name": "key", "type": "string", "nullable": False, "metadata": {}}],
    }
    url = str(tmp_path / "ckpt")
    write_checkpoint(
        url,
        batches(2, seed=1),
        tmp_path / "local",
        EveryState,
        OUTPUT,
        operator_spec={"key_schema": key_schema},
    )
    assert plan_read(url, state_var="totals").schema["key"].dataType.jsonValue() == key_schema
