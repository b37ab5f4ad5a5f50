"""``blobstate inspect`` and ``restore`` on a query checkpoint (one partition at a version), the errors they
give, and the backup-repository commands they still are: on a checkpoint built by the real partition,
commit-log and retention code."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict
from typer.testing import CliRunner

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import app, main
from blobstate.encoding import codec
from blobstate.lineage.commitlog import CommitLog
from blobstate.reader.variables import declarations, entries, timers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reader"))
from checkpoints import build_checkpoint, partition_of
from reader_jobs import batches

runner = CliRunner()


class ReadOnlyRocks:
    """A RocksDB directory opened read-only with rocksdict, with the ``items(cf)`` the decoders use."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.families = Rdict.list_cf(self.path)
        self.db = Rdict(
            self.path,
            options=Options(raw_mode=True),
            column_families={name: Options(raw_mode=True) for name in self.families if name != "default"},
            access_type=AccessType.read_only(),
        )

    def items(self, cf: str, prefix: bytes = b"") -> Any:
        name = "s:" + cf  # RocksStateStore's families are named s:<column family>
        if name not in self.families:
            return iter(())
        return ((k, v) for k, v in self.db.get_column_family(name).items() if k.startswith(prefix))

    def close(self) -> None:
        self.db.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("cli")
    url = str(root / "ckpt")
    return url, build_checkpoint(url, batches(5, seed=9), root / "local", num_partitions=2, retain=3)


def fingerprint(url: str) -> dict[str, str]:
    with open_blob_store(url) as store:
        return {name: hashlib.sha256(store.get(name)).hexdigest() for name in store.list("")}


def mine(state: dict[Any, Any], partition: int) -> dict[Any, Any]:
    """The entries of ``state`` (keyed by key or (key, ...)) whose key is in ``partition``."""
    return {k: v for k, v in state.items() if partition_of(k if isinstance(k, str) else k[0], 2) == partition}


