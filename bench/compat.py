"""Does blobstate install and run its demo with dependency versions other than constraints.txt's?

Creates a fresh virtualenv in a temporary directory, installs the given in-range versions of pyspark,
pandas, pyarrow and numpy (by default the lowest that ``pyproject.toml`` allows), then installs blobstate
from this checkout next to them without build isolation (so the build sees that pyspark and ships the
placement helper's jar built against it), and runs ``blobstate demo`` at a small size. Checks the exit
status and that the demo said its result matches the reference. Network-bound and slow (it downloads
pyspark), so it is run by hand, never by the test suite:

    python bench/compat.py [--set pyspark==4.1.0,pandas==2.2.3,...] [--keep]

Prints one JSON object: the versions asked for and found, the seconds each step took, whether the wheel
had a jar, whether the demo used it, and the verdict. Exits 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LOWEST = "pyspark==4.3.0,pandas==2.2.3,pyarrow==25.0.0,numpy==1.26.4"
"""The lowest versions pyproject.toml's ranges allow (pandas 2.2.3: the newest 2.2). pyspark 4.3.0: the JVM
helper calls ``LogicalRDD.fromDataset`` with four arguments, which 4.1 and 4.2 do not have; pyarrow 25: the
first to take a null placement per sort key, as ``processor/grouping.py`` sorts (18 to 24 refuse it)."""

DEMO_ARGS = [
    "--batches",
    "6",
    "--events",
    "2000",
    "--users",
    "1000",
    "--partitions",
    "2",
    "--kill-after",
    "3",
]


def _run(
    step: str,
    command: list[str],
    timings: dict[str, float],
    log: Path,
    *,
    env: dict[str, str],
    cwd: Path | None = None,
) -> str:
    """Run ``command``, record its seconds under ``step``, append its output to ``log``; raise on failure."""
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    timings[step] = round(time.monotonic() - started, 1)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}\n{result.stderr}\n")
    if result.returncode != 0:
        raise RuntimeError(f"{step} failed (exit {result.returncode}); see {log}:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def main() -> int:
    """Build the venv, install, run the demo and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default=LOWEST, help="comma-separated pip requirements to install")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    pins = [p for p in args.set.split(",") if p]
    work = Path(tempfile.mkdtemp(prefix="blobstate-compat-"))
    log = work / "compat.log"
    timings: dict[str, float] = {}
    report: dict[str, object] = {"asked": pins, "workdir": str(work), "log": str(log)}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON")}
    python = work / "venv" / "bin" / "python"
    try:
        started = time.monotonic()
        venv.create(work / "venv", with_pip=True)
        timings["venv"] = round(time.monotonic() - started, 1)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
        _run("install_pins", [*pip, "setuptools>=68", "wheel", *pins], timings, log, env=env)
        # Without build isolation the build sees the pyspark just installed (and builds the jar for it);
        # the pins again keep the resolver from moving them.
        _run("install_blobstate", [*pip, "--no-build-isolation", f"{REPO}[s3]", *pins], timings, log, env=env)
        found = _run(
            "versions",
            [
                str(python),
                "-c",
                "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in"
                " ('pyspark', 'pandas', 'pyarrow', 'numpy', 'blobstate')}))",
            ],
            timings,
            log,
            env=env,
        )
        report["found"] = json.loads(found.splitlines()[0])
        report["wheel_jar"] = _run(
            "jar_check",
            [
                str(python),
                "-c",
                "from blobstate.engine.helper_jar import SPARK_VERSION_ATTRIBUTE, manifest_attributes,"
                " shipped_jar; jar = shipped_jar();"
                " print(jar and f'{jar} (Spark {manifest_attributes(jar)[SPARK_VERSION_ATTRIBUTE]})')",
            ],
            timings,
            log,
            env=env,
        ).strip()
        # No Java compiler: the demo must run on the jar shipped in the wheel alone.
        demo_env = {
            **env,
            "BLOBSTATE_JAVAC": str(work / "no-javac"),
            "BLOBSTATE_CACHE_DIR": str(work / "cache"),
        }
        demo_env.pop("JAVA_HOME", None)
        output = _run(
            "demo",
            [str(work / "venv" / "bin" / "blobstate"), "demo", "--workdir", str(work / "demo"), *DEMO_ARGS],
            timings,
            log,
            env=demo_env,
            cwd=work,
        )
        report["demo_tail"] = output.strip().splitlines()[-3:]
        report["ok"] = "OK:" in output and "MISMATCH" not in output
    except (RuntimeError, OSError) as error:
        report["ok"] = False
        report["error"] = str(error)
    report["seconds"] = timings
    print(json.dumps(report, indent=2))
    if not args.keep and report["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
