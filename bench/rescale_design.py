"""Which rescale design: record-level redistribution or key-group range copies (docs/RESCALE.md).

One store of ``--keys`` grouping keys (int64, the fast-path key encoding) in a value-state column
family, split into 2 target stores, three ways, each from a fresh copy of the source:

- ``records+sst``: iterate every record, take the grouping key's bytes, compute Spark's partition
  (vectorized Murmur3 over numpy columns), write each target's records with an ``SstFileWriter`` (the
  source order is key order, so each target's stream is sorted) and ingest the file into the target.
- ``records+batch``: the same split, written with ``WriteBatch`` puts (what a target receiving records
  from several old partitions, in no global order, would do).
- ``keygroups``: keys prefixed by a 2-byte key group (``hash % 4096``); each target is a hard-link
  checkpoint of the source with the key groups it does not own range-deleted and compacted away: no
  per-record Python work, what Flink does.

Also reported: the cost of the per-record steps alone (iterate; iterate + hash), and the store's size.
Times are wall seconds and process CPU seconds of one run each on this machine.

    PYTHONPATH=src python bench/rescale_design.py --keys 1000000 --out bench/results-rescale-design.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
from rocksdict import Options, Rdict, SstFileWriter, WriteBatch

from blobstate.rescale.murmur3 import hash_int64_column, pmod

CHUNK = 65_536
KEY_GROUPS = 4096
_OFFSET = np.uint64(1 << 63)


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def _key_bytes(values: np.ndarray, prefix: np.ndarray | None = None) -> list[bytes]:
    """The fast-path encoding of int64 keys (tag 0x03 + offset big-endian), optionally key-group prefixed."""
    body = (values.astype(np.int64).view(np.uint64) ^ _OFFSET).astype(">u8").view(np.uint8).reshape(-1, 8)
    tag = np.full((len(values), 1), 3, dtype=np.uint8)
    parts = [tag, body] if prefix is None else [prefix.astype(">u2").view(np.uint8).reshape(-1, 2), tag, body]
    rows = np.hstack(parts)
    width = rows.shape[1]
    flat = rows.tobytes()
    return [flat[i * width : (i + 1) * width] for i in range(len(values))]


def build(path: Path, keys: int, *, key_groups: bool) -> None:
    """A store of ``keys`` random int64 keys, each with a 16-byte value, written sorted by SST ingestion."""
    rng = np.random.default_rng(7)
    values = np.unique(rng.integers(-(2**62), 2**62, size=keys + keys // 50, dtype=np.int64))[:keys]
    rng.shuffle(values)
    prefix = pmod(hash_int64_column(values), KEY_GROUPS) if key_groups else None
    encoded = _key_bytes(values, prefix)
    encoded.sort()
    db = Rdict(str(path), _options())
    sst = path.parent / f"{path.name}.build.sst"
    writer = SstFileWriter(_options())
    writer.open(str(sst))
    payload = b"v" * 16
    for k in encoded:
        writer[k] = payload
    writer.finish()
    db.ingest_external_file([str(sst)])
    sst.unlink()
    db.compact_range(None, None)
    db.close()


def _iterate(src: Rdict) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Chunks of (keys, values) of the source in key order."""
    keys: list[bytes] = []
    vals: list[bytes] = []
    # raw mode: bytes keys and values (rocksdict's stub types the default mode's)
    for k, v in cast(Iterator[tuple[bytes, bytes]], src.items()):
        keys.append(k)
        vals.append(v)
        if len(keys) == CHUNK:
            yield keys, vals
            keys, vals = [], []
    if keys:
        yield keys, vals


def _targets(keys: list[bytes], n: int) -> np.ndarray:
    raw = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 9)[:, 1:]
    ints = (raw.copy().view(">u8").reshape(-1) ^ _OFFSET).view(np.int64)
    return pmod(hash_int64_column(ints), n)


def iterate_only(src_path: Path, _work: Path, _n: int) -> dict[str, Any]:
    src = Rdict(str(src_path), _options())
    count = sum(len(k) for k, _ in _iterate(src))
    src.close()
    return {"records": count}


def iterate_and_hash(src_path: Path, _work: Path, n: int) -> dict[str, Any]:
    src = Rdict(str(src_path), _options())
    counts = np.zeros(n, dtype=np.int64)
    for keys, _ in _iterate(src):
        counts += np.bincount(_targets(keys, n), minlength=n)
    src.close()
    return {"per_target": counts.tolist()}


def records_sst(src_path: Path, work: Path, n: int) -> dict[str, Any]:
    src = Rdict(str(src_path), _options())
    writers = []
    for t in range(n):
        w = SstFileWriter(_options())
        w.open(str(work / f"t{t}.sst"))
        writers.append(w)
    for keys, vals in _iterate(src):
        targets = _targets(keys, n).tolist()
        for k, v, t in zip(keys, vals, targets, strict=True):
            writers[t][k] = v
    src.close()
    for t, w in enumerate(writers):
        w.finish()
        db = Rdict(str(work / f"target{t}"), _options())
        db.ingest_external_file([str(work / f"t{t}.sst")])
        db.close()
    return {}


def records_batch(src_path: Path, work: Path, n: int) -> dict[str, Any]:
    src = Rdict(str(src_path), _options())
    dbs = [Rdict(str(work / f"target{t}"), _options()) for t in range(n)]
    for keys, vals in _iterate(src):
        targets = _targets(keys, n).tolist()
        batches = [WriteBatch(raw_mode=True) for _ in range(n)]
        for k, v, t in zip(keys, vals, targets, strict=True):
            batches[t].put(k, v)
        for db, batch in zip(dbs, batches, strict=True):
            db.write(batch)
    src.close()
    for db in dbs:
        db.flush()
        db.close()
    return {}


def keygroups(src_path: Path, work: Path, n: int) -> dict[str, Any]:
    from rocksdict import Checkpoint

    src = Rdict(str(src_path), _options())
    for t in range(n):
        dest = work / f"target{t}"
        Checkpoint(src).create_checkpoint(str(dest))
        lo, hi = t * KEY_GROUPS // n, (t + 1) * KEY_GROUPS // n
        db = Rdict(str(dest), _options())
        if lo > 0:
            db.delete_range(b"", lo.to_bytes(2, "big"))
        if hi < KEY_GROUPS:
            db.delete_range(hi.to_bytes(2, "big"), b"\xff\xff\xff")
        db.compact_range(None, None)
        db.close()
    src.close()
    return {}


def measure(name: str, fn: Callable[[Path, Path, int], dict[str, Any]], src: Path, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(src, copy)
        work = Path(tmp) / "work"
        work.mkdir()
        wall, cpu = time.perf_counter(), time.process_time()
        extra = fn(copy, work, n)
        out = {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}
        out.update(extra)
    print(f"{name:>16}: {out}", flush=True)
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--targets", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"keys": args.keys, "targets": args.targets, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        plain, grouped = Path(tmp) / "plain", Path(tmp) / "grouped"
        build(plain, args.keys, key_groups=False)
        build(grouped, args.keys, key_groups=True)
        results["store_bytes"] = _size(plain)
        results["iterate"] = measure("iterate", iterate_only, plain, args.targets)
        results["iterate+hash"] = measure("iterate+hash", iterate_and_hash, plain, args.targets)
        results["records+sst"] = measure("records+sst", records_sst, plain, args.targets)
        results["records+batch"] = measure("records+batch", records_batch, plain, args.targets)
        results["keygroups"] = measure("keygroups", keygroups, grouped, args.targets)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
