"""Preferred executor locations for the processing stage (docs/DESIGN.md, "Placement and standby").

Spark places tasks without regard to where blobstate's Python-side state lives. This module loads the
JVM helper (``java/*.java``) into the driver of an already running session and ships it to the
executors: the jar prebuilt into the wheel when it was built for the running Spark's major.minor
version (``helper_jar``), else one compiled against the running Spark's jars (once per source and Spark
version, cached under ``~/.cache/blobstate``). The helper wraps a DataFrame's RDD in a narrow 1:1 RDD
whose partition ``i`` prefers a given executor (``executor_<host>_<id>``, Spark's
``ExecutorCacheTaskLocation``, the mechanism of Spark's own state stores); operators applied on top of
the result, such as ``mapInArrow``, run in the same stage and inherit the preference. Each task of that
stage also learns its executor (``blobstate.batch.executor.current_executor()``).

Without a fitting shipped jar and a JDK, or when compilation or loading fails, ``PlacementHelper.get``
returns None after logging one warning (the query then refuses to start, naming why); a Spark Connect
session is one ``SparkConnectUnsupportedError``.
Preferences are honoured by Spark's delay scheduling: a task waits up to ``spark.locality.wait.process``
(default ``spark.locality.wait``, 3s) for its executor before it may run on another executor of the
same host, then ``spark.locality.wait.node`` before any executor.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobstate.batch.executor import ExecutorIdentity
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

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


# One entry per SparkContext (or Spark Connect session) and toolchain settings, failures included, so
# an unavailable helper is reported exactly once.
_HELPERS: weakref.WeakKeyDictionary[Any, dict[tuple[str | None, Path], PlacementHelper | None]] = (
    weakref.WeakKeyDictionary()
)
_HELPERS_LOCK = threading.Lock()


class PlacementHelper:
    """The loaded JVM helper of one SparkContext: preferred locations and the live executors."""

    def __init__(self, spark: SparkSession, jar: Path) -> None:
        """Use ``PlacementHelper.get`` or ``PlacementHelper.load``; this assumes the jar is loaded."""
        self._spark = spark
        self._jar = jar

    @property
    def jar(self) -> Path:
        """The helper jar loaded into this session."""
        return self._jar

    @classmethod
    def get(cls, spark: SparkSession) -> PlacementHelper | None:
        """The helper for ``spark``'s SparkContext, built and loaded on first use.

        Returns None, after logging one warning per SparkContext, when placement is unavailable (no
        shipped jar for this Spark and no JDK, compilation or loading failed). Raises
        ``SparkConnectUnsupportedError`` for a Spark Connect session: one error naming the limitation.
        """
        if not _is_classic(spark):
            raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
        owner = spark.sparkContext
        settings = (find_javac(), default_cache_dir())
        with _HELPERS_LOCK:
            per_owner = _HELPERS.setdefault(owner, {})
            if settings in per_owner:
                return per_owner[settings]
            try:
                helper: PlacementHelper | None = cls.load(spark, javac=settings[0], cache_dir=settings[1])
            except PlacementUnavailableError as e:
                logger.warning(
                    "blobstate executor placement is unavailable, tasks will run where Spark puts them "
                    "(state stays correct, but may be restored on other executors): %s",
                    e,
                )
                helper = None
            per_owner[settings] = helper
            return helper

    @classmethod
    def load(
        cls, spark: SparkSession, *, javac: str | None = None, cache_dir: Path | None = None
    ) -> PlacementHelper:
        """Build (if needed) and load the helper into ``spark``; raises ``PlacementUnavailableError``."""
        if not _is_classic(spark):
            raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
        jvm = _jvm_of(spark)
        classpath = jvm.java.lang.System.getProperty("java.class.path")
        jar = helper_jar(spark.version, classpath, cache_dir=cache_dir, javac=javac)
        helper = cls(spark, jar)
        helper._helper_class()  # loads it into the driver, or raises
        try:
            # Executors fetch the jar from the driver and load it before deserializing tasks.
            spark.sparkContext._jsc.addJar(str(jar))
        except Exception as e:
            raise PlacementUnavailableError(f"cannot ship {jar} to the executors: {e}") from e
        return helper

    def with_preferred_locations(self, df: DataFrame, locations: Sequence[str | None]) -> DataFrame:
        """``df`` with the same rows in the same partitions, partition ``i`` preferring ``locations[i]``.

        ``locations`` has one entry per partition of ``df``: a location string (``location_string``),
        several joined by commas (candidates in order: the first executor alive when the stage is
        submitted is preferred, so a stage resubmitted after an executor loss goes to the next one),
        or None for no preference. Operators applied to the result without a shuffle (``mapInArrow``)
        run in the same stage, on the preferred executors, and their tasks can read their executor
        with ``current_executor()``. With adaptive query execution, the shuffle below ``df`` runs
        now, once; actions on the result reuse its output.
        """
        from pyspark.sql import DataFrame

        values = list(locations)
        for i, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"preferred location {i} must be a str or None, not {type(value).__name__}")
        jdf = self._helper_class().withPreferredLocations(df._jdf, self._string_array(values))
        return DataFrame(jdf, df.sparkSession)

    def committed_only(
        self, stage: DataFrame, uid_column: str, meta_column: str, uids: Sequence[str], what: str
    ) -> DataFrame:
        """The output rows of the persisted ``stage`` (``CommittedOutputs.committedOnly``): a task fails
        instead of passing on partition ``i`` when its header row does not carry ``uids[i]``."""
        from pyspark.sql import DataFrame

        jdf = self.committed_outputs().committedOnly(
            stage._jdf, uid_column, meta_column, self._string_array(uids), what
        )
        return DataFrame(jdf, stage.sparkSession)

    def _string_array(self, values: Sequence[str | None]) -> Any:
        """A Java ``String[]`` holding ``values`` (None stays null)."""
        gateway: Any = self._spark.sparkContext._gateway
        array = gateway.new_array(gateway.jvm.java.lang.String, len(values))
        for i, value in enumerate(values):
            if value is not None:
                array[i] = value
        return array

    def executors(self) -> list[ExecutorIdentity]:
        """The executors alive now, by executor id; in local mode the single executor ``"driver"``."""
        local = self._spark.sparkContext._jsc.sc().isLocal()
        found = []
        for entry in self._helper_class().blockManagers():
            executor_id, _, host = entry.partition("\t")
            if executor_id != "driver" or local:
                found.append(ExecutorIdentity(executor_id, host))
        return sorted(found, key=lambda e: (not e.executor_id.isdigit(), _int_or_zero(e.executor_id), e))

    def write_through(self) -> Any:
        """The py4j class ``WriteThrough`` (a stage's outputs to a writer, its metadata to an accumulator)."""
        self._helper_class()
        return _jvm_of(self._spark).org.apache.spark.sql.blobstate.WriteThrough

    def committed_outputs(self) -> Any:
        """The py4j class ``CommittedOutputs`` (the sink's checked view of a persisted stage)."""
        self._helper_class()
        return _jvm_of(self._spark).org.apache.spark.sql.blobstate.CommittedOutputs

    def ticks_source(self) -> Any:
        """The py4j class ``TicksSource`` (batches without input; metrics in Spark's progress)."""
        self._helper_class()
        return _jvm_of(self._spark).org.apache.spark.sql.blobstate.TicksSource

    def query_metrics(self) -> Any:
        """The py4j class ``QueryMetrics`` (a query's figures in Spark's metrics system)."""
        self._helper_class()
        return _jvm_of(self._spark).org.apache.spark.sql.blobstate.QueryMetrics

    def _helper_class(self) -> Any:
        """The helper's py4j class, adding the jar to this JVM thread's class loader when needed."""
        from py4j.java_gateway import JavaClass

        jvm = _jvm_of(self._spark)
        found = jvm.org.apache.spark.sql.blobstate.PreferredLocations
        if isinstance(found, JavaClass):
            return found
        try:
            loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
            loader.addURL(jvm.java.io.File(str(self._jar)).toURI().toURL())
        except Exception as e:
            raise PlacementUnavailableError(
                f"cannot add {self._jar} to the driver's class loader: {e}"
            ) from e
        found = jvm.org.apache.spark.sql.blobstate.PreferredLocations
        if not isinstance(found, JavaClass):
            raise PlacementUnavailableError(f"{HELPER_CLASS} is not visible after loading {self._jar}")
        return found


def _is_classic(spark: SparkSession) -> bool:
    return getattr(spark, "_jsparkSession", None) is not None


def _int_or_zero(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _jvm_of(spark: SparkSession) -> Any:
    """The py4j view of ``spark``'s JVM (classic Spark only; Spark Connect has none)."""
    jvm = spark._jvm
    if jvm is None:
        raise SparkConnectUnsupportedError(SPARK_CONNECT_MESSAGE)
    return jvm
