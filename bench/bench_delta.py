"""Micro benchmark of the delta format: encode/decode 1M small records; prints JSON.

Usage: .venv/bin/python bench/bench_delta.py [--records N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from blobstate.ids import new_uid
from blobstate.lineage.changelog import ChangeOp, ChangeRecord
from blobstate.lineage.delta import decode_delta, encode_delta, read_delta_lineage


def _records(n: int, kind: str) -> list[ChangeRecord]:
    rng = random.Random(42)
    if kind == "random":
        # incompressible: ~20-byte keys and ~30-byte values of random bytes
        return [(ChangeOp.PUT, "default", os.urandom(20), os.urandom(30)) for _ in range(n)]
    # realistic: structured keys (a user id), values a small encoded row; 2 column families; 5% deletes
    out: list[ChangeRecord] = []
    for i in range(n):
        key = f"user-{rng.randrange(10**9):012d}\x00ab".encode()[:20].ljust(20, b"\x00")
        if rng.random() < 0.05:
            out.append((ChangeOp.DELETE, "count", key, None))
        else:
            value = f'{{"n":{rng.randrange(10**6)},"t":{1_700_000_000_000 + i}}}'.encode()[:30].ljust(
                30, b" "
            )
            out.append((ChangeOp.PUT, "count" if i % 2 else "last_seen", key, value))
    return out


def _raw_bytes(records: list[ChangeRecord]) -> int:
    return sum(len(cf.encode()) + len(k) + (len(v) if v is not None else 0) for _, cf, k, v in records)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lineage = [new_uid() for _ in range(10)]
    results = []
    for kind in ("random", "structured"):
        records = _records(args.records, kind)
        raw = _raw_bytes(records)
        raw_kv = sum(len(k) + (len(v) if v is not None else 0) for _, _, k, v in records)
        enc_times, dec_times, enc_cpu, dec_cpu = [], [], [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            data = encode_delta(records, lineage)
            enc_times.append(time.perf_counter() - t0)
            enc_cpu.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            delta = decode_delta(data, name="bench.delta")
            dec_times.append(time.perf_counter() - t0)
            dec_cpu.append(time.process_time() - c0)
            del delta
        assert decode_delta(data, name="bench.delta").records == records
        t0 = time.perf_counter()
        read_delta_lineage(data, name="bench.delta")
        lineage_s = time.perf_counter() - t0
        results.append(
            {
                "kind": kind,
                "records": args.records,
                "encode_s": round(min(enc_times), 3),
                "decode_s": round(min(dec_times), 3),
                "encode_cpu_s": round(min(enc_cpu), 3),
                "decode_cpu_s": round(min(dec_cpu), 3),
                "read_lineage_s": round(lineage_s, 6),
                "delta_bytes": len(data),
                "changelog_bytes_key_value_cf": raw,
                "changelog_bytes_key_value": raw_kv,
                "ratio_vs_changelog": round(len(data) / raw, 3),
                "ratio_vs_key_value": round(len(data) / raw_kv, 3),
            }
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
