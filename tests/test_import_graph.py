"""The package layers hold: the lower layers never import the engine, and no two packages import each other.

The graph is built from the source (every ``import`` and ``from ... import`` of every module under
``src/blobstate``, at the top of a module, inside a function or under ``TYPE_CHECKING`` alike), so an import
that only runs on one code path counts. A package is the first component under ``blobstate``
(``blobstate.state.store`` is in ``state``); a top-level module (``blobstate.errors``) is a package of its
own.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

BELOW_THE_ENGINE = ("standby", "adjunct", "state", "processor", "blobstore")
"""Packages the engine builds on, which must never import it back."""

KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()
"""``(importing module, imported module)`` pairs tolerated: none."""


@dataclass(frozen=True)
class Import:
    """One import statement of a blobstate module that reaches another blobstate module."""

    source: str
    target: str
    where: str

    def __str__(self) -> str:
        return f"{self.where}: {self.source} imports {self.target}"


def package(module: str) -> str:
    """The package of a module: the first component under ``blobstate`` (``blobstate`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_names(src: Path) -> dict[str, Path]:
    """Every module under ``src/blobstate`` by dotted name."""
    names = {}
    for path in sorted((src / "blobstate").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(module: str, path: Path, modules: dict[str, Path], src: Path) -> list[Import]:
    """The blobstate modules ``module`` imports, each with the line that imports it."""
    found = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from blobstate.processor import codec" imports the module blobstate.processor.codec
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        where = f"{path.relative_to(src)}:{getattr(node, 'lineno', 0)}"
        found += [Import(module, t, where) for t in dict.fromkeys(targets) if package_of_blobstate(t)]
    return found


def package_of_blobstate(target: str) -> bool:
    return target == "blobstate" or target.startswith("blobstate.")


def import_graph(src: Path = SRC) -> list[Import]:
    """Every import between blobstate modules under ``src``."""
    modules = module_names(src)
    return [i for module, path in modules.items() for i in imports_of(module, path, modules, src)]


def engine_imports(imports: list[Import]) -> list[Import]:
    """Imports of the engine by a package below it."""
    return [i for i in imports if package(i.source) in BELOW_THE_ENGINE and package(i.target) == "engine"]


def package_cycles(imports: list[Import]) -> list[list[Import]]:
    """One import path per cycle of packages (``a`` imports ``b`` ... imports ``a``), shortest first."""
    edges: dict[tuple[str, str], Import] = {}
    for i in imports:
        a, b = package(i.source), package(i.target)
        if a != b:
            edges.setdefault((a, b), i)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    cycles: dict[frozenset[str], list[Import]] = {}
    for start in sorted(graph):
        # breadth-first from ``start``: the shortest way back to it, if any
        paths = {start: [start]}
        frontier, ring = [start], None
        while frontier and ring is None:
            step = []
            for node in frontier:
                if start in graph[node]:
                    ring = [*paths[node], start]
                    break
                for nxt in sorted(graph[node] - set(paths)):
                    paths[nxt] = [*paths[node], nxt]
                    step.append(nxt)
            frontier = step
        if ring is not None:
            cycles.setdefault(frozenset(ring), [edges[pair] for pair in itertools.pairwise(ring)])
    return sorted(cycles.values(), key=len)


def allowed(imports: list[Import]) -> list[Import]:
    return [i for i in imports if (i.source, i.target) not in KNOWN_VIOLATIONS]


def test_no_package_below_the_engine_imports_it() -> None:
    offending = engine_imports(allowed(import_graph()))
    assert not offending, "a package below the engine imports it:\n" + "\n".join(map(str, offending))


def test_no_two_packages_import_each_other() -> None:
    cycles = package_cycles(allowed(import_graph()))
    shown = [" -> ".join(package(i.source) for i in c) + f" -> {package(c[0].source)}" for c in cycles]
    details = ["\n".join(["  " + shown[n], *(f"    {i}" for i in c)]) for n, c in enumerate(cycles)]
    assert not cycles, "packages import each other:\n" + "\n".join(details)


def test_every_known_violation_still_exists() -> None:
    # An entry whose import is gone must leave the list, so the list only ever shrinks to empty.
    present = {(i.source, i.target) for i in import_graph()}
    assert present >= KNOWN_VIOLATIONS, sorted(KNOWN_VIOLATIONS - present)


def _write(root: Path, module: str, text: str) -> None:
    path = root / Path(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        if parent != Path("."):
            (root / parent / "__init__.py").touch()
    path.write_text(text)


def test_the_checks_find_an_engine_import_in_a_function_and_a_cycle(tmp_path: Path) -> None:
    _write(tmp_path, "blobstate.state.store", "def f():\n    from blobstate.engine import task\n")
    _write(tmp_path, "blobstate.engine.task", "from ..reader import plan\n")
    _write(tmp_path, "blobstate.reader.plan", "import blobstate.lineage.refs\n")
    _write(tmp_path, "blobstate.lineage.refs", "from blobstate import engine\n")
    _write(tmp_path, "blobstate.errors", "")
    imports = import_graph(tmp_path)
    assert [str(i) for i in engine_imports(imports)] == [
        "blobstate/state/store.py:2: blobstate.state.store imports blobstate.engine.task"
    ]
    [cycle] = package_cycles(imports)
    assert [(package(i.source), package(i.target)) for i in cycle] == [
        ("engine", "reader"),
        ("reader", "lineage"),
        ("lineage", "engine"),
    ]


@pytest.mark.parametrize("below", BELOW_THE_ENGINE)
def test_each_guarded_package_exists(below: str) -> None:
    assert (SRC / "blobstate" / below / "__init__.py").exists()
