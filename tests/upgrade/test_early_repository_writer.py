"""Older builds run against a repository of this release: none of them can hurt it.

Builds cannot be changed once released. Those from before the head log (the early releases): their
``blobstate backup`` took the root index with the highest ``n`` for the newest snapshot, and its cleanup
deleted that index and the blobs only it referenced; against a repository of a later release it exited
0 and that release then found its committed index gone ("the repository was damaged"). Their
``blobstate gc --full``, and that of the first builds with a head log, is the query checkpoint sweep,
which deletes every permanent object under ``state/`` and ``blobs/``. This release keeps its blobs under
``data/`` and plants the guard (:data:`~blobstate.snapshot.repository.GUARD_INDEX`), which such a build
reads first and cannot parse.

The test takes each older build's source from this repository's own git history (``git archive``), runs
its command line as a subprocess (with the dependencies of this test's interpreter) on repositories this
release wrote or upgraded, and checks what each does: early builds' ``backup``, ``restore`` and
``inspect`` exit 1 naming the guard and their ``gc --full`` deletes nothing; builds that read only head
format 1 exit 1 saying what docs/FORMATS.md says they say; the previous release works on this layout.
After each, not a byte of the repository changed (but what the previous release backed up), and this
release verifies it, restores it byte for byte and backs up on top of it. Skipped, saying why, where git
or the older commits are missing (a copy without ``.git``, or a shallow clone).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from make_repository import BACKUPS, source_content, write_source

from blobstate.blobstore import open_blob_store
from blobstate.blobstore.local import TMP_DIR
from blobstate.snapshot.repository import (
    FORMER_BLOB_PREFIX,
    GUARD_INDEX,
    GUARD_MESSAGE,
    backup_to_repository,
    gc_repository,
    restore_repository,
    verify_repository,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

FIRST_EARLY = "5d49067635935156f4a7aa8035c143463134f50a"
"""The first commit with ``blobstate backup``: a repository of root indexes and ``blobs/``."""
LAST_EARLY = "bebea931c3cb5495f1f6a1dd5c44c360c8031399"
"""The last commit before the head log (``heads/``) and the repository marker."""
FIRST_HEAD_LOG = "efdf3708dd11f5ecc4c0d036cc596619ada9107a"
"""The first commit with the head log. Until ``gc`` served backup repositories, ``gc --full`` was the
query checkpoint sweep, which deletes every permanent object under ``state/`` and ``blobs/``."""
HEAD_FORMAT_1_ONLY = "75f1313167ca29417b99834e81b1195178a78c4f"
"""The last commit whose builds read only head format 1 (heads without a horizon, never pruned)."""
PREVIOUS_RELEASE = "005520d3ae29d24d619d0aef4e3ab4ad1cee52af"
"""The release before this one: head format 2, blobs under ``blobs/``, no guard."""

# Runs an older build's CLI and exits 99 if the interpreter imported any other blobstate.
RUN_BUILD = """
import os, runpy, sys
import blobstate
if not os.path.realpath(blobstate.__file__).startswith(os.environ["BUILD_SRC"] + os.sep):
    print(f"imported {blobstate.__file__}, not the build under test", file=sys.stderr)
    sys.exit(99)
