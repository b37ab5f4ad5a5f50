"""``blobstate backup / restore / inspect / gc`` on a real RocksDB checkpoint, on every backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blobstate.cli.main import app, main
from blobstate.state.store import RocksStateStore

runner = CliRunner()


def _run(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fill(store: RocksStateStore, start: int, count: int) -> None:
    for i in range(start, start + count):
        store.put("values", b"key-%08d" % i, os.urandom(64))
    store.flush()


def test_checkpoint_round_trips_byte_identical_and_second_backup_is_incremental(
    blob_store_url: str, tmp_path: Path
) -> None:
    db = RocksStateStore.open(tmp_path / "db")
    _fill(db, 0, 5000)
    first_checkpoint = db.checkpoint(tmp_path / "ckpt1")

    first = _run("backup", str(first_checkpoint), blob_store_url)
    assert first["files_uploaded"] == len(_tree(first_checkpoint))

    _fill(db, 5000, 500)
    second_checkpoint = db.checkpoint(tmp_path / "ckpt2")
    db.close()
    old_ssts = {n for n in _tree(first_checkpoint) if n.endswith(".sst")}
    new_files = _tree(second_checkpoint)
    second = _run("backup", str(second_checkpoint), blob_store_url)
    uploaded = {Path(p).name for p in second["uploaded"]}
    # Only the SSTs that are new since the first backup, plus every mutable file, went up again.
    assert uploaded == {n for n in new_files if not n.endswith(".sst") or n not in old_ssts}
    assert second["files_retained"] == len(old_ssts & set(new_files))

    target = tmp_path / "restored"
    restored = _run("restore", blob_store_url, str(target))
    assert restored["snapshot"] == second["snapshot"]
    assert _tree(target) == new_files

    # Restoring again over an identical directory moves nothing.
    again = _run("restore", blob_store_url, str(target))
    assert again["bytes_downloaded"] == 0
    assert again["files_reused"] == len(new_files)
    with RocksStateStore.open(target) as reopened:
        assert sum(1 for _ in reopened.items("values")) == 5500

    inspected = _run("inspect", blob_store_url)
    assert inspected["snapshot"] == second["snapshot"]
    # gc on S3 insists on the lifecycle rule that expires pending objects; --install-lifecycle sets it up.
    if blob_store_url.startswith("az://"):
        # Azure's lifecycle policy needs the management API: --install-lifecycle says how, in one line.
        refused = runner.invoke(app, ["gc", blob_store_url, "--install-lifecycle"])
        assert refused.exit_code == 1 and "management-policy create" in str(refused.exception)
        gc = _run("gc", blob_store_url)
    else:
        gc = _run("gc", blob_store_url, "--install-lifecycle")
    assert gc["expired"] == [] and gc["expiry_problem"] is None


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the CLI as the console script does; it must fail with one ``error:`` line, returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_restore_of_an_empty_repository_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nothing").mkdir()
    line = _error(capsys, "restore", str(tmp_path / "nothing"), str(tmp_path / "out"))
    assert "no snapshot" in line and str(tmp_path / "nothing") in line
    line = _error(capsys, "restore", str(tmp_path / "mistyped"), str(tmp_path / "out"))
    assert line.startswith(f"error: {tmp_path / 'mistyped'} does not exist"), line


@pytest.mark.parametrize("command", ["backup", "restore"])
def test_progress_is_not_printed_in_json_mode(command: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "CURRENT").write_text("MANIFEST-000001\n")
    _run("backup", str(source), str(tmp_path / "repo"))
    if command == "restore":
        _run("restore", str(tmp_path / "repo"), str(tmp_path / "out"))


# ---------------------------------------------------------------------------------------------- issue 8
def test_restore_into_a_directory_holding_the_repository_is_refused_and_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Finding 2: `cd data && blobstate restore repo .` used to delete the repository as an extra file.
    source = tmp_path / "source"
    source.mkdir()
    (source / "000001.sst").write_bytes(os.urandom(1000))
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    _run("backup", str(source), str(data / "repo"))
    repo_before = _tree(data / "repo")
    monkeypatch.chdir(data)
    line = _error(capsys, "restore", "repo", ".")
    assert "contains the repository" in line
    line = _error(capsys, "restore", "repo", "repo/blobs/restored")
    assert "inside the repository" in line
    assert _tree(data / "repo") == repo_before
    assert (data / "notes.txt").read_text() == "mine"
    assert _run("restore", "repo", str(tmp_path / "elsewhere"))["files_downloaded"] == 1


def test_restore_deletes_other_files_only_with_delete_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "CURRENT").write_text("MANIFEST-1\n")
    repo = str(tmp_path / "repo")
    _run("backup", str(source), repo)
    target = tmp_path / "target"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    line = _error(capsys, "restore", repo, str(target))
    assert "'thesis.tex'" in line and "--delete-extra" in line
    assert sorted(os.listdir(target)) == ["thesis.tex"]
    result = _run("restore", repo, str(target), "--delete-extra")
    assert result["files_deleted"] == 1 and _tree(target) == _tree(source)


def test_restore_detects_an_index_altered_after_its_backup_committed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "000007.sst").write_bytes(os.urandom(100))
    repo = tmp_path / "repo"
    name = _run("backup", str(source), str(repo))["snapshot"]
    index = repo / name
    index.write_bytes(index.read_bytes().replace(b'"000007.sst"', b'"000008.sst"'))
    line = _error(capsys, "restore", str(repo), str(tmp_path / "out"))
    assert f"snapshot index '{name}'" in line and "changed or damaged" in line
    assert not (tmp_path / "out").exists()


@pytest.fixture(params=["local", "s3"])
def shared_repo(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A repository URL that separate processes can share: a local directory or moto's S3."""
    if request.param == "local":
        return str(tmp_path / "repo")
    return request.getfixturevalue("s3_url")


