"""The CPU time of a process tree, read from /proc: shared by the benchmarks that run Spark in-process."""

from __future__ import annotations

import os


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants (reaped children included), from /proc."""
    return sum(tree_cpu_by_kind().values())


def tree_cpu_by_kind() -> dict[str, float]:
    """:func:`tree_cpu_seconds` split into this process (``driver_python``: the benchmark runs the
    Spark driver in-process), the ``jvm`` (processes named ``java``) and every other descendant
    (``python_workers``), from /proc; a process's reaped children count with it."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / ticks
        names[int(entry)] = head.partition("(")[2]
    root = os.getpid()
    kinds = {"jvm": 0.0, "driver_python": 0.0, "python_workers": 0.0}
    for pid, seconds in times.items():
        p = pid
        while p not in (0, 1) and p != root:
            p = parents.get(p, 0)
        if p != root:
            continue
        kind = "driver_python" if pid == root else "jvm" if names[pid] == "java" else "python_workers"
        kinds[kind] += seconds
    return kinds