def test_inspect_counts_and_samples_each_state_variable(checkpoint: tuple[str, list]) -> None:
    url, expected = checkpoint
    before = fingerprint(url)
    result = runner.invoke(app, ["inspect", url, "--partition", "1", "--version", "4", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    want = expected[3]
    assert (info["version"], info["batch_id"], info["partition"], info["operator"]) == (4, 3, 1, "0")
    assert info["uid"] == CommitLog(open_blob_store(url)).read_commit(4).checkpoints["0"][1]
    by_name = {v["name"]: v for v in info["state_variables"]}
    assert sorted(by_name) == ["buckets", "recent", "totals", "visits"]
    assert by_name["totals"]["rows"] == by_name["totals"]["keys"] == len(mine(want["totals"], 1))
    assert by_name["recent"]["rows"] == sum(len(v) for v in mine(want["recent"], 1).values())
    assert by_name["buckets"]["rows"] == len(mine(want["buckets"], 1))
    assert by_name["buckets"]["kind"] == "map"
    assert by_name["buckets"]["user_key_schema"] == "struct<bucket:string>"
    assert by_name["visits"]["ttl"] is True and len(by_name["visits"]["sample"][0]) == 3
    key, value = by_name["totals"]["sample"][0]
    assert tuple(value) == want["totals"][key[0]]
    assert info["timers"]["rows"] == len([t for t in want["$timers"] if partition_of(t[0], 2) == 1])

    text = runner.invoke(app, ["inspect", url, "--partition", "0"])
    assert text.exit_code == 0, text.output
    assert "version 5, the state after batch 4 " in text.stdout
    assert "totals: value state struct<count:bigint,total:bigint>" in text.stdout
    assert "buckets: map state struct<bucket:string> -> struct<n:bigint,max:bigint>" in text.stdout
    assert fingerprint(url) == before


def test_restore_materialises_the_partition_at_the_version(
    checkpoint: tuple[str, list], tmp_path: Path
) -> None:
    url, expected = checkpoint
    before = fingerprint(url)
    target = tmp_path / "db"
    result = runner.invoke(app, ["restore", url, str(target), "--partition", "0", "--version", "3", "--json"])
    assert result.exit_code == 0, result.output
    uid = CommitLog(open_blob_store(url)).read_commit(3).checkpoints["0"][0]
    assert json.loads(result.stdout)["uid"] == uid
    assert (target / "CHECKPOINT-ID").read_text() == f"3_{uid}"

    rocks = ReadOnlyRocks(target)
    try:
        declared = declarations(rocks)
        want = expected[2]
        assert {k[0]: v for k, v, _ in entries(rocks, declared["totals"], 1)} == mine(want["totals"], 0)
        assert {(k[0], u[0]): v for k, u, v, _ in entries(rocks, declared["buckets"], 1)} == mine(
            want["buckets"], 0
        )
        assert sorted((k[0], t) for k, t in timers(rocks, 1)) == [
            t for t in want["$timers"] if partition_of(t[0], 2) == 0
        ]
        assert codec.decode_key(next(iter(rocks.items("totals")))[0], 1)[0][0].startswith("u")
    finally:
        rocks.close()
    assert fingerprint(url) == before


def test_restore_refuses_a_non_empty_directory(
    checkpoint: tuple[str, list], tmp_path: Path, capsys: Any
) -> None:
    url, _ = checkpoint
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main(["restore", url, str(tmp_path / "full"), "--partition", "0"])
    assert exit_info.value.code == 1
    assert "is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    ("inside", "relation"),
    [("restored", "lies inside"), ("state/0/restored", "lies inside"), ("", "contains")],
)
def test_restore_refuses_a_target_inside_the_checkpoint(
    checkpoint: tuple[str, list], capsys: Any, inside: str, relation: str
) -> None:
    """Issue 32: a target inside the checkpoint's own directory was taken for a corrupt snapshot, then
    filled from the deltas, writing into the checkpoint. It is refused first, in one line, untouched."""
    url, _ = checkpoint
    before = fingerprint(url)
    target = Path(url) / inside
    with pytest.raises(SystemExit) as exit_info:
        main(["restore", url, str(target), "--partition", "0"])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{relation} the query checkpoint {url}" in err and "nothing was changed" in err, err
    assert "corrupt" not in err
    assert fingerprint(url) == before
    assert inside == "" or not target.exists()


def test_a_load_into_the_checkpoint_is_refused_not_taken_for_a_corrupt_snapshot(
    checkpoint: tuple[str, list], tmp_path: Path
) -> None:
    """Below the command line too: the load's snapshot restore refuses a directory inside the checkpoint
    (it was reported as a corrupt snapshot and loaded around, from the deltas, into the checkpoint)."""
    from blobstate.reader.checkpoint import open_version, restore_into
    from blobstate.snapshot.restore import RestoreTargetError

    url, _ = checkpoint
    before = fingerprint(url)
    target = Path(url) / "loaded"
    try:
        with open_blob_store(url) as store:
            version = open_version(store, None)
            with pytest.raises(RestoreTargetError, match="lies inside the checkpoint"):
                restore_into(store, version, "0", 0, target, tmp_path / "scratch")
    finally:
        shutil.rmtree(target, ignore_errors=True)
    assert fingerprint(url) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "{url}"], "is a query checkpoint: choose a partition with --partition P"),
        (["inspect", "{url}", "--partition", "7"], "has no partition 7: it has partitions 0..1"),
        (["inspect", "{url}", "--partition", "0", "--version", "1"], "version 1 of"),
        (["inspect", "{url}", "--partition", "0", "--version", "9"], "is not committed (the latest is 5"),
        (["inspect", "{url}", "--partition", "0", "--version", "0"], "never existed: versions start at 1"),
        (["restore", "{url}", "{tmp}", "--partition", "0", "--version", "0"], "committed versions are 1..5"),
        (["inspect", "{url}", "--partition", "0", "--snapshot", "x"], "--snapshot applies to backups"),
        (["restore", "{url}", "{tmp}", "--partition", "0", "--delete-extra"], "apply to backups"),
        (["inspect", "{empty}", "--partition", "0"], "is not a query checkpoint (no metadata.json)"),
    ],
)
def test_errors_are_one_line(
    checkpoint: tuple[str, list], tmp_path: Path, capsys: Any, args: list[str], message: str
) -> None:
    url, _ = checkpoint
    (tmp_path / "empty").mkdir()
    values = {"url": url, "tmp": str(tmp_path / "new"), "empty": str(tmp_path / "empty")}
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(**values) for a in args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err


