"""Preferred executor locations for the processing stage (DESIGN.md, "Placement and standby").

Spark places tasks without regard to where blobstate's Python-side state lives. This module compiles
``java/PreferredLocations.java`` against the running Spark's jars (once per source and Spark version,
cached under ``~/.cache/blobstate``), loads it into the driver of an already running session and ships
it to the executors. The helper wraps a DataFrame's RDD in a narrow 1:1 RDD whose partition ``i``
prefers a given executor (``executor_<host>_<id>``, Spark's ``ExecutorCacheTaskLocation``, the
mechanism of Spark's own state stores); operators applied on top of the result, such as
``mapInArrow``, run in the same stage and inherit the preference. Each task of that stage also learns
its executor (``executor_identity.current_executor()``).

Without a JDK, when compilation or loading fails, or on Spark Connect, ``PlacementHelper.get`` returns
None after logging one warning: tasks then go wherever Spark puts them, and state stays correct.
Preferences are honoured by Spark's delay scheduling: a task waits up to ``spark.locality.wait.process``
(default ``spark.locality.wait``, 3s) for its executor before it may run on another executor of the
same host, then ``spark.locality.wait.node`` before any executor.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobstate.engine.executor_identity import ExecutorIdentity
from blobstate.errors import BlobstateError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

JAVA_DIR = Path(__file__).with_name("java")
"""The helper's sources (preferred locations, ticks source, committed outputs), shipped as package data."""


def java_sources() -> list[Path]:
    """Every Java source of the helper, in a stable order."""
    return sorted(JAVA_DIR.glob("*.java"))


HELPER_CLASS = "org.apache.spark.sql.blobstate.PreferredLocations"
"""Fully qualified name of the helper class."""

JAR_NAME = "blobstate-placement.jar"
"""File name of the compiled helper inside its cache directory."""

JAVA_RELEASE = "17"
"""Bytecode level of the helper (the oldest Java that Spark 4 runs on)."""

COMPILE_TIMEOUT_SECONDS = 600


class PlacementUnavailableError(BlobstateError, RuntimeError):
    """The placement helper cannot be built or loaded for a session; the message says why."""


def location_string(identity: ExecutorIdentity) -> str:
    """Spark's preferred-location string for an executor: ``executor_<host>_<executor id>``."""
    if "_" in identity.host:
        # Spark's TaskLocation parser splits host and executor id at the first "_".
        raise ValueError(f"executor host {identity.host!r} contains '_' and cannot be a preferred location")
    return f"executor_{identity.host}_{identity.executor_id}"


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
        classes = work / "classes"
        staged = work / "out"
        classes.mkdir()
        staged.mkdir()
        # An argument file keeps long cluster class paths off the command line.
        argfile = work / "javac.args"
        argfile.write_text(
            "\n".join(
                _quote_arg(a)
                for a in (
                    "--release",
                    JAVA_RELEASE,
                    "-nowarn",
                    "-cp",
                    _expand_classpath(classpath),
                    "-d",
                    str(classes),
                )
            )
            + "\n"
        )
        try:
            result = subprocess.run(
                [compiler, f"@{argfile}", *(str(p) for p in java_sources())],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlacementUnavailableError(f"cannot run Java compiler {compiler}: {e}") from e
        if result.returncode != 0:
            raise PlacementUnavailableError(
                f"compiling the helper in {JAVA_DIR} with {compiler} failed:\n{result.stderr.strip()[-4000:]}"
            )
        _write_jar(classes, staged / JAR_NAME)
        try:
            staged.rename(jar.parent)
        except OSError:
            if not jar.is_file():  # not a lost race: a real failure
                raise
        return jar
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _expand_classpath(classpath: str) -> str:
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


def _write_jar(classes: Path, jar: Path) -> None:
    with zipfile.ZipFile(jar, "w", compression=zipfile.ZIP_DEFLATED) as out:
        out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: blobstate\n\n")
        for path in sorted(classes.rglob("*.class")):
            out.write(path, path.relative_to(classes).as_posix())


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
        JDK, compilation or loading failed, Spark Connect); callers then run with Spark's default
        placement.
        """
        owner = spark.sparkContext if _is_classic(spark) else spark
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
            raise PlacementUnavailableError("Spark Connect sessions cannot load JVM helpers")
        jvm = spark._jvm
        classpath = jvm.java.lang.System.getProperty("java.class.path")
        jar = build_jar(spark.version, classpath, cache_dir=cache_dir, javac=javac)
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
        gateway = self._spark.sparkContext._gateway
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

    def committed_outputs(self) -> Any:
        """The py4j class ``CommittedOutputs`` (the sink's checked view of a persisted stage)."""
        self._helper_class()
        return self._spark._jvm.org.apache.spark.sql.blobstate.CommittedOutputs

    def ticks_source(self) -> Any:
        """The py4j class ``TicksSource`` (batches without input; metrics in Spark's progress)."""
        self._helper_class()
        return self._spark._jvm.org.apache.spark.sql.blobstate.TicksSource

    def _helper_class(self) -> Any:
        """The helper's py4j class, adding the jar to this JVM thread's class loader when needed."""
        from py4j.java_gateway import JavaClass

        jvm = self._spark._jvm
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
