"""The JVM helper shipped prebuilt in the wheel: built with the package, preferred at run time when it fits.

The wheel is built for real (``pip wheel --no-deps --no-build-isolation`` of a copy of this checkout, so
the build sees this venv's pyspark and javac); the loading test runs a local SparkSession in a subprocess
from the unpacked wheel with a "javac" that only records that it was called.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from blobstate.engine import helper_jar
from blobstate.engine.helper_jar import (
    SHIPPED_JAR_NAME,
    SOURCES_ATTRIBUTE,
    SPARK_VERSION_ATTRIBUTE,
    manifest_attributes,
    shipped_jar_for,
    sources_digest,
    write_jar,
)
from blobstate.engine.jvm.classic import PlacementHelper
from blobstate.engine.placement import (
    HELPER_CLASS,
    PlacementUnavailableError,
    SparkConnectUnsupportedError,
)
from blobstate.engine.placement import (
    helper_jar as resolve_helper_jar,
)

REPO = Path(__file__).resolve().parents[2]
WHEEL_JAR = f"blobstate/engine/java/{SHIPPED_JAR_NAME}"


def _build_wheel(out: Path, **env: str) -> Path:
    """Build a wheel of a copy of this checkout (the checkout's own build/ stays untouched)."""
    source = out / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("blobstate-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built with this venv's pyspark and javac."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_ships_a_jar_built_for_the_build_environments_spark(wheel: Path, tmp_path: Path) -> None:
    import pyspark

    with zipfile.ZipFile(wheel) as archive:
        assert WHEEL_JAR in archive.namelist()
        archive.extract(WHEEL_JAR, tmp_path)
    jar = tmp_path / WHEEL_JAR
    attributes = manifest_attributes(jar)
    assert attributes[SPARK_VERSION_ATTRIBUTE] == pyspark.__version__
    assert attributes[SOURCES_ATTRIBUTE] == sources_digest()
    with zipfile.ZipFile(jar) as classes:
        assert HELPER_CLASS.replace(".", "/") + ".class" in classes.namelist()


def test_a_wheel_built_without_a_compiler_has_no_jar(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path, BLOBSTATE_JAVAC=str(tmp_path / "no-javac"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "blobstate/engine/java/PreferredLocations.java" in names
    assert WHEEL_JAR not in names


def _fake_jar(java_dir: Path, spark_version: str, digest: str | None = None) -> Path:
    """A jar with the manifest a build writes (no classes: only what ``shipped_jar_for`` reads)."""
    classes = java_dir / "classes"
    classes.mkdir(exist_ok=True)
    jar = java_dir / SHIPPED_JAR_NAME
    write_jar(classes, jar, {SPARK_VERSION_ATTRIBUTE: spark_version, SOURCES_ATTRIBUTE: digest or ""})
    return jar


def test_the_shipped_jar_fits_the_same_spark_major_minor_and_sources(tmp_path: Path) -> None:
    java_dir = tmp_path / "java"
    java_dir.mkdir()
    (java_dir / "A.java").write_text("class A {}")
    assert shipped_jar_for("4.3.0", java_dir) == (None, shipped_jar_for("4.3.0", java_dir)[1])
    assert "ships no prebuilt helper jar" in shipped_jar_for("4.3.0", java_dir)[1]
    jar = _fake_jar(java_dir, "4.3.0", sources_digest(java_dir))
    assert shipped_jar_for("4.3.0", java_dir) == (jar, "")
    assert shipped_jar_for("4.3.2", java_dir) == (jar, "")
    assert shipped_jar_for("4.3.0.dev1", java_dir) == (jar, "")
    found, why = shipped_jar_for("4.2.1", java_dir)
    assert found is None and "built for Spark 4.3.0, not 4.2.1" in why
    (java_dir / "A.java").write_text("class A { int changed; }")
    found, why = shipped_jar_for("4.3.0", java_dir)
    assert found is None and "other sources" in why


def test_neither_a_fitting_jar_nor_a_compiler_is_one_error_saying_both(tmp_path: Path) -> None:
    java_dir = tmp_path / "java"
    java_dir.mkdir()
    _fake_jar(java_dir, "4.1.0")
    with pytest.raises(PlacementUnavailableError) as caught:
        resolve_helper_jar(
            "4.3.0", "", cache_dir=tmp_path / "cache", javac=str(tmp_path / "no-javac"), java_dir=java_dir
        )
    message = str(caught.value)
    assert "built for Spark 4.1.0, not 4.3.0" in message and "no-javac" in message
    assert "Install a JDK 17+" in message and "pyspark 4.3 installed" in message


def test_spark_connect_is_one_clear_error() -> None:
    connect_like = types.SimpleNamespace(version="4.3.0")  # a Connect session has no _jsparkSession
    with pytest.raises(
        SparkConnectUnsupportedError, match=r"does not support Spark Connect.*classic SparkSession"
    ):
        PlacementHelper.get(connect_like)  # type: ignore[arg-type]


LOAD_SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
from blobstate.engine.jvm.classic import PlacementHelper
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
helper = PlacementHelper.load(spark)
print(json.dumps({"jar": str(helper.jar), "executors": [e.executor_id for e in helper.executors()]}))
spark.stop()
"""


@pytest.mark.spark
def test_loading_uses_the_shipped_jar_without_calling_javac(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    called = tmp_path / "javac-was-called"
    javac = tmp_path / "javac"
    javac.write_text(f"#!/bin/sh\ntouch {called}\nexit 1\n")
    javac.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(site), *(p for p in sys.path if p and not (Path(p) / "blobstate").is_dir())]
        ),
        "BLOBSTATE_JAVAC": str(javac),
        "BLOBSTATE_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == {"jar": str(site / WHEEL_JAR), "executors": ["driver"]}
    assert not called.exists()
    assert not (tmp_path / "cache").exists()


def test_the_source_checkout_ships_no_jar() -> None:
    # A jar here would be packed into every wheel whatever Spark it was built for.
    assert helper_jar.shipped_jar() is None
