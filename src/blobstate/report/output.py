"""Put the report's files into its output directory without writing through links or over files it did
not write.

The files are first written into a fresh directory next to the output directory (in its parent), then
moved into place by rename, which replaces a directory entry and never follows a symbolic link. The
report recognizes its own files by :data:`MANIFEST_NAME`, which it writes into the output directory
listing every file it put there. Before moving anything it checks each output name: a name that is a
symbolic link, or a file the previous manifest does not list, is refused unless ``force`` (then the
link or file itself is replaced; a directory at an output name is always refused). Files an earlier
report listed but this one does not write are removed; nothing else in the directory is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path

from blobstate.errors import ConfigurationError

MANIFEST_NAME = "blobstate-report.json"
"""The file in the output directory listing what ``blobstate report`` wrote there."""
WRITTEN_BY = "blobstate report"


class ReportOutputError(ConfigurationError):
    """The report will not write into its output directory (a link, or a file it did not write, is in
    the way); nothing there was changed."""


def read_manifest(out_dir: Path) -> set[str] | None:
    """The file names the manifest in ``out_dir`` lists; None when there is none.

    A manifest that is a link, not a regular file, or not one this command wrote raises
    :class:`ReportOutputError` naming it.
    """
    path = out_dir / MANIFEST_NAME
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        raise ReportOutputError(
            f"{path} is not a regular file: blobstate report keeps the list of files it wrote there; "
            "move it away or pass --force"
        )
    try:
        data = json.loads(path.read_bytes())
        files = data["files"] if data.get("written_by") == WRITTEN_BY else None
    except (ValueError, TypeError, KeyError, AttributeError):
        files = None
    if not isinstance(files, list) or not all(isinstance(f, str) and _plain(f) for f in files):
        raise ReportOutputError(
            f"{path} is not a list of files blobstate report wrote: move it away or pass --force"
        )
    return set(files)


def _plain(name: str) -> bool:
    """A bare file name (no directory part): manifests never name anything outside their directory."""
    return bool(name) and name not in (".", "..") and "/" not in name and os.sep not in name


def _conflict(out_dir: Path, name: str, ours: set[str]) -> str | None:
    """Why ``name`` in ``out_dir`` may not be replaced without ``force`` (None: it may)."""
    path = out_dir / name
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link (blobstate report never writes through a link)"
    if stat.S_ISDIR(mode):
        return f"{path} is a directory"
    if name not in ours:
        return f"{path} exists and blobstate report did not write it (it is not listed in {MANIFEST_NAME})"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    return None


def _write_manifest(directory: Path, listed: set[str]) -> Path:
    path = directory / MANIFEST_NAME
    with open(path, "xb") as f:
        f.write(json.dumps({"written_by": WRITTEN_BY, "files": sorted(listed)}, indent=2).encode() + b"\n")
    return path


def _write_fresh(tmp: Path, files: Mapping[str, bytes]) -> None:
    for name, data in files.items():
        with open(tmp / name, "xb") as f:  # a fresh directory: nothing, no link, is there yet
            f.write(data)


def write_outputs(out_dir: Path, files: Mapping[str, bytes], *, force: bool = False) -> list[Path]:
    """Put ``files`` (name -> bytes) into ``out_dir`` with a manifest listing them; returns their paths.

    ``out_dir`` is created when missing (then the fresh directory is renamed to it). Raises
    :class:`ReportOutputError`, changing nothing in ``out_dir``, when ``out_dir`` is a link or not a
    directory, or when an output name holds a link or a file the report did not write and ``force``
    is not given.
    """
    names = set(files)
    bad = [n for n in names if not _plain(n) or n == MANIFEST_NAME]
    if bad:
        raise ValueError(f"not an output file name: {sorted(bad)[0]!r}")
    if out_dir.is_symlink():
        raise ReportOutputError(
            f"{out_dir} is a symbolic link: blobstate report never writes through a link; give the "
            "directory it points to"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportOutputError(f"{out_dir} exists and is not a directory")
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.blobstate-report-{uuid.uuid4().hex}"
    tmp.mkdir()  # the umask decides its mode, as for a directory made by mkdir
    try:
        if not out_dir.exists():
            _write_fresh(tmp, files)
            _write_manifest(tmp, names)
            try:
                os.rename(tmp, out_dir)
                return [out_dir / n for n in files]
            except OSError:
                if not out_dir.exists():
                    raise
                # Someone made the directory meanwhile: move the files in one by one, as below.
                shutil.rmtree(tmp)
                tmp.mkdir()
        return _move_into(out_dir, tmp, files, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(out_dir: Path, tmp: Path, files: Mapping[str, bytes], force: bool) -> list[Path]:
    """Replace the output names in the existing directory ``out_dir`` by the files written to ``tmp``."""
    names = set(files)
    try:
        ours = read_manifest(out_dir) or set()
    except ReportOutputError:
        if not force:
            raise
        ours = set()
    problems = [p for n in sorted(names) if (p := _conflict(out_dir, n, ours)) is not None]
    directories = [p for p in problems if p.endswith("is a directory")]
    if directories or (problems and not force):
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        hint = "" if directories else "; move it away or pass --force to replace it"
        raise ReportOutputError(f"{problems[0]}{more}{hint}: nothing in {out_dir} was changed")
    stale = sorted(n for n in ours - names if _is_regular(out_dir / n))
    # The manifest goes first and lists the old files too: a run cut off part-way leaves every file it
    # moved in listed as the report's own.
    _write_fresh(tmp, files)
    os.replace(_write_manifest(tmp, names | ours), out_dir / MANIFEST_NAME)
    for name in sorted(names, key=lambda n: n.endswith(".html")):  # the page last
        os.replace(tmp / name, out_dir / name)
    for name in stale:
        (out_dir / name).unlink(missing_ok=True)
    os.replace(_write_manifest(tmp, names), out_dir / MANIFEST_NAME)
    return [out_dir / n for n in files]


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


__all__ = ["MANIFEST_NAME", "ReportOutputError", "read_manifest", "write_outputs"]
