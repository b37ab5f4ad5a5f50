"""The JVM helper's jar: compiling it from ``java/*.java``, and the prebuilt one a wheel ships.

Standard library only: ``setup.py`` loads this file by path while building a wheel (blobstate itself is
not importable then) to compile the helper against the pyspark it finds, into
``blobstate/engine/java/blobstate-helper.jar``. The jar's manifest records what it was built for
(:data:`SPARK_VERSION_ATTRIBUTE`, :data:`SOURCES_ATTRIBUTE`); at run time :func:`shipped_jar_for` accepts
it only for a Spark of the same major.minor version and the same helper sources, else the helper is
compiled for the running Spark (``placement.build_jar``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from blobstate.errors import ConfigurationError

JAVA_DIR = Path(__file__).with_name("java")
"""The helper's sources (preferred locations, ticks source, committed outputs), shipped as package data."""

SHIPPED_JAR_NAME = "blobstate-helper.jar"
"""File name of the prebuilt jar inside ``JAVA_DIR`` of a built wheel (absent from a source checkout)."""

JAVA_RELEASE = "17"
"""Bytecode level of the helper (the oldest Java that Spark 4 runs on)."""

SPARK_VERSION_ATTRIBUTE = "Blobstate-Spark-Version"
"""Manifest attribute: the Spark version whose jars the helper was compiled against."""

SOURCES_ATTRIBUTE = "Blobstate-Sources-SHA256"
"""Manifest attribute: :func:`sources_digest` of the sources the jar was compiled from."""

COMPILE_TIMEOUT_SECONDS = 600


class HelperCompileError(ConfigurationError, RuntimeError):
    """The helper could not be compiled (no compiler, or javac failed); the message says why."""


def java_sources(java_dir: Path = JAVA_DIR) -> list[Path]:
    """Every Java source of the helper, in a stable order."""
    return sorted(java_dir.glob("*.java"))


def sources_digest(java_dir: Path = JAVA_DIR) -> str:
    """SHA-256 over the helper sources' names and contents (what a jar must have been built from)."""
    hasher = hashlib.sha256()
    for source in java_sources(java_dir):
        hasher.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return hasher.hexdigest()


def major_minor(version: str) -> tuple[int, ...]:
    """``(4, 1)`` of ``"4.1.0"`` / ``"4.1.0.dev1"``; what must match for the compiled helper to fit."""
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in version.split(".")[:2])  # type: ignore[union-attr]


def compile_jar(
    sources: Sequence[Path], classpath: str, jar: Path, javac: str, attributes: dict[str, str]
) -> None:
    """Compile ``sources`` against ``classpath`` with ``javac`` into ``jar`` (written whole or not at all).

    ``attributes`` go into the jar's manifest. Raises :class:`HelperCompileError` when javac cannot run or
    fails.
    """
    if not _has_spark_connect(classpath):  # a Spark without its Connect server: no plugin to build
        sources = [s for s in sources if s.name != CONNECT_PLUGIN_SOURCE]
    with tempfile.TemporaryDirectory(prefix=".build-", dir=jar.parent) as work_dir:
        work = Path(work_dir)
        classes = work / "classes"
        classes.mkdir()
        # An argument file keeps long cluster class paths off the command line.
        argfile = work / "javac.args"
        args = ("--release", JAVA_RELEASE, "-nowarn", "-cp", expand_classpath(classpath), "-d", str(classes))
        argfile.write_text("\n".join(_quote_arg(a) for a in args) + "\n")
        try:
            result = subprocess.run(
                [javac, f"@{argfile}", *(str(p) for p in sources)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HelperCompileError(f"cannot run Java compiler {javac}: {e}") from e
        if result.returncode != 0:
            where = sources[0].parent if sources else "?"
            raise HelperCompileError(
                f"compiling the helper in {where} with {javac} failed:\n{result.stderr.strip()[-4000:]}"
            )
        staged = work / jar.name
        write_jar(classes, staged, attributes)
        os.replace(staged, jar)


CONNECT_PLUGIN_SOURCE = "ConnectPlugin.java"
"""The Spark Connect server plugin's source, compiled only against a Spark that has the Connect server."""


def _has_spark_connect(classpath: str) -> bool:
    """Whether ``classpath`` holds Spark's Connect server (its ``spark-connect_*.jar``)."""
    return any(
        Path(entry).name.startswith("spark-connect_")
        for entry in expand_classpath(classpath).split(os.pathsep)
    )


def expand_classpath(classpath: str) -> str:
    """Expands ``dir/*`` entries to their jars: javac does not expand wildcards read from a file."""
    entries: list[str] = []
    for entry in classpath.split(os.pathsep):
        if entry.endswith("*") and Path(entry[:-1] or ".").is_dir():
            entries.extend(str(p) for p in sorted(Path(entry[:-1] or ".").glob("*.jar")))
        elif entry:
            entries.append(entry)
    return os.pathsep.join(entries)


def _quote_arg(arg: str) -> str:
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_jar(classes: Path, jar: Path, attributes: dict[str, str] | None = None) -> None:
    """A jar of every class under ``classes``, with ``attributes`` in its manifest."""
    manifest = "Manifest-Version: 1.0\nCreated-By: blobstate\n"
    manifest += "".join(f"{name}: {value}\n" for name, value in (attributes or {}).items())
    with zipfile.ZipFile(jar, "w", compression=zipfile.ZIP_DEFLATED) as out:
        out.writestr("META-INF/MANIFEST.MF", manifest + "\n")
        for path in sorted(classes.rglob("*.class")):
            out.write(path, path.relative_to(classes).as_posix())


def manifest_attributes(jar: Path) -> dict[str, str]:
    """The main attributes of ``jar``'s manifest (empty when it has none or is unreadable)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            text = archive.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return {}
    attributes = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            attributes[name] = value
    return attributes


def shipped_jar(java_dir: Path = JAVA_DIR) -> Path | None:
    """The prebuilt jar installed with the package, or None (a source checkout, or a wheel built without
    pyspark)."""
    jar = java_dir / SHIPPED_JAR_NAME
    return jar if jar.is_file() else None


def shipped_jar_for(spark_version: str, java_dir: Path = JAVA_DIR) -> tuple[Path | None, str]:
    """``(the shipped jar, "")`` when it fits ``spark_version``, else ``(None, why not)``.

    It fits when it was built against the same Spark major.minor version from the installed sources.
    """
    jar = shipped_jar(java_dir)
    if jar is None:
        return None, "this blobstate installation ships no prebuilt helper jar (built without pyspark)"
    attributes = manifest_attributes(jar)
    built_for = attributes.get(SPARK_VERSION_ATTRIBUTE, "")
    if not built_for or major_minor(built_for) != major_minor(spark_version):
        return (
            None,
            f"the shipped helper jar {jar} was built for Spark {built_for or '?'}, not {spark_version}",
        )
    if attributes.get(SOURCES_ATTRIBUTE) != sources_digest(java_dir):
        return None, f"the shipped helper jar {jar} was built from other sources than {java_dir}"
    return jar, ""


def build_shipped_jar(
    java_dir: Path, out_dir: Path, spark_jars: Path, spark_version: str, javac: str
) -> Path:
    """Compile the helper for a wheel: ``out_dir/blobstate-helper.jar`` against ``spark_jars/*``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jar = out_dir / SHIPPED_JAR_NAME
    attributes = {SPARK_VERSION_ATTRIBUTE: spark_version, SOURCES_ATTRIBUTE: sources_digest(java_dir)}
    compile_jar(java_sources(java_dir), str(spark_jars / "*"), jar, javac, attributes)
    return jar
