"""Every fenced block of README.md and docs/*.md is checked, unchanged, as a reader would use it.

How a block is treated depends on its info string:

* ``python``: run. The runnable blocks of one ``##`` section run in order in one fresh, empty
  directory, each as a user would run it (a subprocess with the user's environment and this virtualenv
  on ``PATH``). Python blocks that follow one another in a section are one script (a later block
  continues an earlier one, e.g. reads its ``query``); a ``bash`` block runs after the python before it.
* ``bash``: run with ``bash -euo pipefail`` in that directory.
* ``json``: parsed by the parser of the format it shows (``metadata.json``, a commit, a backup head
  record; the backup repository guard is compared with the one this build writes); values the docs
  abbreviate (``"5b1e..."``) are padded to full length and the content digest recomputed first, so
  every field and value is checked against the real rules.
* ``text``: program output, layouts and interface listings; not run.

Any other fence (a bare ``````` included) fails the test. A ``python``, ``bash`` or ``json`` block
that cannot run here is preceded by ``<!-- not run: <reason> -->`` on the line before its fence.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "bash")
KINDS = (*RUN, "json", "text")
NOT_RUN = re.compile(r"^<!-- not run: (\S.*\S) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string, its text and the reason it is not run (if any)."""

    document: str
    line: int
    section: str
    kind: str
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line} ({self.section})"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order."""
    lines = path.read_text().split("\n")
    found: list[Block] = []
    section = "(top)"
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            start = i
            i += 1
            while not lines[i].startswith("```"):
                i += 1
            before = lines[start - 1] if start else ""
            marker = NOT_RUN.match(before)
            found.append(
                Block(
                    path.relative_to(ROOT).as_posix(),
                    start + 1,
                    section,
                    line[3:].strip(),
                    "\n".join(lines[start + 1 : i]) + "\n",
                    marker.group(1) if marker else None,
                )
            )
        i += 1
    return found


ALL = [b for path in DOCUMENTS for b in blocks(path)]


def test_every_block_says_what_it_is_and_every_block_not_run_says_why() -> None:
    assert len(DOCUMENTS) >= 5 and len(ALL) > 20
    unlabelled = [b.where for b in ALL if b.kind not in KINDS]
    assert not unlabelled, f"fences without one of {KINDS} as info string: {unlabelled}"
    stray = [b.where for b in ALL if b.kind == "text" and b.not_run]
    assert not stray, f"text blocks are never run; drop the marker: {stray}"
    for path in DOCUMENTS:
        text = path.read_text()
        # a marker that is not directly above a fence marks nothing
        for match in re.finditer(r"^<!-- not run.*$", text, re.M):
            after = text[match.end() + 1 :].split("\n", 1)[0]
            assert after.startswith("```"), f"{path.name}: {match.group(0)!r} is not directly above a fence"
            assert NOT_RUN.match(match.group(0)), f"{path.name}: {match.group(0)!r} gives no reason"


# --- JSON examples, through the real parsers -------------------------------------------------------

ABBREVIATED = re.compile(r"^([0-9a-f]+)\.\.\.$")


DIGEST_KEYS = {"sha256", "commit"}
"""Fields that hold a SHA-256 (an acceptance's ``commit`` is the readable commit's attempts digest)."""