sys.argv = ["blobstate", *sys.argv[1:]]
runpy.run_module("blobstate.cli.main", run_name="__main__", alter_sys=True)
"""


def build_source(commit: str, into: Path) -> Path:
    """``src/`` of ``commit``, extracted from this repository's git history into ``into``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the older builds' source comes from the git history")
    if not (ROOT / ".git").exists():
        pytest.skip(f"{ROOT} has no .git: the older builds' source comes from the git history")
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False
    )
    if found.returncode != 0:
        pytest.skip(f"commit {commit[:7]} (an older build) is not in this clone's history (shallow?)")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``builds(commit)``: the ``src/`` directory of that commit, extracted once per module."""
    extracted: dict[str, Path] = {}

    def build(commit: str) -> Path:
        if commit not in extracted:
            extracted[commit] = build_source(commit, tmp_path_factory.mktemp(f"build-{commit[:7]}"))
        return extracted[commit]

    return build


@pytest.fixture(params=[FIRST_EARLY, LAST_EARLY], ids=["first-early", "last-early"])
def early(request: pytest.FixtureRequest, builds: Callable[[str], Path]) -> Path:
    """The ``src/`` directory of an early build: the first and the last before the head log."""
    commit: str = request.param
    return builds(commit)


def run_build(src: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``blobstate ARGS`` of the build whose source is ``src``, with this interpreter's dependencies."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(src), BUILD_SRC=os.path.realpath(src), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-c", RUN_BUILD, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 99, done.stderr
    return done


def contents(repo: Path) -> dict[str, bytes]:
    """Every file of a local repository (TTL records included) and its bytes."""
    return {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and TMP_DIR not in p.relative_to(repo).parts
    }


def restored(repo: Path, target: Path) -> dict[str, bytes]:
    with open_blob_store(str(repo)) as store:
        restore_repository(store, target, checksum_cache=None)
    return {p.name: p.read_bytes() for p in target.iterdir()}


def backups(repo: Path, work: Path, numbers: range) -> None:
    with open_blob_store(str(repo)) as store:
        for number in numbers:
            write_source(work / "source", number)
            done = backup_to_repository(store, work / "source", checksum_cache=None)
            assert done.warning is None and done.version == number


def check_early_build_cannot_hurt(early_src: Path, repo: Path, work: Path, newest: int) -> None:
    """The early build's commands on ``repo`` change nothing; this release then restores backup
    ``newest`` byte for byte, verifies it and backs up on top of it."""
    before = contents(repo)
    write_source(work / "early-source", newest + 1)
    for args in (
        ("backup", str(work / "early-source"), str(repo)),
        ("restore", str(repo), str(work / "early-restore")),
        ("inspect", str(repo)),
    ):
        done = run_build(early_src, work, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        message = " ".join(done.stderr.split())
        assert GUARD_INDEX in message and GUARD_MESSAGE in message, (args, done.stderr)
        assert contents(repo) == before, f"early {args[0]} changed the repository"
    assert not (work / "early-restore").exists()
    # Its gc --full deletes every permanent object under blobs/ and state/: there are none.
    done = run_build(early_src, work, "gc", "--full", str(repo))
    assert done.returncode == 0, done.stderr
    assert "deleted=[]" in done.stdout, done.stdout
    assert contents(repo) == before, "early gc --full changed the repository"

    assert restored(repo, work / "restored") == source_content(newest)
    with open_blob_store(str(repo)) as store:
        result = verify_repository(store, checksums=True)
        assert result.problems == [] and result.version == newest
    backups(repo, work, range(newest + 1, newest + 2))
    assert restored(repo, work / "continued") == source_content(newest + 1)


def test_an_early_build_refuses_a_repository_of_this_release(early: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    backups(repo, tmp_path, range(1, BACKUPS + 1))  # the heads below the newest two are pruned
    with open_blob_store(str(repo)) as store:
        assert store.exists(GUARD_INDEX) and store.list(FORMER_BLOB_PREFIX) == []
    check_early_build_cannot_hurt(early, repo, tmp_path, BACKUPS)


def test_a_repository_upgraded_by_one_backup_is_guarded(
    builds: Callable[[str], Path], tmp_path: Path
) -> None:
    """The upgrade fixture (written with blobs under ``blobs/`` and no guard) after one backup of this
    release: the guard is planted and nothing committed is left under ``blobs/``."""
    repo = tmp_path / "repository"
    shutil.copytree(HERE / "repository", repo)
    backups(repo, tmp_path, range(BACKUPS + 1, BACKUPS + 2))
    with open_blob_store(str(repo)) as store:
        assert store.exists(GUARD_INDEX) and store.list(FORMER_BLOB_PREFIX) == []
    check_early_build_cannot_hurt(builds(LAST_EARLY), repo, tmp_path, BACKUPS + 1)


def test_gc_guards_a_repository_without_moving_its_blobs(
    builds: Callable[[str], Path], tmp_path: Path
) -> None:
    """gc plants the guard in a repository written before it (the early backup then refuses); only a
    backup moves the blobs out of ``blobs/``, so until then the early ``gc --full`` still reaches them."""
    early_src = builds(LAST_EARLY)
    repo = tmp_path / "repository"
    shutil.copytree(HERE / "repository", repo)
    with open_blob_store(str(repo)) as store:
        assert gc_repository(store, full=False, dry_run=True).guard_created
        assert not store.exists(GUARD_INDEX)
        assert gc_repository(store, full=True).guard_created
        assert not gc_repository(store, full=True).guard_created
        assert store.list(FORMER_BLOB_PREFIX)
    before = contents(repo)
    write_source(tmp_path / "early-source", BACKUPS + 1)
    done = run_build(early_src, tmp_path, "backup", str(tmp_path / "early-source"), str(repo))
    assert done.returncode == 1 and GUARD_MESSAGE in " ".join(done.stderr.split()), done.stderr
    assert contents(repo) == before
    assert restored(repo, tmp_path / "restored") == source_content(BACKUPS)


def test_the_first_head_log_builds_sweep_nothing_and_refuse_to_back_up(
    builds: Callable[[str], Path], tmp_path: Path
) -> None:
    first = builds(FIRST_HEAD_LOG)
    repo = tmp_path / "repository"
    backups(repo, tmp_path, range(1, BACKUPS + 1))
    before = contents(repo)
    done = run_build(first, tmp_path, "gc", "--full", str(repo))
    assert done.returncode == 0 and "deleted=[]" in done.stdout, (done.stdout, done.stderr)
    write_source(tmp_path / "old-source", BACKUPS + 1)
    done = run_build(first, tmp_path, "backup", str(tmp_path / "old-source"), str(repo))
    assert done.returncode == 1 and "has a hole" in done.stderr, done.stderr
    assert contents(repo) == before
    assert restored(repo, tmp_path / "restored") == source_content(BACKUPS)


@pytest.mark.parametrize(
    ("count", "says"),
    [(2, "unknown format version 2 (this build reads 1)"), (BACKUPS, "has a hole")],
    ids=["nothing-pruned", "pruned"],
)
def test_a_build_reading_only_head_format_1_refuses_and_changes_nothing(
    builds: Callable[[str], Path], tmp_path: Path, count: int, says: str
) -> None:
    """docs/FORMATS.md: such a build names the format versions while the repository still has
    ``heads/1.json``; once heads are pruned it checks the listing for holes before it reads a head, so
    it says the head log has a hole and the repository was damaged (it was not). Either way it exits 1
    and writes nothing."""
    old = builds(HEAD_FORMAT_1_ONLY)
    repo = tmp_path / "repository"
    backups(repo, tmp_path, range(1, count + 1))
    before = contents(repo)
    write_source(tmp_path / "old-source", count + 1)
    for args in (
        ("backup", str(tmp_path / "old-source"), str(repo)),
        ("gc", "--full", str(repo)),
        ("verify", str(repo)),
    ):
        done = run_build(old, tmp_path, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert says in " ".join((done.stdout + done.stderr).split()), (args, done.stdout, done.stderr)
        assert contents(repo) == before, f"{args[0]} changed the repository"
    assert restored(repo, tmp_path / "restored") == source_content(count)


def test_the_previous_release_backs_up_into_and_collects_a_repository_of_this_release(
    builds: Callable[[str], Path], tmp_path: Path
) -> None:
    """The release before the guard reads this layout (blob names come from the indexes), keeps the
    guard (an index above its newest head: a backup in flight) and sweeps only ``blobs/``; this
    release's next backup moves what it wrote there to ``data/``."""
    previous = builds(PREVIOUS_RELEASE)
    repo = tmp_path / "repository"
    backups(repo, tmp_path, range(1, BACKUPS + 1))
    write_source(tmp_path / "source", BACKUPS + 1)
    for args in (
        ("backup", str(tmp_path / "source"), str(repo)),
        ("gc", "--full", str(repo)),
        ("verify", "--checksums", str(repo)),
    ):
        done = run_build(previous, tmp_path, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    with open_blob_store(str(repo)) as store:
        assert store.exists(GUARD_INDEX) and store.list(FORMER_BLOB_PREFIX)
        assert verify_repository(store, checksums=True).problems == []
    assert restored(repo, tmp_path / "restored") == source_content(BACKUPS + 1)
    backups(repo, tmp_path, range(BACKUPS + 2, BACKUPS + 3))
    with open_blob_store(str(repo)) as store:
        assert store.list(FORMER_BLOB_PREFIX) == []
    assert restored(repo, tmp_path / "continued") == source_content(BACKUPS + 2)
