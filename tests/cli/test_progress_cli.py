"""Issue 33: progress on the commands that run for minutes on large state (``verify --checksums``, ``gc
--full``, ``rescale``, ``report``, ``inspect`` and ``restore`` of a query checkpoint, as ``backup`` and
``restore`` of a backup had), through one helper (:mod:`blobstate.cli.progress`): drawn on stderr only
when it is a terminal, never with ``--json``, and the command's output is the same either way.

A terminal is simulated by making the helper believe stderr is one (``_stderr_is_terminal``); rich then
draws into the captured stderr. The checkpoint is built without Spark (``tests/rescale``) and the rescale
runs in this process (``_spark`` returns None), so no test here starts Spark.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rescale"))
from rescale_checkpoints import batches, run_batches

from blobstate.blobstore.activity import observe
from blobstate.cli import progress
from blobstate.cli.main import main

COMMANDS = {
    # command: (arguments, what its progress says)
    "verify --checksums": (["verify", "{ckpt}", "--checksums"], "verify:"),
    "gc --full": (["gc", "{ckpt}", "--full"], "gc:"),
    "rescale": (["rescale", "{ckpt}", "--partitions", "2"], "rescale to 2 partitions:"),
    "report": (["report", "{ckpt}", "--out", "{work}/report"], "reading commits"),
    "inspect (query checkpoint)": (
        ["inspect", "{ckpt}", "--partition", "1"],
        "inspect: loading partition 1:",
    ),
    "restore (query checkpoint)": (["restore", "{ckpt}", "{work}/restored", "--partition", "1"], "restore:"),
    "backup": (["backup", "{work}/source", "{work}/repo"], "backup"),
    "restore (backup)": (["restore", "{work}/repo", "{work}/restored"], "restore"),
    "verify (backup)": (["verify", "{work}/repo", "--checksums"], "verify:"),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A query checkpoint (3 batches on 4 partitions) and a backup repository of a small directory."""
    root = tmp_path_factory.mktemp("template")
    run_batches(str(root / "ckpt"), batches(3, seed=13), root / "local", 4)
    source = root / "source"
    source.mkdir()
    for i in range(3):
        (source / f"file-{i}").write_bytes(bytes(range(256)) * (40 + i))
    with pytest.raises(SystemExit) as exited:
        main(["backup", str(source), str(root / "repo")])
    assert exited.value.code in (0, None)
    return root


def _run(
    name: str, template: Path, work: Path, capsys: pytest.CaptureFixture[str], *, as_json: bool
) -> tuple[str, str]:
    """Run command ``name`` on a fresh copy of the template, always at the same paths; (stdout, stderr)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    args, _ = COMMANDS[name]
    argv = [a.format(ckpt=work / "ckpt", work=work) for a in args] + (["--json"] if as_json else [])
    capsys.readouterr()
    try:
        main(argv)
    except SystemExit as exited:
        assert exited.code in (0, None), capsys.readouterr()
    captured = capsys.readouterr()
    return captured.out, captured.err


def _same(out: str) -> str:
    """Output with what differs from run to run masked: uids, times, sizes (a rebuilt RocksDB file)."""
    out = re.sub(r"[0-9a-f]{32}", "<uid>", out)
    return re.sub(r"\d[\d,.]*", "<n>", out)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_progress_only_on_a_terminal_and_never_with_json_and_the_output_is_unchanged(
    name: str,
    template: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("blobstate.cli.rescale_cmd._spark", lambda master: None)  # in this process
    work = tmp_path / "work"
    said = COMMANDS[name][1]
    plain_out, plain_err = _run(name, template, work, capsys, as_json=False)
    json_out, json_err = _run(name, template, work, capsys, as_json=True)
    assert plain_err == "" and json_err == ""  # stderr is not a terminal: no progress
    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    tty_out, tty_err = _run(name, template, work, capsys, as_json=False)
    assert said in tty_err, tty_err  # drawn on the terminal (stderr) ...
    assert "\x1b" not in tty_out  # ... never on stdout,
    assert _same(tty_out) == _same(plain_out)  # which is what it was without a terminal
    tty_json_out, tty_json_err = _run(name, template, work, capsys, as_json=True)
    assert tty_json_err == ""  # --json: no progress, even on a terminal
    assert _same(tty_json_out) == _same(json_out)
    json.loads(tty_json_out)


def test_the_activity_counts_every_store_operation_of_the_process(tmp_path: Path) -> None:
    from blobstate.blobstore import open_blob_store

    activity = progress.Activity()
    with open_blob_store(str(tmp_path / "store")) as store, observe(activity.add):
        store.put("a/1", b"x" * 10)
        store.put_if_absent("a/2", b"y" * 5)
        store.put_if_absent("a/2", b"y" * 5)  # not created: not counted
        assert store.get("a/1") == b"x" * 10
        store.get_file("a/2", tmp_path / "copy")
        assert store.list("a/") == ["a/1", "a/2"]
        store.delete("a/1")
        store.delete_if_exists("a/1")  # gone already: not counted
    store_after = open_blob_store(str(tmp_path / "store"))
    store_after.get("a/2")  # no observer any more: not counted
    assert (activity.read, activity.read_bytes) == (2, 15)
    assert (activity.written, activity.written_bytes) == (2, 15)
    assert (activity.deleted, activity.listed) == (1, 2)
    assert activity.text() == "read 2 objects (15 B), wrote 2 (15 B), deleted 1, listed 2 names"


def test_the_activity_follows_a_spark_job_s_running_tasks() -> None:
    import threading
    import time

    class Stage:
        numTasks, numCompletedTasks = 8, 3

    class Tracker:
        def getActiveStageIds(self) -> list[int]:
            return [4]

        def getStageInfo(self, stage: int) -> Stage:
            return Stage()

    class Context:
        def statusTracker(self) -> Tracker:
            return Tracker()

    class Session:
        sparkContext = Context()

    with progress.store_activity("rescale", False) as off:
        off.follow_spark(Session())  # not shown: nothing polled
        assert threading.active_count() >= 1 and off._poller is None
    activity = progress.Activity()
    activity.follow_spark(Session())
    deadline = time.monotonic() + 10
    while "Spark tasks" not in activity.text() and time.monotonic() < deadline:
        time.sleep(0.1)
    activity._close()
    assert activity.text() == "Spark tasks 3/8"
