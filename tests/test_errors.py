"""The public names of ``blobstate`` and its exception tree: every error class sits on exactly one branch
of ``BlobstateError``, and the tree drawn in ``blobstate.errors``'s docstring is the tree of the code."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import blobstate
from blobstate.errors import (
    BRANCHES,
    ArgumentTypeError,
    BlobstateError,
    ConfigurationError,
    CorruptionError,
    StateError,
)

PUBLIC_NAMES = [
    "transform_with_state",
    "batch_reports",
    "QueryConfig",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "ValueState",
    "ListState",
    "MapState",
    "TimerValues",
    "ExpiredTimerInfo",
    "ArrowStatefulProcessor",
    "ArrowHandle",
    "KeyedBatch",
    "ExpiredTimers",
    "WriterSink",
    "Adjunct",
    "read_state",
    "register_reader",
    "read_moved_state",
    "last_watermark_ms",
    "BlobstateError",
    "BlobStoreError",
    "StateError",
    "CorruptionError",
    "ConfigurationError",
    "QueryError",
    "ProcessorError",
    "BlobstateQueryError",
    "ProcessorQueryError",
    "progress_metrics",
    "__version__",
]

ROOT = Path(__file__).resolve().parents[1]
TREE_LINE = re.compile(
    r"^(?P<indent> *)\* (?P<name>\w+) \[(?P<module>[\w.]+)(?:; also (?P<also>[\w, ]+))?\]$"
)


def test_the_public_names_of_blobstate_are_these_and_all_resolve() -> None:
    assert blobstate.__all__ == PUBLIC_NAMES
    for name in PUBLIC_NAMES:
        assert getattr(blobstate, name) is not None, name
    for branch in BRANCHES:
        assert getattr(blobstate, branch.__name__) is branch
    assert blobstate.CorruptionError is CorruptionError


def error_classes() -> dict[str, type[BaseException]]:
    """Every public exception class defined in the package, by name (each module imported)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(blobstate.__path__, "blobstate."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if not (inspect.isclass(obj) and issubclass(obj, BaseException)) or obj.__module__ != info.name:
                continue
            if name.startswith("_") or issubclass(obj, Warning):
                continue  # control flow inside one module, or a warning: not part of the tree
            assert name not in found, f"two exception classes named {name}: {found[name]} and {obj}"
            found[name] = obj
    return found


def test_every_error_class_descends_from_exactly_one_branch_of_blobstate_error() -> None:
    classes = error_classes()
    assert len(classes) > 60  # the walk found the package's modules
    outside = [name for name, cls in classes.items() if not issubclass(cls, BlobstateError)]
    assert outside == []
    assert [
        cls for cls in BlobstateError.__subclasses__() if cls.__module__.startswith("blobstate.")
    ] == list(BRANCHES)
    for name, cls in classes.items():
        if cls is BlobstateError or cls in BRANCHES:
            continue
        branches = [branch.__name__ for branch in BRANCHES if issubclass(cls, branch)]
        assert len(branches) == 1, f"{name} descends from {branches}"


def drawn_tree() -> dict[str, tuple[str | None, str, set[str]]]:
    """The docstring's tree: each class's drawn parent, module and other bases, by name."""
    doc = importlib.import_module("blobstate.errors").__doc__ or ""
    drawn: dict[str, tuple[str | None, str, set[str]]] = {}
    parents: list[str] = []
    for line in doc.splitlines():
        if not line.lstrip().startswith("* "):
            continue
        match = TREE_LINE.match(line)
        assert match, f"a tree line that does not read as '* Name [module; also Base]': {line!r}"
        depth = len(match["indent"]) // 2
        assert len(match["indent"]) % 2 == 0 and depth <= len(parents), f"bad indentation: {line!r}"
        del parents[depth:]
        name = match["name"]
        assert name not in drawn, f"{name} is drawn twice"
        also = {part.strip() for part in (match["also"] or "").split(",") if part.strip()}
        drawn[name] = (parents[-1] if parents else None, match["module"], also)
        parents.append(name)
    return drawn


def test_the_docstring_draws_every_error_class_with_its_module_and_bases() -> None:
    classes = error_classes()
    drawn = drawn_tree()
    assert sorted(drawn) == sorted(classes)
    for name, (parent, module, also) in drawn.items():
        cls = classes[name]
        assert cls.__module__ == f"blobstate.{module}", f"{name} is defined in {cls.__module__}"
        bases = {base.__name__ for base in cls.__bases__}
        if parent is None:
            assert cls is BlobstateError and bases == {"Exception"}
            continue
        assert parent in bases, f"{name} is drawn under {parent}, but its bases are {sorted(bases)}"
        assert bases == {parent} | also, f"{name}: drawn with {sorted({parent} | also)}, is {sorted(bases)}"


def test_every_corruption_read_from_storage_is_a_corruption_error_and_keeps_its_old_bases() -> None:
    from blobstate.adjunct.deferred import DeferredRowsError
    from blobstate.encoding.codec import decode_key
    from blobstate.encoding.values import ValueFormatError
    from blobstate.lineage.commitlog import CommitLogError, CommitLogFormatError
    from blobstate.lineage.delta import DeltaFormatError
    from blobstate.snapshot.heads import HeadFormatError, HeadLogError
    from blobstate.snapshot.index import SnapshotCorruptError, SnapshotError, SnapshotFormatError
    from blobstate.state.errors import CorruptObjectError, StateLoadError
    from blobstate.stored_schema import StoredSchemaError

    for cls, old in [
        (CorruptObjectError, StateLoadError),
        (DeltaFormatError, ValueError),
        (CommitLogFormatError, CommitLogError),
        (SnapshotFormatError, SnapshotError),
        (SnapshotCorruptError, SnapshotError),
        (HeadFormatError, HeadLogError),
        (ValueFormatError, ValueError),
        (StoredSchemaError, ValueError),
        (DeferredRowsError, ValueError),
    ]:
        assert issubclass(cls, CorruptionError) and issubclass(cls, old), cls
    assert issubclass(CorruptionError, StateError)
    # Key bytes that do not decode were a plain ValueError
    with pytest.raises(CorruptionError, match="corrupt key bytes: unknown tag 0x7f at offset 0") as caught:
        decode_key(b"\x7f", 1)
    assert isinstance(caught.value, ValueError)


def test_the_helper_compiler_error_is_a_configuration_error_even_when_setup_py_builds_the_jar(
    tmp_path: Path,
) -> None:
    from blobstate.engine.helper_jar import HelperCompileError

    assert issubclass(HelperCompileError, ConfigurationError) and issubclass(HelperCompileError, RuntimeError)
    # A wheel build loads helper_jar.py by path, in an environment without blobstate installed: run
    # setup.py's loader in a Python with no site-packages and no PYTHONPATH.
    setup_py = ROOT / "setup.py"
    (loader,) = [
        node
        for node in ast.parse(setup_py.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "_helper_jar_module"
    ]
    code = "\n".join(
        [
            "import importlib.util, sys",
            "from pathlib import Path",
            "HERE = Path(sys.argv[1])",
            "JAVA_DIR = HERE / 'src' / 'blobstate' / 'engine' / 'java'",
            ast.unparse(loader),
            "print(' '.join(c.__name__ for c in _helper_jar_module().HelperCompileError.__mro__))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-S", "-E", "-c", code, str(ROOT)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "HelperCompileError",
        "ConfigurationError",
        "BlobstateError",
        "RuntimeError",
        "Exception",
        "BaseException",
        "object",
    ]


@pytest.mark.spark
def test_transform_with_state_refuses_bad_arguments_with_configuration_errors(
    spark: Any, tmp_path: Path
) -> None:
    from blobstate import StatefulProcessor, transform_with_state

    class Nothing(StatefulProcessor):
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            return iter(())

    stream = spark.readStream.format("rate").load()
    good: dict[str, Any] = {
        "key": "value",
        "processor": Nothing(),
        "output_schema": "value LONG",
        "checkpoint": str(tmp_path / "ckpt"),
        "sink": lambda df, batch_id: None,
    }
    cases: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
        (spark.range(1), {}, ValueError, r"needs a streaming DataFrame"),
        (stream, {"num_partitions": 0}, ValueError, r"num_partitions must be a positive integer, not 0"),
        (stream, {"key": "nope"}, ValueError, r"key column\(s\) \['nope'\] not in the input columns"),
        (stream, {"output_schema": "bigint"}, ValueError, r"output_schema must describe a struct"),
        (stream, {"processor": object()}, TypeError, r"processor must be a blobstate\.StatefulProcessor"),
        (stream, {"api": "arrow"}, TypeError, r"api='arrow' needs an ArrowStatefulProcessor"),
    ]
    for df, bad, builtin, message in cases:
        with pytest.raises(ConfigurationError, match=message) as caught:
            transform_with_state(df, **{**good, **bad})
        assert isinstance(caught.value, builtin), caught.value
        assert "\n" not in str(caught.value)
        if builtin is TypeError:
            assert isinstance(caught.value, ArgumentTypeError)
    assert not (tmp_path / "ckpt").exists()  # refused before anything was written