def test_help_shows_flags_as_flags() -> None:
    for command in ("inspect", "restore"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        assert "--partition" in result.stdout and "--version" in result.stdout
        assert "<bool>" not in result.stdout


def test_inspect_and_restore_on_s3(s3_url: str, tmp_path: Path) -> None:
    expected = build_checkpoint(s3_url, batches(2, seed=4), tmp_path / "local", num_partitions=2, retain=3)
    before = fingerprint(s3_url)
    info = json.loads(runner.invoke(app, ["inspect", s3_url, "--partition", "1", "--json"]).stdout)
    totals = next(v for v in info["state_variables"] if v["name"] == "totals")
    assert totals["rows"] == len(mine(expected[1]["totals"], 1))
    result = runner.invoke(
        app, ["restore", s3_url, str(tmp_path / "db"), "--partition", "1", "--version", "1"]
    )
    assert result.exit_code == 0, result.output
    rocks = ReadOnlyRocks(tmp_path / "db")
    try:
        got = {k[0]: v for k, v, _ in entries(rocks, declarations(rocks)["totals"], 1)}
    finally:
        rocks.close()
    assert got == mine(expected[0]["totals"], 1)
    assert fingerprint(s3_url) == before


def test_inspect_says_how_the_partition_was_loaded_in_words(checkpoint: tuple[str, list]) -> None:
    url, _ = checkpoint
    uid = CommitLog(open_blob_store(url)).read_commit(2).checkpoints["0"][0]
    result = runner.invoke(app, ["inspect", url, "--partition", "0", "--version", "3"])
    assert result.exit_code == 0, result.output
    (loaded,) = [line for line in result.stdout.splitlines() if line.startswith("loaded ")]
    assert loaded.startswith(f"loaded snapshot 2_{uid} + 1 delta: ") and " bytes downloaded in " in loaded


def _checkpoint_with_a_partitioned_adjunct(url: str, local: Path) -> list[str]:
    """One partition whose store holds the side rows of a partitioned adjunct ``profiles`` (applied by the
    code the tasks run), two main rows held back by batch 0 (version 1) while the side stream loads, and
    no state variable; returns the users it holds, in key order."""
    import pyarrow as pa

    from blobstate.adjunct.deferred import defer
    from blobstate.adjunct.records import apply_side_rows
    from blobstate.adjunct.spec import AdjunctSpec, column_name
    from blobstate.lineage.commitlog import Commit, QueryMetadata
    from blobstate.state.partition import open_partition
    from blobstate.state.retention import after_commit

    profiles = AdjunctSpec(
        name="profiles",
        mode="partitioned",
        key_in_union=("user",),
        side_key_columns=("user",),
        side_columns=("user", "tier"),
        value_columns=("tier",),
        schema_json='{"type": "struct", "fields": [{"name": "tier", "type": "string", "nullable": true}]}',
        transform=None,
        on_bad_record="fail",
        bootstrap=True,
        persistent=True,
        max_age_seconds=None,
    )
    side = pa.table(
        {
            "user": ["u3", "u1", "u2"],
            column_name("profiles", "user"): ["u3", "u1", "u2"],
            column_name("profiles", "tier"): ["gold", "silver", None],
        }
    )
    with open_blob_store(url) as store:
        log = CommitLog(store)
        operators = {"0": {"key_columns": ["user"], "adjuncts": {"profiles": "partitioned"}}}
        metadata = log.write_metadata(QueryMetadata.new(1, operators))
        with open_partition(store, local, metadata.query_id, "0", 0, None) as state:
            apply_side_rows(state.store, profiles, side)
            defer(state.store, 1, pa.table({"user": ["u1", "u4"], "n": [1, 2]}).to_batches())
            result = state.commit()
        commit = Commit(
            version=1,
            checkpoints={"0": {0: result.checkpoint_id.uid}},
            objects={"0": {0: result.objects}},
            retained_from=1,
            writer="test",
        )
        log.write_commit(commit)
        after_commit(store, commit, commit_log=log)
    return ["u1", "u3"]  # u2's null value deleted it


def test_inspect_lists_a_partitioned_adjunct_store(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    users = _checkpoint_with_a_partitioned_adjunct(url, tmp_path / "local")
    info = json.loads(runner.invoke(app, ["inspect", url, "--partition", "0", "--json"]).stdout)
    assert info["adjunct_stores"] == [
        {"name": "profiles", "mode": "partitioned", "keys": 2, "sample_keys": [[u] for u in users]}
    ]
    text = runner.invoke(app, ["inspect", url, "--partition", "0"])
    assert text.exit_code == 0, text.output
    assert "adjunct store profiles (partitioned, column family $adjunct:profiles): 2 keys" in text.stdout
    assert info["held_main_rows"] == [{"version": 1, "rows": 2}]
    assert (
        "main rows held back until a bootstrap side stream is loaded (column family $adjunct-deferred):"
        " 2 rows of the batches of versions 1"
    ) in text.stdout
    assert '    ["u1"]' in text.stdout and "no state variables" not in text.stdout
