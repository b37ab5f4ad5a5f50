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


# ------------------------------------------------------------------------------- task side and the JVM
FEATURES = ("adjunct", "standby")
"""The feature packages: each brings its own per-batch steps, which the task and the batch contracts
only know through their interfaces (``batch.steps.BatchStep``, ``batch.steps.TaskStep``)."""

FEATURE_FREE = ("blobstate.engine.task", "blobstate.batch")
"""Modules (and packages: every module under them) that import no feature and name none in an import."""

PY4J_ATTRIBUTES = frozenset({"_jvm", "_jsc", "_jdf", "_jsparkSession", "_gateway", "_jgd", "_jsq"})
"""PySpark's private handles on py4j objects (the JVM, the Java context, session, DataFrame, grouping,
query) and py4j's gateway: what a module touches to drive the JVM directly."""

JVM_SEAM = ("blobstate.engine.jvm.classic",)
"""The one implementation of ``batch.jvm.JvmSeam`` that talks to the JVM through py4j."""

KNOWN_PY4J: frozenset[tuple[str, str]] = frozenset({("blobstate.engine.handle", "_jsq")})
"""``(module, name)`` touches of py4j outside the seam that stay: the query's handle subclasses PySpark's
classic ``StreamingQuery``, whose constructor takes the Java query."""


def import_names(path: Path) -> list[tuple[int, str]]:
    """Every dotted name an import statement of a module mentions (modules and imported names), any
    package's, with its line."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
            names += [(node.lineno, alias.asname) for alias in node.names if alias.asname]
        elif isinstance(node, ast.ImportFrom):
            names.append((node.lineno, "." * node.level + (node.module or "")))
            for alias in node.names:
                names += [(node.lineno, n) for n in (alias.name, alias.asname) if n]
    return names


def feature_imports(src: Path = SRC) -> list[str]:
    """Import lines of the feature-free modules that import or name a feature."""
    found = []
    for module, path in module_names(src).items():
        if not any(module == m or module.startswith(m + ".") for m in FEATURE_FREE):
            continue
        for line, name in import_names(path):
            if any(feature in name.lower() for feature in FEATURES):
                found.append(f"{path.relative_to(src)}:{line}: {module} imports {name}")
    return found


def py4j_touches(src: Path = SRC) -> list[tuple[str, str, str]]:
    """``(module, name, where)`` for every py4j import and every access to a py4j handle (an attribute,
    or ``getattr``/``hasattr`` with the name as a constant) in the modules under ``src/blobstate``."""
    found = []
    for module, path in module_names(src).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.Import):
                name = next((a.name for a in node.names if a.name.split(".")[0] == "py4j"), None)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "py4j":
                name = node.module
            elif isinstance(node, ast.Attribute) and node.attr in PY4J_ATTRIBUTES:
                name = node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in PY4J_ATTRIBUTES
            ):
                name = str(node.args[1].value)
            if name is not None:
                found.append((module, name, f"{path.relative_to(src)}:{getattr(node, 'lineno', 0)}"))
    return found


def test_the_task_and_the_batch_contracts_import_no_feature() -> None:
    found = feature_imports()
    assert not found, "the task side names a feature package:\n" + "\n".join(found)


def test_only_the_jvm_seam_touches_py4j() -> None:
    outside = [
        f"{where}: {module} touches {name}"
        for module, name, where in py4j_touches()
        if module not in JVM_SEAM and (module, name) not in KNOWN_PY4J
    ]
    assert not outside, "py4j outside the JVM seam (blobstate.engine.jvm.classic):\n" + "\n".join(outside)


def test_every_known_py4j_touch_still_exists() -> None:
    present = {(module, name) for module, name, _ in py4j_touches()}
    assert present >= KNOWN_PY4J, sorted(KNOWN_PY4J - present)


def test_the_seam_checks_find_py4j_and_a_feature_anywhere_in_a_module(tmp_path: Path) -> None:
    _write(tmp_path, "blobstate.engine.task", "def f():\n    from blobstate.batch import x as standby_x\n")
    _write(tmp_path, "blobstate.batch.steps", "from ..adjunct import spec\n")
    _write(
        tmp_path,
        "blobstate.engine.stage",
        "import py4j.java_gateway\n"
        "def f(spark, df):\n    getattr(spark, '_jsparkSession', None)\n    return df._jdf\n",
    )
    _write(tmp_path, "blobstate.engine.jvm.classic", "from py4j.protocol import Py4JJavaError\n")
    assert [f.split(": ", 1)[1] for f in feature_imports(tmp_path)] == [
        "blobstate.batch.steps imports ..adjunct",
        "blobstate.engine.task imports standby_x",
    ]
    assert sorted((m, n) for m, n, _ in py4j_touches(tmp_path)) == [
        ("blobstate.engine.jvm.classic", "py4j.protocol"),
        ("blobstate.engine.stage", "_jdf"),
        ("blobstate.engine.stage", "_jsparkSession"),
        ("blobstate.engine.stage", "py4j.java_gateway"),
    ]


def test_the_jvm_seam_exists() -> None:
    for module in JVM_SEAM:
        assert (SRC / Path(*module.split("."))).with_suffix(".py").exists(), module
