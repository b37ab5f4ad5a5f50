"""blobstate from its wheel on a multi-host cluster whose executors' Python has no blobstate.

The README's "Deploying to a cluster" commands, run for real: a wheel built with ``python -m build``, a
fresh virtual environment with the wheel installed (the driver's environment), packed with venv-pack
(without pyspark: executors import Spark's own) and shipped to the executors with ``spark-submit
--archives``. The executors' interpreter is the base Python of this test's virtual environment, which has
neither blobstate nor its dependencies. The driver runs with no Java compiler, so the helper jar shipped
in the wheel is the one used. The job's processor lives in a module of its own (``deployed_sessions.py``,
beside the job's script), shipped with ``--py-files`` as "Shipping the job's own code" says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cluster import MultiHostCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("packed_env_driver.py")
JOB_MODULE = Path(__file__).with_name("deployed_sessions.py")
"""The job's own module, beside its script: the processor's class."""
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
"""The interpreter this test's virtual environment was made from: the executors' Python."""
TEST_ONLY = {"pytest", "pytest-timeout", "hypothesis", "moto", "ruff", "build", "venv-pack", "matplotlib"}
"""Distributions of the ``test`` extra that a plain install must not bring."""


@dataclass
class PackedEnvironment:
    """The wheel, the virtual environment it was installed into, and that environment packed."""

    wheel: Path
    venv: Path
    archive: Path
    installed: set[str]
    seconds: dict[str, float]


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at this checkout or this venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _run(command: list[str | Path], seconds: dict[str, float] | None = None, **env: str) -> str:
    """Run ``command`` with a clean environment plus ``env``; its stdout. Adds its duration to
    ``seconds``, named by its first three arguments."""
    started = time.monotonic()
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=_clean_env(**env), check=False
    )
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if seconds is not None:
        step = " ".join(Path(str(c)).name for c in command[:3])
        seconds[step] = round(time.monotonic() - started, 1)
    return result.stdout


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> PackedEnvironment:
    """Build the wheel, install it into a fresh venv and pack that venv (once per test run)."""
    work = tmp_path_factory.mktemp("deploy")
    source = work / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    seconds: dict[str, float] = {}
    # The README's build: in an environment with pyspark and a JDK, so the wheel carries the helper jar.
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", work / "dist", source]
    _run(build, seconds, BLOBSTATE_BUILD_JAR="1")
    (wheel,) = (work / "dist").glob("blobstate-*.whl")
    venv = work / "blobstate-env"
    _run([BASE_PYTHON, "-m", "venv", venv], seconds)
    _run([venv / "bin" / "pip", "install", "-c", REPO / "constraints.txt", wheel], seconds)
    listed = json.loads(_run([venv / "bin" / "pip", "list", "--format", "json"]))
    archive = work / "blobstate-env.tar.gz"
    venv_pack = Path(sys.executable).with_name("venv-pack")
    _run(
        [
            *(venv_pack, "-p", venv, "-o", archive),
            *("--exclude", "lib/python*/site-packages/pyspark/*", "--compress-level", "1"),
        ],
        seconds,
    )
    installed = {canonicalize_name(p["name"]) for p in listed}
    return PackedEnvironment(wheel, venv, archive, installed, seconds)


def _driver(
    cluster: MultiHostCluster,
    packed: PackedEnvironment,
    work: Path,
    options: dict[str, str],
    **env: str,
) -> dict:
    """Run ``packed_env_driver.py`` with the packed environment's ``spark-submit`` against ``cluster``,
    the README's command with ``options`` (``--archives``, ``--py-files``, ...)."""
    settings = {
        **cluster.driver_conf(),
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The cluster's workers were started from this test's venv with this checkout on PYTHONPATH,
        # which their executors would pass on to every Python worker: clear it for this application.
        "spark.executorEnv.PYTHONPATH": "",
    }
    command = [
        packed.venv / "bin" / "spark-submit",
        *(f"--conf={k}={v}" for k, v in settings.items()),
        *(f"--{option}={value}" for option, value in options.items()),
        DRIVER,
        *("--workdir", work, "--local-dir", cluster.host_disk),
    ]
    out = _run(
        command,
        PYSPARK_DRIVER_PYTHON=str(packed.venv / "bin" / "python"),
        BLOBSTATE_JAVAC=str(work / "no-javac"),  # the wheel's jar or nothing
        BLOBSTATE_CACHE_DIR=str(work / "cache"),
        **env,
    )
    return json.loads(out.strip().splitlines()[-1])


def test_executors_without_blobstate_run_the_demo_from_the_packed_wheel_environment(
    multihost_cluster: MultiHostCluster, packed: PackedEnvironment, tmp_path: Path
) -> None:
    # The wheel: test tools only behind the "test" extra; the Java sources, the prebuilt jar and the
    # module that registers the "blobstate" data source inside.
    with zipfile.ZipFile(packed.wheel) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            Requirement(line.split(":", 1)[1])
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    plain = {canonicalize_name(r.name) for r in requires if r.marker is None}
    behind_test = {canonicalize_name(r.name) for r in requires if 'extra == "test"' in str(r.marker)}
    assert {"pyspark", "rocksdict", "pyarrow"} <= plain and not plain & TEST_ONLY
    assert {"pytest", "hypothesis", "moto", "build", "venv-pack"} <= behind_test
    assert not packed.installed & (TEST_ONLY | {"boto3", "azure-storage-blob"})
    java = {f"blobstate/engine/java/{p.name}" for p in (REPO / "src/blobstate/engine/java").glob("*.java")}
    assert java and java <= names
    assert {"blobstate/engine/java/blobstate-helper.jar", "pyspark_blobstate/__init__.py"} <= names

    # The executors' Python on its own: nothing of blobstate's.
    probe = subprocess.run(
        [
            BASE_PYTHON,
            "-c",
            "import importlib.util as u; print([m for m in ('blobstate', 'pyarrow',"
            " 'rocksdict') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        env=_clean_env(),
        check=True,
    )
    assert probe.stdout.strip() == "[]", f"{BASE_PYTHON} already has {probe.stdout}"

    # Shipped the packed environment and the job's module, that Python runs the demo with blobstate from
    # the archive and the job's processor from the module --py-files put in each executor's directory.
    report = _driver(
        multihost_cluster,
        packed,
        tmp_path / "with",
        options={"archives": f"{packed.archive}#environment", "py-files": str(JOB_MODULE)},
        PYSPARK_PYTHON="./environment/bin/python",
    )
    executors = [json.loads(line) for line in report["executors"]]
    hosts = set()
    for e in executors:
        prefix = Path(e["prefix"])
        assert prefix.name == "environment" and Path(e["cwd"]) == prefix.parent
        assert Path(e["blobstate"]).is_relative_to(prefix) and Path(e["rocksdict"]).is_relative_to(prefix)
        assert "pyspark.zip" in e["pyspark"]  # Spark's own
        assert Path(e["job_module"]) == Path(e["cwd"]) / JOB_MODULE.name  # shipped, not this checkout's
        hosts.add(Path(e["cwd"]).relative_to(multihost_cluster.root / "work").parts[0])
    assert len(hosts) == 2, executors
    print(f"archive {packed.archive.stat().st_size:,} bytes; seconds: {packed.seconds} {report['seconds']}")
    assert report["matches"] and report["sessions_emitted"] > 100, report
    assert report["open_sessions_read"] == report["open_sessions_expected"] != {}
