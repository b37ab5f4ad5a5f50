"""The command line on a checkpoint whose newest commit was lost: no command exits 0 after acting on it
(``rescale`` and ``gc`` refuse in one line and change nothing, ``lineage`` warns first and exits 1),
``inspect`` and ``restore`` say it on their first line, ``accept-loss`` and putting the commit back are
the two ways out, and ``verify`` exits 0 with a note while the newest commit's cleanup is pending."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rescale"))
import rescale_checkpoints
from rescale_checkpoints import batches, run_batches

from blobstate.blobstore import open_blob_store
from blobstate.cli.main import main
from blobstate.layout import commit_name
from blobstate.rescale import rescale_checkpoint
from blobstate.state.retention import MEMO


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 versions with 2 partitions, rescaled in process to 3 partitions as version 5."""
    root = tmp_path_factory.mktemp("lost-cli")
    run_batches(str(root / "ckpt"), batches(4, seed=3), root / "local", 2)
    rescale_checkpoint(None, str(root / "ckpt"), 3)
    return root / "ckpt"


@pytest.fixture
def lost(template: Path, tmp_path: Path) -> tuple[str, bytes]:
    """A copy of the template whose ``commits/5.json`` (the rescale's) was lost; and its bytes."""
    MEMO.forget()
    shutil.copytree(template, tmp_path / "ckpt")
    url = str(tmp_path / "ckpt")
    with open_blob_store(url) as store:
        data = store.get(commit_name(5))
        store.delete(commit_name(5))
    return url, data


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``blobstate ARGS`` as the console script does: exit status, stdout, stderr."""
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def files(url: str) -> dict[str, bytes]:
    """Every file under the checkpoint directory, TTL records included."""
    root = Path(url)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


WRITERS = [
    ["rescale", "{url}", "--partitions", "3"],
    ["rescale", "{url}", "--partitions", "4", "--json"],
    ["gc", "{url}"],
    ["gc", "{url}", "--full"],
    ["gc", "{url}", "--full", "--json"],
    ["gc", "{url}", "--dry-run"],
]
LISTINGS = [
    ["lineage", "{url}"],
    ["lineage", "{url}", "--json"],
    ["lineage", "{url}", "--partition", "1"],
    ["lineage", "{url}", "--version", "3"],
    ["verify", "{url}"],
]


@pytest.mark.parametrize("args", WRITERS + LISTINGS, ids=lambda a: " ".join(a[:1] + a[2:]))
def test_no_command_exits_0_after_acting_on_a_checkpoint_with_lost_newer_commits(
    lost: tuple[str, bytes], capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """Before, rescale committed version 4's rescale as version 5, gc --full swept the lost rescale's
    blobs, and lineage listed version 4 as the newest, all exiting 0."""
    url, _ = lost
    before = files(url)
    with mock.patch("blobstate.cli.rescale_cmd._spark", side_effect=AssertionError("Spark started")):
        code, out, err = run([a.format(url=url) for a in args], capsys)
    assert code == 1, (out, err)
    first = err.splitlines()[0]
    if args in WRITERS:
        assert first.startswith(f"error: refusing to {'rescale' if args[0] == 'rescale' else 'run gc on'} ")
        assert len(err.strip().splitlines()) == 1, "one line"
        assert "the newest readable version is 4" in first and "commits/5.json" in first
        assert f"blobstate accept-loss {url} --version 4" in first
        assert out == ""
    elif args[0] == "lineage":
        assert first.startswith(f"warning: the newest commits of {url} were lost: version 4 is the newest")
        if "--json" in args:
            assert json.loads(out)["warnings"] == [first.removeprefix("warning: ")]
        elif "--partition" not in args and "--version" not in args:
            assert out.startswith("newest readable version (newer commits were lost): 4")
    else:
        assert first.startswith("problem: commits/5.json: missing:") and "newer commits were lost" in first
    assert files(url) == before, "nothing was written"


def test_lineage_exits_1_naming_a_hole(lost: tuple[str, bytes], capsys: pytest.CaptureFixture[str]) -> None:
    url, data = lost
    with open_blob_store(url) as store:
        store.put(commit_name(5), data)
        store.delete(commit_name(4))
    code, out, err = run(["lineage", url], capsys)
    assert code == 1
    assert err.splitlines()[0].startswith(f"warning: the commit log of {url} has holes: commits/4.json")
    assert out.startswith("newest committed version: 5")


@pytest.mark.parametrize("command", ["inspect", "restore"])
def test_inspect_and_restore_say_it_on_their_first_line(
    lost: tuple[str, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    url, _ = lost
    target = [str(tmp_path / "restored")] if command == "restore" else []
    code, out, err = run([command, url, *target, "--partition", "0"], capsys)
    assert code == 0, err
    (warning,) = err.splitlines()
    assert (
        warning.startswith("warning: the newest commits of") and "version 4 is the newest readable" in warning
    )
    assert out.startswith(f"query checkpoint {url}  operator 0  partition 0  version 4")
    target = [str(tmp_path / "restored-json")] if command == "restore" else []
    code, out, err = run([command, url, *target, "--partition", "0", "--json"], capsys)
    assert code == 0 and json.loads(out)["warnings"] == [warning.removeprefix("warning: ")]


def test_accept_loss_lets_writers_continue(
    lost: tuple[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = lost
    code, out, err = run(["accept-loss", url, "--version", "5"], capsys)
    assert code == 1 and err.startswith(f"error: the newest readable version of {url} is 4, not 5")
    code, out, err = run(["accept-loss", url, "--version", "4", "--reason", "no backup"], capsys)
    assert code == 0, err
    assert out.startswith(f"checkpoint {url}: accepted the loss of version 5 (accepted-loss/4_")
    assert "the next commit is version 5" in out
    (record,) = (Path(url) / "accepted-loss").iterdir()
    assert json.loads(record.read_bytes())["reason"] == "no backup"
    code, out, err = run(["accept-loss", url, "--version", "4"], capsys)
    assert code == 1 and "nothing to accept" in err and "accepted already" in err
    for args in (["lineage", url], ["verify", url], ["gc", url, "--full"], ["verify", url, "--checksums"]):
        code, out, err = run(args, capsys)
        assert code == 0, (args, out, err)
        assert err == ""
    code, out, err = run(["lineage", url, "--json"], capsys)
    assert code == 0 and json.loads(out)["warnings"] == []


def test_putting_the_commit_back_makes_everything_work_again(
    lost: tuple[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    url, data = lost
    assert run(["gc", url, "--full"], capsys)[0] == 1
    (Path(url) / "commits" / "5.json").write_bytes(data)  # from a backup
    for args in (["verify", url, "--checksums"], ["gc", url, "--full"], ["lineage", url]):
        code, out, err = run(args, capsys)
        assert code == 0 and err == "", (args, out, err)
    assert "newest committed version: 5" in run(["lineage", url], capsys)[1]
    assert "ok: every retained version is restorable" in run(["verify", url, "--checksums"], capsys)[1]


def test_verify_exits_0_with_a_note_while_the_newest_cleanup_is_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, verify exited 1 ("committed but still pending: it will expire") between a commit and its
    post-commit cleanup, as it may find a running query's checkpoint."""
    url = str(tmp_path / "ckpt")
    data = batches(5, seed=5)
    run_batches(url, data[:4], tmp_path / "local", 2)
    with mock.patch.object(rescale_checkpoints, "after_commit", lambda *a, **k: None):
        run_batches(url, data[4:], tmp_path / "local", 2)
    code, out, err = run(["verify", url], capsys)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith("note: cleanup pending: ")
    assert out.splitlines()[-1] == "ok: every retained version is restorable"
    code, out, err = run(["verify", url, "--json"], capsys)
    result: dict[str, Any] = json.loads(out)
    assert code == 0 and result["ok"] and result["notes"] == [notes[0].removeprefix("note: ")]
