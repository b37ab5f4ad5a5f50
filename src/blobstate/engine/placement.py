"""The JVM helper's jar (``java/*.java``): the one a wheel ships, or one compiled for the running Spark.

blobstate's JVM helper (docs/DESIGN.md, "Placement and standby") is loaded into the driver of an
already running session and shipped to the executors by the classic JVM seam
(``blobstate.engine.jvm.classic.PlacementHelper``). This module finds its jar: the one prebuilt into the
wheel when it was built for the running Spark's major.minor version (``helper_jar``), else one compiled
against the running Spark's jars (once per source and Spark version, cached under
``~/.cache/blobstate``); without either, ``PlacementUnavailableError`` says why. It imports no py4j.

The helper wraps a DataFrame's RDD in a narrow 1:1 RDD whose partition ``i`` prefers a given executor
(``executor_<host>_<id>``, Spark's ``ExecutorCacheTaskLocation``, the mechanism of Spark's own state
stores); operators applied on top of the result, such as ``mapInArrow``, run in the same stage and
inherit the preference. Each task of that stage also learns its executor
(``blobstate.batch.executor.current_executor()``). Preferences are honoured by Spark's delay
scheduling: a task waits up to ``spark.locality.wait.process`` (default ``spark.locality.wait``, 3s) for
its executor before it may run on another executor of the same host, then ``spark.locality.wait.node``
before any executor.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from blobstate.engine.helper_jar import (
    JAVA_DIR,
    SOURCES_ATTRIBUTE,
    SPARK_VERSION_ATTRIBUTE,
    HelperCompileError,
    compile_jar,
    java_sources,
    major_minor,
    shipped_jar_for,
    sources_digest,
)
from blobstate.errors import ConfigurationError

HELPER_CLASS = "org.apache.spark.sql.blobstate.PreferredLocations"
"""Fully qualified name of the helper class."""

JAR_NAME = "blobstate-placement.jar"
"""File name of the compiled helper inside its cache directory."""


class PlacementUnavailableError(ConfigurationError, RuntimeError):
    """The placement helper cannot be built or loaded for a session; the message says why."""


class SparkConnectUnsupportedError(PlacementUnavailableError):
    """blobstate was given a Spark Connect session: its engine needs the driver's JVM in this process."""


SPARK_CONNECT_MESSAGE = (
    "blobstate does not support Spark Connect: its engine loads a JVM helper into the driver (to place"
    " tasks, keep outputs off the driver and run batches for timers), and a Spark Connect client has no"
    " JVM in its process; run the query with a classic SparkSession (SparkSession.builder.master(...),"
    " without spark.remote or SPARK_REMOTE)"
)


def find_javac() -> str | None:
    """The Java compiler: ``$BLOBSTATE_JAVAC``, else ``$JAVA_HOME/bin/javac``, else ``javac`` on PATH."""
    explicit = os.environ.get("BLOBSTATE_JAVAC")
    if explicit:
        return explicit
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "javac"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("javac")


def default_cache_dir() -> Path:
    """``$BLOBSTATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/blobstate``, else ``~/.cache/blobstate``."""
    explicit = os.environ.get("BLOBSTATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "blobstate"


def jar_path(spark_version: str, *, cache_dir: Path | None = None) -> Path:
    """Where the helper jar for this source and Spark version lives (whether or not it is built yet)."""
    hasher = hashlib.sha256()
    for source in java_sources():
        hasher.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    hasher.update(spark_version.encode())
    digest = hasher.hexdigest()[:20]
    return (cache_dir or default_cache_dir()) / f"placement-{digest}" / JAR_NAME


def build_jar(
    spark_version: str, classpath: str, *, cache_dir: Path | None = None, javac: str | None = None
) -> Path:
    """Compile the helper against ``classpath`` unless a jar for this source and Spark version exists.

    Returns the jar's path. The jar is built in a private temporary directory that is then renamed
    into place, so concurrent first uses (threads or processes) never see a partial jar; the loser of
    a race discards its own build. Raises ``PlacementUnavailableError`` when no compiler is found or
    compilation fails.
    """
    jar = jar_path(spark_version, cache_dir=cache_dir)
    if jar.is_file():
        return jar
    compiler = javac or find_javac()
    if not compiler:
        raise PlacementUnavailableError("no Java compiler found (set JAVA_HOME or BLOBSTATE_JAVAC)")
    jar.parent.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=jar.parent.parent))
    try:
        staged = work / "out"
        staged.mkdir()
        attributes = {SPARK_VERSION_ATTRIBUTE: spark_version, SOURCES_ATTRIBUTE: sources_digest()}
        try:
            compile_jar(java_sources(), classpath, staged / JAR_NAME, compiler, attributes)
        except HelperCompileError as e:
            raise PlacementUnavailableError(str(e)) from e
        try:
            staged.rename(jar.parent)
        except OSError:
            if not jar.is_file():  # not a lost race: a real failure
                raise
        return jar
    finally:
        shutil.rmtree(work, ignore_errors=True)


def helper_jar(
    spark_version: str,
    classpath: str,
    *,
    cache_dir: Path | None = None,
    javac: str | None = None,
    java_dir: Path = JAVA_DIR,
) -> Path:
    """The helper jar for a Spark version: the one shipped in the wheel (in ``java_dir``) when it was
    built for this Spark major.minor, else one compiled for it (``build_jar``, cached). Raises
    ``PlacementUnavailableError`` saying why neither works."""
    shipped, why_not = shipped_jar_for(spark_version, java_dir)
    if shipped is not None:
        return shipped
    try:
        return build_jar(spark_version, classpath, cache_dir=cache_dir, javac=javac)
    except PlacementUnavailableError as e:
        raise PlacementUnavailableError(
            f"{why_not}, and compiling it for Spark {spark_version} failed: {e}. Install a JDK 17+ (javac"
            " on PATH or JAVA_HOME, or BLOBSTATE_JAVAC), or a blobstate wheel built with pyspark"
            f" {'.'.join(map(str, major_minor(spark_version)))} installed"
        ) from e
