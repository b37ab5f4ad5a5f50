"""The repository stands on its own: no file points outside it or to the development team's notes.

What a reader needs of the design is in ``docs/`` (``docs/DESIGN.md``); code and docs never cite
documents one folder above the repository, paths of the development machine, the design's numbered
seed documents or issue numbers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not match itself.
FORBIDDEN = re.compile(
    "|".join(
        [
            re.escape(".." + "/shared"),
            re.escape("/" + "work/"),
            r"\bseed[ -]" + r"0\d",
            r"\bissue " + r"[12]\d*\b",
        ]
    ),
    re.IGNORECASE,
)
FIXTURES: set[str] = set()
"""Tracked files allowed to hold such text (test fixtures that must reproduce it); none today."""


def tracked_files() -> list[str]:
    """The repository's tracked files (``git ls-files``); without git, the files of a source checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        ).stdout.split("\n")
        return [name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
        return [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)
        ]


def test_no_tracked_file_points_outside_the_repository_or_to_internal_notes() -> None:
    files = tracked_files()
    assert "README.md" in files and "docs/DESIGN.md" in files
    found = []
    for name in files:
        if name in FIXTURES:
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary (a PNG), or deleted in the working tree
        for number, line in enumerate(text.splitlines(), start=1):
            if match := FORBIDDEN.search(line):
                found.append(f"{name}:{number}: {match.group(0)!r}")
    assert not found, "references outside the repository or to internal notes:\n" + "\n".join(found)


def test_the_patterns_catch_what_they_are_for() -> None:
    for text in ("see ../" + "shared/DESIGN.md", "/" + "work/main", "seed " + "003's table", "issue " + "13"):
        assert FORBIDDEN.search(text), text
    for text in ("the seed of the generator", "an issue with S3", "version 13", "worker/"):
        assert not FORBIDDEN.search(text), text