def _unabbreviate(value: object, key: str = "") -> object:
    """Pad abbreviated hex (``"5b1e..."``): to 64 digits for a ``sha256``, else to a 32-digit uid."""
    if isinstance(value, dict):
        return {k: _unabbreviate(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_unabbreviate(v, key) for v in value]
    if isinstance(value, str) and (match := ABBREVIATED.match(value)):
        return match.group(1).ljust(64 if key in DIGEST_KEYS else 32, "0")
    return value


def _as_stored(example: str) -> tuple[dict, bytes]:
    from blobstate.lineage.commitlog import content_digest

    obj = _unabbreviate(json.loads(example))
    assert isinstance(obj, dict)
    if "sha256" in obj:
        obj.pop("sha256")
        obj["sha256"] = content_digest(obj)
    return obj, json.dumps(obj).encode()


def _metadata_example() -> bytes:
    (block,) = [b for b in ALL if b.kind == "json" and '"query_id"' in b.code]
    return _as_stored(block.code)[1]


def _parse(block: Block) -> object:
    from blobstate.lineage.commitlog import parse_commit, parse_metadata
    from blobstate.snapshot.heads import head_name, parse_head

    obj, data = _as_stored(block.code)
    if "query_id" in obj:
        return parse_metadata(data)
    if "checkpoints" in obj:
        metadata = parse_metadata(_metadata_example())
        return parse_commit(data, f"commits/{obj['version']}.json", obj["version"], metadata)
    if "index_checksum" in obj:
        return parse_head(data, head_name(obj["version"]), obj["version"])
    if obj.get("kind") == "blobstate backup repository guard":
        from blobstate.snapshot.repository import guard_bytes

        assert obj == json.loads(guard_bytes()), f"{block.where}: not the guard this build writes"
        return obj
    if "lost" in obj:
        from blobstate.lineage.acceptance import parse_acceptance

        return parse_acceptance(data, f"accepted-loss/{obj['version']}_{'a' * 32}.json")
    raise AssertionError(f"{block.where}: no parser for this JSON block: validate it here or mark it not run")


JSON = [b for b in ALL if b.kind == "json" and b.not_run is None]


@pytest.mark.parametrize("block", JSON, ids=[b.where for b in JSON])
def test_json_examples_are_what_the_parsers_accept(block: Block) -> None:
    parsed = _parse(block)
    example = json.loads(block.code)
    # what the docs show is what was parsed (abbreviations aside), not ignored as an unknown field
    assert getattr(parsed, "version", example.get("version")) == example.get("version")


# --- Checkpoints the examples write --------------------------------------------------------------

CHECKPOINT_ARGUMENT = re.compile(r"""\bcheckpoint=["']([^"']+)["']""")


def test_each_section_s_examples_write_a_checkpoint_of_their_own() -> None:
    """A reader who runs the examples one after another in one directory never starts a query on a
    checkpoint another example wrote (another processor, other state variables)."""
    by_checkpoint: dict[str, set[str]] = {}
    for block in ALL:
        if block.kind == "python" and block.not_run is None:
            for checkpoint in CHECKPOINT_ARGUMENT.findall(block.code):
                by_checkpoint.setdefault(checkpoint, set()).add(f"{block.document} ({block.section})")
    shared = {c: sorted(s) for c, s in by_checkpoint.items() if len(s) > 1}
    assert not shared, f"examples of several sections write the same checkpoint: {shared}"
    assert len(by_checkpoint) >= 6, by_checkpoint


# --- Python and bash blocks, run --------------------------------------------------------------------


def _user_env() -> dict[str, str]:
    """The environment of a user's shell with this virtualenv active."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _run(command: list[str], cwd: Path, what: str) -> str:
    result = subprocess.run(command, cwd=cwd, env=_user_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result.stdout


def run_section(section: list[Block], cwd: Path) -> str:
    """Run a section's runnable blocks in order in ``cwd``; returns their standard output."""
    out: list[str] = []
    script: list[Block] = []

    def flush() -> None:
        if script:
            path = cwd / f"example_{script[0].line}.py"
            path.write_text("".join(b.code for b in script))
            out.append(_run([sys.executable, path.name], cwd, script[0].where))
            script.clear()

    for block in section:
        if block.kind == "python":
            script.append(block)
            continue
        flush()
        path = cwd / f"example_{block.line}.sh"
        path.write_text(block.code)
        out.append(_run(["bash", "-euo", "pipefail", path.name], cwd, block.where))
    flush()
    return "".join(out)


SECTIONS: dict[tuple[str, str], list[Block]] = {}
for _b in ALL:
    if _b.kind in RUN and _b.not_run is None:
        SECTIONS.setdefault((_b.document, _b.section), []).append(_b)


def _parquet_rows(directory: Path) -> list[dict]:
    return [row for part in sorted(directory.glob("batch=*")) for row in pq.read_table(part).to_pylist()]


def _using_it(cwd: Path, out: str) -> None:
    final = {row["key"]: (row["count"], row["total"]) for row in _parquet_rows(cwd / "out")}
    assert final == {"a": (2, 4), "b": (2, 12), "c": (1, 20)}  # one batch or two: the same totals
    assert re.search(r"^\d+ \{.*\} \S+$", out, re.M), out  # the progress metrics line


def _side_streams(cwd: Path, out: str) -> None:
    rows = sorted((r["user"], r["page"], r["tier"]) for r in _parquet_rows(cwd / "enriched"))
    assert rows == [("a", 1, "gold"), ("a", 4, "gold"), ("b", 2, "silver"), ("c", 3, None)]
    assert "|   c|   3|  NULL|    0|" in out, out


def _reading_state(cwd: Path, out: str) -> None:
    tables = re.findall(r"^\|\s*(\w)\|\s*(\d+)\|\s*(\d+)\|", out, re.M)
    latest = {("a", "2", "4"), ("b", "2", "12"), ("c", "1", "20")}
    first, second = {("a", "2", "4"), ("b", "1", "2")}, {("b", "1", "10"), ("c", "1", "20")}
    assert latest <= set(tables[:3]) and set(tables[3:5]) in (first, second), out  # version 1: one file
    assert "agg: value state struct<count:bigint,total:bigint>" in out  # blobstate inspect
    assert (cwd / "p1" / "CHECKPOINT-ID").read_text().startswith("1_")  # blobstate restore --version 1


def _rescaling(cwd: Path, out: str) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from blobstate.rescale.murmur3 import spark_partition

    rows = set(re.findall(r"^\|\s*(\w)\|\s*(\d+)\|\s*(\d+)\|\s*(\d+)\|$", out, re.M))
    schema = StructType([StructField("key", StringType())])
    # the state after the rescale, each key in its partition under the new count (3)
    expected = {("a", 2, 4), ("b", 2, 12), ("c", 1, 20)}
    assert rows == {(k, str(c), str(t), str(spark_partition((k,), schema, 3))) for k, c, t in expected}, out


def _arrow_running_count(cwd: Path, out: str) -> None:
    assert "|  c|    1|   20|" in out and "|  b|    2|   12|" in out, out


def _arrow_sessions(cwd: Path, out: str) -> None:
    assert "[('ann', 2), ('bob', 1)]" in out, out


def _arrow_top_n(cwd: Path, out: str) -> None:
    assert "|   ann|[9, 6, 5]|" in out and "|   bob|   [7, 3]|" in out, out


CHECKS: dict[tuple[str, str], Callable[[Path, str], None]] = {
    ("README.md", "Using it"): _using_it,
    ("README.md", "Side streams (adjunct stores)"): _side_streams,
    ("README.md", "Reading state"): _reading_state,
    ("README.md", "Rescaling"): _rescaling,
    ("docs/ARROW_API.md", "A running count"): _arrow_running_count,
    ("docs/ARROW_API.md", "A sessionizer"): _arrow_sessions,
    ("docs/ARROW_API.md", "A top-N"): _arrow_top_n,
}
"""What a section's examples must produce, beyond running without an error (a section not listed only
has to run)."""


def test_every_check_belongs_to_a_section_with_runnable_blocks() -> None:
    assert set(CHECKS) <= set(SECTIONS), "a section was renamed or lost its examples"


@pytest.mark.spark
@pytest.mark.parametrize("section", list(SECTIONS), ids=[f"{d}:{s}" for d, s in SECTIONS])
def test_the_examples_of_a_section_run_as_written_from_an_empty_directory(
    section: tuple[str, str], tmp_path: Path
) -> None:
    out = run_section(SECTIONS[section], tmp_path)
    if section in CHECKS:
        CHECKS[section](tmp_path, out)