def test_concurrent_backup_processes_one_wins_each_version_and_the_newest_restores(
    shared_repo: str, tmp_path: Path
) -> None:
    # Finding 3: two `blobstate backup` processes into one repository at once.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    shared = os.urandom(200_000)
    committed: dict[int, dict[str, bytes]] = {}
    conflicts = 0
    for round_ in range(3):
        sources = []
        for who in ("a", "b"):
            src = tmp_path / f"src-{round_}-{who}"
            src.mkdir()
            (src / "000001.sst").write_bytes(shared)
            for i in range(20):
                (src / f"{who}{i:05d}.sst").write_bytes(os.urandom(50_000))
            sources.append(src)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "blobstate.cli.main", "backup", str(src), shared_repo, "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
            )
            for src in sources
        ]
        for src, proc in zip(sources, procs, strict=True):
            out, err = proc.communicate(timeout=300)
            if proc.returncode == 0:
                committed[json.loads(out)["version"]] = _tree(src)
            else:
                assert proc.returncode == 1, err
                assert "another backup committed version" in err, err
                conflicts += 1
        versions = sorted(committed)
        assert versions == list(range(1, len(versions) + 1))
        restored = _run("restore", shared_repo, str(tmp_path / f"out-{round_}"))
        assert restored["version"] == versions[-1]
        assert _tree(tmp_path / f"out-{round_}") == committed[versions[-1]]
    print(f"{conflicts} of 6 backups lost a race")  # shown with -s: how often the processes overlapped


def test_a_changed_blob_byte_fails_the_restore_naming_the_blob_and_the_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "000009.sst").write_bytes(os.urandom(5000))
    repo = tmp_path / "repo"
    name = _run("backup", str(source), str(repo))["snapshot"]
    (blob,) = json.loads(runner.invoke(app, ["inspect", str(repo), "--json"]).stdout)["index"]["dirIndex"][
        "filesPresent"
    ][0]["blobs"]
    path = repo / blob["blobId"]
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01
    path.write_bytes(bytes(data))
    line = _error(capsys, "restore", str(repo), str(tmp_path / "out"))
    assert blob["blobId"] in line and name in line and "000009.sst" in line and "checksum" in line
    assert str(tmp_path / "out") not in line  # the remote object is named, not a local path
