"""Build hook: ship the JVM helper prebuilt in the wheel (``blobstate/engine/java/blobstate-helper.jar``).

Everything else is declared in pyproject.toml. When a wheel is built (``pip wheel .``, ``python -m build``)
and pyspark is importable in the build environment (``--no-build-isolation``, or pyspark listed in the
build requirements) and a javac is found, the helper is compiled against that pyspark's jars and its
Spark version recorded in the jar's manifest; otherwise the wheel has no jar and blobstate compiles the
helper at first use, as from a source checkout. ``BLOBSTATE_BUILD_JAR=0`` skips the jar,
``BLOBSTATE_BUILD_JAR=1`` makes a missing pyspark or javac a build error (for release builds).
Editable installs never build it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
JAVA_DIR = HERE / "src" / "blobstate" / "engine" / "java"


def _helper_jar_module():
    """``blobstate.engine.helper_jar`` loaded by path (blobstate's dependencies may be absent here).

    It imports only ``blobstate.errors``, which imports nothing, so this checkout's ``src`` goes first on
    the path while it loads: the build environment need not have blobstate installed."""
    spec = importlib.util.spec_from_file_location("_blobstate_helper_jar", JAVA_DIR.parent / "helper_jar.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclass-free, but keep the module findable while it runs
    sys.path.insert(0, str(HERE / "src"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HERE / "src"))
    return module


def _find_javac() -> str | None:
    explicit = os.environ.get("BLOBSTATE_JAVAC")
    if explicit:
        return explicit
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").is_file():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


class BuildPyWithHelperJar(build_py):
    """``build_py`` that also compiles the helper jar into the build tree when it can."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        # A jar left in the build tree by an earlier build must not reach a wheel built without one.
        (Path(self.build_lib) / "blobstate" / "engine" / "java" / "blobstate-helper.jar").unlink(
            missing_ok=True
        )
        wanted = os.environ.get("BLOBSTATE_BUILD_JAR", "auto").lower()
        if wanted in ("0", "false", "no"):
            return
        why_not = self._build_jar()
        if why_not:
            if wanted in ("1", "true", "yes"):
                raise SystemExit(f"BLOBSTATE_BUILD_JAR={wanted}: cannot build the helper jar: {why_not}")
            print(f"blobstate: wheel without the prebuilt helper jar ({why_not}); it compiles at first use")

    def _build_jar(self) -> str:
        """Build the jar into ``build_lib``; the reason it was not built, or empty."""
        try:
            import pyspark
        except ImportError:
            return "pyspark is not importable in the build environment"
        spark_jars = Path(pyspark.__file__).parent / "jars"
        if not spark_jars.is_dir():
            return f"pyspark at {Path(pyspark.__file__).parent} has no jars/ directory"
        javac = _find_javac()
        if not javac:
            return "no javac found (JAVA_HOME, PATH or BLOBSTATE_JAVAC)"
        helper_jar = _helper_jar_module()
        out_dir = Path(self.build_lib) / "blobstate" / "engine" / "java"
        try:
            jar = helper_jar.build_shipped_jar(JAVA_DIR, out_dir, spark_jars, pyspark.__version__, javac)
        except helper_jar.HelperCompileError as error:
            return str(error)
        print(f"blobstate: built {jar} against pyspark {pyspark.__version__}")
        return ""


setup(cmdclass={"build_py": BuildPyWithHelperJar})
