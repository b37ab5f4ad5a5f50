"""``Any`` in the public signatures of the type-checked packages only ever goes down.

mypy (``.ci/run``, settings in pyproject.toml) checks that every signature is annotated and that no
``Any`` leaks out of a function through an unannotated value (``warn_return_any``, ``disallow_any_generics``
...), but an explicit ``Any`` is a promise mypy cannot check. Some are honest: a state value is a row
of whatever the user's schema says (PySpark's own state API types it ``Tuple``), a processor is user code.
This test counts the annotations of public functions, methods and constructors that are ``Any`` or
contain it (directly or through a module-level alias such as ``StateRow``), per module, and fails when a
module has more than :data:`BUDGET` allows, naming each one. Lower a module's budget when its count drops.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("state", "processor", "encoding")

BUDGET: dict[str, int] = {
    "blobstate.encoding.codec": 2,
    "blobstate.encoding.values": 17,
    "blobstate.processor.api": 19,
    "blobstate.processor.arrow_api": 19,
    "blobstate.processor.arrow_runner": 2,
    "blobstate.processor.columnar": 2,
    "blobstate.processor.evolution": 6,
    "blobstate.processor.output": 2,
    "blobstate.processor.rows": 2,
    "blobstate.processor.runner": 2,
    "blobstate.processor.schema": 1,
    "blobstate.state.loader": 4,
    "blobstate.state.partition": 1,
    "blobstate.state.uploads": 2,
}
"""The most ``Any`` annotations each module's public signatures may have (modules not listed: none)."""


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _names(ast.parse(node.value, mode="eval"))
        except SyntaxError:
            return set()
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub is not node:
            found |= _names(sub)
    return found


def _modules(src: Path) -> dict[str, ast.Module]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((src / "blobstate" / package).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return modules


def any_aliases(modules: dict[str, ast.Module]) -> set[str]:
    """Module-level names defined as a type containing ``Any`` (``StateRow = tuple[Any, ...]``)."""
    aliases = {"Any"}
    for tree in modules.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and "Any" in _names(value) and not isinstance(value, ast.Call):
                aliases.add(target.id)
    return aliases


def _public_functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    not item.name.startswith("_") or item.name == "__init__"
                ):
                    found.append((f"{node.name}.{item.name}", item))
    return found


def public_any(src: Path = SRC) -> dict[str, list[str]]:
    """Per module, each public signature's annotation that is or contains ``Any``."""
    modules = _modules(src)
    aliases = any_aliases(modules)
    out: dict[str, list[str]] = {}
    for module, tree in modules.items():
        for name, fn in _public_functions(tree):
            args = fn.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            params += [a for a in (args.vararg, args.kwarg) if a is not None]
            annotated = [(p.arg, p.annotation) for p in params if p.annotation is not None]
            if fn.returns is not None:
                annotated.append(("return", fn.returns))
            for what, annotation in annotated:
                if _names(annotation) & aliases:
                    out.setdefault(module, []).append(
                        f"{module}.{name} {what}: {ast.unparse(annotation)} (line {fn.lineno})"
                    )
    return out


def test_public_signatures_have_no_more_any_than_their_budget() -> None:
    over = {module: found for module, found in public_any().items() if len(found) > BUDGET.get(module, 0)}
    assert not over, "\n".join(
        f"{module}: {len(found)} Any in public signatures, budget {BUDGET.get(module, 0)}:\n  "
        + "\n  ".join(found)
        for module, found in over.items()
    )


def test_the_count_sees_any_directly_through_an_alias_and_in_a_string(tmp_path: Path) -> None:
    package = tmp_path / "blobstate" / "state"
    package.mkdir(parents=True)
    (package / "m.py").write_text(
        "from typing import Any\n"
        "Row = tuple[Any, ...]\n"
        "def f(a: int, b: Any) -> Row: ...\n"
        "def _private(a: Any) -> Any: ...\n"
        "class C:\n"
        "    def __init__(self, x: 'dict[str, Any]') -> None: ...\n"
        "    def _hidden(self, y: Any) -> None: ...\n"
        "class _P:\n"
        "    def shown(self, z: Any) -> None: ...\n"
    )
    assert public_any(tmp_path) == {
        "blobstate.state.m": [
            "blobstate.state.m.f b: Any (line 3)",
            "blobstate.state.m.f return: Row (line 3)",
            "blobstate.state.m.C.__init__ x: 'dict[str, Any]' (line 6)",
        ]
    }
