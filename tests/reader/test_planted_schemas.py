"""Schemas planted in a checkpoint by someone with write access to its store: a user-defined type naming a
module, a pickled object, an over-deep or over-long schema, and damaged declarations, in every stored
place a schema is read from (a state variable's declaration in ``$meta``, committed like any state, and
``key_schema`` in ``metadata.json`` with its digest recomputed). Every reader (``inspect``, ``lineage``,
``verify``, ``report``, reader planning and ``read_state``, a query restart) runs on them: none imports
the module, and those that read the schema refuse with one line naming the object."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from checkpoints import build_checkpoint
from reader_jobs import OUTPUT, EveryState, batches

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.encoding import layout
from blobstate.engine.config import QueryConfig
from blobstate.engine.query import _ensure_metadata
from blobstate.ids import CheckpointId
from blobstate.layout import delta_name
from blobstate.lineage.commitlog import Commit, CommitLog, content_digest
from blobstate.processor import RunSpec, run_partition
from blobstate.reader import read_state
from blobstate.reader.plan import plan_read
from blobstate.reader.rows import partition_rows
from blobstate.state.partition import open_partition
from blobstate.state.retention import after_commit, retained_from
from blobstate.stored_schema import MAX_FIELDS, MAX_NAME_LENGTH, StoredSchemaError

PROBE = "blobstate_planted_probe"
PARTITION = 1


def field_list(*fields: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]


def struct(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": field_list(*fields)}


UDT = {"type": "udt", "class": "x.Probe", "pyClass": f"{PROBE}.Probe", "sqlType": "long"}
PICKLED = f"c{PROBE}\nProbe\n(tR."
"""A pickle (protocol 0) whose loading imports the probe module and calls its class."""


def deep(levels: int) -> dict[str, Any]:
    inner: Any = "long"
    for _ in range(levels):
        inner = {"type": "array", "elementType": inner, "containsNull": True}
    return struct(("count", inner))


WIDE = struct(*[(f"f{i}", "long") for i in range(MAX_FIELDS + 1)])
LONG_NAME = struct(("n" * (MAX_NAME_LENGTH * 40), "long"))


def value_decl(schema: Any) -> bytes:
    return json.dumps({"kind": "value", "schema": schema, "ttl": False}).encode()


PLANTED_META: dict[str, tuple[str, bytes, str]] = {
    # name: (state variable, $meta value, what the error says)
    "udt": ("totals", value_decl(struct(("count", UDT), ("total", "long"))), f"'{PROBE}.Probe'"),
    "udt-user-key": (
        "buckets",
        json.dumps(
            {
                "kind": "map",
                "schema": struct(("n", "long")),
                "userKeySchema": struct(("b", UDT)),
                "ttl": False,
            }
        ).encode(),
        "invalid user key schema of state variable 'buckets'",
    ),
    "pickled": ("totals", PICKLED.encode(), "not JSON"),
    "deep": ("totals", value_decl(deep(400)), "nests deeper than 16 levels"),
    "wide": ("totals", value_decl(WIDE), f"more than {MAX_FIELDS} fields"),
    "long-name": ("totals", value_decl(LONG_NAME), f"(at most {MAX_NAME_LENGTH})"),
    # damaged declarations
    "not-json": ("totals", b'{"kind": "value", "schema": ', "not JSON (JSONDecodeError"),
    "no-schema": ("totals", json.dumps({"kind": "value", "ttl": False}).encode(), "field 'schema': missing"),
    "schema-a-string": ("totals", value_decl("struct<count:bigint>"), "expected a struct"),
    "fields-a-string": ("totals", value_decl({"type": "struct", "fields": "count"}), "fields are 'count'"),
    "field-type-7": ("totals", value_decl(struct(("count", 7))), "field 'count': the type is 7"),
}

PLANTED_KEY_SCHEMA: dict[str, tuple[Any, str]] = {
    "udt": (struct(("key", UDT)), f"'{PROBE}.Probe'"),
    "pickled": (PICKLED, "expected a struct"),
    "deep": ({"type": "struct", "fields": field_list(("key", deep(400)))}, "nests deeper than 16 levels"),
    "wide": (WIDE, f"more than {MAX_FIELDS} fields"),
    "long-name": (LONG_NAME, f"(at most {MAX_NAME_LENGTH})"),
    "field-type-7": (struct(("key", 7)), "field 'key': the type is 7"),
}


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module on sys.path that leaves a marker file when imported; returns the marker's path."""
    marker = tmp_path / "probe-imported"
    (tmp_path / f"{PROBE}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from pyspark.sql.types import LongType, UserDefinedType\n\n"
        "class Probe(UserDefinedType):\n"
        "    @classmethod\n    def sqlType(cls):\n        return LongType()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PROBE, raising=False)
    return marker


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("planted")
    build_checkpoint(str(root / "ckpt"), batches(4, seed=3), root / "local", num_partitions=2, retain=3)
    return root / "ckpt"


@pytest.fixture
def url(built: Path, tmp_path: Path) -> str:
    """A fresh copy of the built checkpoint (versions 1..4)."""
    shutil.copytree(built, tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


def commit_next(url: str, local: Path, change: Callable[[int, Any], None]) -> int:
    """Commit the next version through the real partition commit, ``change(partition, store)`` applied
    to each partition's store: what anyone who can write the store can do. Returns the version."""
    with open_blob_store(url) as store:
        log = CommitLog(store)
        metadata, previous = log.read_metadata(), log.latest_commit()
        assert previous is not None
        version = previous.version + 1
        results = {}
        for p in range(metadata.num_partitions):
            with open_partition(
                store, local, metadata.query_id, "0", p, previous.checkpoint_id("0", p), lock_timeout=5.0
            ) as state:
                change(p, state.store)
                results[p] = state.commit()
        commit = Commit(
            version=version,
            checkpoints={"0": {p: r.checkpoint_id.uid for p, r in results.items()}},
            objects={"0": {p: r.objects for p, r in results.items()}},
            retained_from=retained_from(previous, version, 3),
            writer=f"planter-{uuid.uuid4().hex[:8]}",
        )
        log.write_commit(commit)
        after_commit(store, commit, commit_log=log)
    return version


def plant_meta(url: str, local: Path, variable: str, data: bytes) -> int:
    """Put ``data`` as ``variable``'s declaration in partition PARTITION's ``$meta``; the new version."""

    def change(p: int, store: Any) -> None:
        if p == PARTITION:
            store.put(layout.META_CF, layout.meta_key(variable), data)

    return commit_next(url, local, change)


def plant_key_schema(url: str, value: Any) -> None:
    """Rewrite ``metadata.json`` with ``value`` as the operator's key_schema, its digest recomputed."""
    path = Path(url) / "metadata.json"
    obj = json.loads(path.read_text())
    obj["operators"]["0"]["key_schema"] = value
    obj["sha256"] = content_digest(obj)
    path.write_text(json.dumps(obj, indent=1))


def run_cli(args: list[str], capsys: Any) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str) -> str:
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err[:2000]
    return err


def restart_partition(url: str, local: Path, partition: int) -> None:
    """What a restarted query's task does with the partition: open it at the latest commit and run the
    processor's init (which reads the stored declarations) over a batch."""
    with open_blob_store(url) as store:
        log = CommitLog(store)
        metadata, latest = log.read_metadata(), log.latest_commit()
        assert latest is not None
        with open_partition(
            store,
            local,
            metadata.query_id,
            "0",
            partition,
            latest.checkpoint_id("0", partition),
            lock_timeout=5.0,
        ) as state:
            table = pa.table(
                {"key": ["u1"], "value": [1]}, schema=pa.schema([("key", pa.string()), ("value", pa.int64())])
            )
            run = RunSpec(
                key_columns=("key",),
                output_schema=OUTPUT,
                time_mode="ProcessingTime",
                batch_timestamp_ms=1_800_000_000_000,
            )
            for _ in run_partition(EveryState(), state.store, table, run):
                pass


def lineage_runs(url: str, capsys: Any) -> None:
    """lineage reads commits and objects, never a schema: it runs as usual."""
    code, _, err = run_cli(["lineage", url], capsys)
    assert code == 0, err


def verify_problems(url: str, capsys: Any) -> list[str]:
    """The problems ``verify`` reports (it exits 1 when there are any)."""
    code, _, err = run_cli(["verify", url], capsys)
    problems = [line for line in err.splitlines() if line.startswith("problem: ")]
    assert code == (1 if problems else 0), err
    return problems


@pytest.mark.parametrize("case", sorted(PLANTED_META))
def test_a_planted_declaration_is_never_imported_and_every_reader_names_it(
    case: str, url: str, tmp_path: Path, probe: Path, capsys: Any
) -> None:
    variable, data, problem = PLANTED_META[case]
    version = plant_meta(url, tmp_path / "local", variable, data)
    with open_blob_store(url) as store:
        uid = CommitLog(store).read_commit(version).checkpoints["0"][PARTITION]
    where = f"state variable {variable!r} in $meta of operator 0 partition {PARTITION} at version {version} (uid {uid}) of {url}"  # noqa: E501

    code, _, err = run_cli(["inspect", url, "--partition", str(PARTITION)], capsys)
    assert code == 1 and where in one_line_error(err) and problem in err
    code, _, _ = run_cli(["inspect", url, "--partition", str(1 - PARTITION)], capsys)
    assert code == 0  # the other partition holds no planted declaration

    with pytest.raises(StoredSchemaError) as planning:
        plan_read(url, state_var="visits", partition=PARTITION)
    with pytest.raises(StoredSchemaError) as reading:  # planned on the driver, before Spark is asked
        read_state(None, url, state_var="visits", partition=PARTITION)
    schema = plan_read(url, state_var="visits", partition=0).schema
    with pytest.raises(StoredSchemaError) as executor:  # an executor reading the partition
        list(partition_rows(url, version, "0", PARTITION, "visits", schema))
    for error in (planning.value, reading.value, executor.value):
        assert where in str(error) and problem in str(error) and "\n" not in str(error)

    lineage_runs(url, capsys)
    (problem_line,) = verify_problems(url, capsys)  # the version's delta writes the declaration
    delta = delta_name("0", PARTITION, CheckpointId(version, uid))
    assert problem_line.startswith(f"problem: {delta}: invalid ")
    assert f"state variable {variable!r} written to $meta" in problem_line and problem in problem_line
    assert f"(operator 0 partition {PARTITION}, version {version} uid {uid})" in problem_line
    with pytest.raises(StoredSchemaError) as restart:
        restart_partition(url, tmp_path / "restart", PARTITION)
    assert f"state variable {variable!r} in $meta" in str(restart.value) and problem in str(restart.value)
    assert not probe.exists() and PROBE not in sys.modules


@pytest.mark.parametrize("case", sorted(PLANTED_KEY_SCHEMA))
def test_a_planted_key_schema_is_never_imported_and_every_reader_names_it(
    case: str, url: str, tmp_path: Path, probe: Path, capsys: Any
) -> None:
    value, problem = PLANTED_KEY_SCHEMA[case]
    plant_key_schema(url, value)
    where = f"invalid key_schema of operator 0 in metadata.json of {url}"

    with pytest.raises(StoredSchemaError) as planning:
        plan_read(url, state_var="visits")
    with pytest.raises(StoredSchemaError) as reading:
        read_state(None, url, timers=True)
    for error in (planning.value, reading.value):
        assert str(error).startswith(where) and problem in str(error) and "\n" not in str(error)

    code, _, err = run_cli(["inspect", url, "--partition", "0"], capsys)
    assert code == 0, err  # inspect types keys by their stored values: it never reads key_schema
    lineage_runs(url, capsys)
    (problem_line,) = verify_problems(url, capsys)
    assert problem_line.startswith(f"problem: metadata.json: {where}") and problem in problem_line
    with open_blob_store(url) as store, pytest.raises(StoredSchemaError) as restart:
        _ensure_metadata(
            store, 2, QueryConfig(), ("key",), (), {"type": "struct", "fields": field_list(("key", "string"))}
        )
    assert str(restart.value).startswith(where) and problem in str(restart.value)
    assert not probe.exists() and PROBE not in sys.modules


def test_report_reads_no_schema_of_a_checkpoint_planted_everywhere(
    url: str, tmp_path: Path, probe: Path, capsys: Any
) -> None:
    plant_meta(url, tmp_path / "local", "totals", PLANTED_META["udt"][1])
    plant_meta(url, tmp_path / "local", "buckets", PLANTED_META["udt-user-key"][1])
    plant_meta(url, tmp_path / "local", "recent", PLANTED_META["pickled"][1])
    plant_key_schema(url, PLANTED_KEY_SCHEMA["udt"][0])
    code, out, err = run_cli(["report", url, "--out", str(tmp_path / "report")], capsys)
    assert code == 0 and "wrote" in out, err
    assert not probe.exists() and PROBE not in sys.modules


def test_a_key_schema_of_other_columns_than_the_key_is_refused(url: str) -> None:
    plant_key_schema(url, struct(("other", "string")))
    with pytest.raises(StoredSchemaError, match=r"its fields \['other'\] are not the key columns \['key'\]"):
        plan_read(url, state_var="visits")


def test_an_intact_key_schema_still_types_the_key(url: str, capsys: Any) -> None:
    plant_key_schema(url, struct(("key", "string")))
    assert verify_problems(url, capsys) == []
    plan = plan_read(url, state_var="visits")
    assert plan.schema["key"].dataType.simpleString() == "struct<key:string>"
    with open_blob_store(url) as store:
        _ensure_metadata(store, 2, QueryConfig(), ("key",), (), struct(("key", "string")))


def test_metadata_nested_beyond_what_json_can_read_is_one_line_from_every_reader(
    url: str, tmp_path: Path, capsys: Any
) -> None:
    path = Path(url) / "metadata.json"
    text = path.read_text()
    levels = 100_000
    path.write_text(
        text.replace('"key_columns"', '"key_schema": ' + "[" * levels + "]" * levels + ', "key_columns"', 1)
    )
    for args in (
        ["inspect", url, "--partition", "0"],
        ["lineage", url],
        ["report", url, "--out", str(tmp_path / "r")],
    ):
        code, _, err = run_cli(args, capsys)
        assert code == 1 and "metadata.json" in one_line_error(err) and "nested too deeply" in err
    code, _, err = run_cli(["verify", url], capsys)
    assert code == 1 and "nested too deeply" in err and "Traceback" not in err
    with pytest.raises(Exception, match=r"metadata\.json.*nested too deeply"):
        plan_read(url, state_var="visits")
