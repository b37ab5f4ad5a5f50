"""No module of blobstate can turn stored bytes into code: no pickle, marshal or shelve, no eval or exec.

A syntax-tree scan of every module under src/blobstate (not only the processor: a blob store or a
local state file can reach any reader), so a new import or call fails here rather than in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import blobstate

SRC = Path(blobstate.__file__).parent
FORBIDDEN_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "cloudpickle",
    "dill",
    "marshal",
    "shelve",
    "jsonpickle",
    "joblib",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_ATTRIBUTES = {"read_pickle", "unsafe_load", "full_load"}  # pandas, PyYAML
SCHEMA_PARSERS = {"fromJson", "_parse_datatype_json_value", "_parse_datatype_json_string"}
"""PySpark's parsers of JSON schemas import the module a user-defined type names: a schema read from
storage goes through :mod:`blobstate.stored_schema` instead."""
SCHEMA_PARSERS_ALLOWED = {
    # the live query's own schemas (an adjunct's value schema, a side stream's user-given schema),
    # never read from storage
    "adjunct/spec.py",
    "adjunct/history.py",
}


def offences(path: Path) -> list[str]:
    """What in one module could run code from data, as ``file:line what``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{where} from {node.module} import")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                found.append(f"{where} {func.id}()")
            if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_ATTRIBUTES:
                found.append(f"{where} .{func.attr}()")
            called = func.attr if isinstance(func, ast.Attribute) else _name(func)
            if called in SCHEMA_PARSERS and _relative(path) not in SCHEMA_PARSERS_ALLOWED:
                found.append(f"{where} {called}()")
            if isinstance(func, ast.Attribute) and func.attr == "load" and _name(func.value) == "yaml":
                found.append(f"{where} yaml.load()")
            for arg in node.args:  # importlib.import_module("pickle") and the like
                if isinstance(arg, ast.Constant) and arg.value in FORBIDDEN_MODULES:
                    found.append(f"{where} {arg.value!r} as an argument")
            for kw in node.keywords:
                if kw.arg == "allow_pickle" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{where} allow_pickle=")
    return found


def _relative(path: Path) -> str:
    return path.relative_to(SRC).as_posix() if path.is_relative_to(SRC) else path.name


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def test_no_module_can_unpickle_or_evaluate_stored_data() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 20 and SRC / "processor" / "api.py" in modules
    found = [o for m in modules for o in offences(m)]
    assert found == []


def test_the_scan_catches_what_it_looks_for(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import pickle\nfrom marshal import loads\nimport importlib\nimportlib.import_module('shelve')\n"
        "eval('1')\nexec('x = 1')\nimport numpy as np\nnp.load('f', allow_pickle=True)\n"
        "import pandas as pd\npd.read_pickle('f')\nimport json\njson.loads('1')\n"
        "from pyspark.sql.types import StructType, _parse_datatype_json_string\nStructType.fromJson({})\n"
        "_parse_datatype_json_string('{}')\n"
    )
    assert sorted(o.split(" ", 1)[1] for o in offences(probe)) == sorted(
        [
            "import pickle",
            "from marshal import",
            "'shelve' as an argument",
            "eval()",
            "exec()",
            "allow_pickle=",
            ".read_pickle()",
            "fromJson()",
            "_parse_datatype_json_string()",
        ]
    )
