"""Draw a checkpoint's per-batch metrics as PNG plots and one self-contained HTML page.

The page embeds every plot as a ``data:image/png;base64`` URI (it can be mailed or attached as one
file); the same PNGs are written next to it. Plotting uses matplotlib's Agg backend (no display), an
optional dependency: ``pip install 'blobstate[report]'``.
"""

from __future__ import annotations

import base64
import functools
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blobstate.errors import ConfigurationError
from blobstate.report.metrics import STAGE_SPLIT, BatchMetrics, CheckpointSummary, Progress, state_key_series

PAGE_NAME = "index.html"
MAX_BARS = 150
"""Above this many versions, per-version counts are drawn as step lines instead of bars."""
MAX_PARTITION_LINES = 12
"""Above this many partitions, per-partition plots show min, median and max instead of one line each."""


class ReportError(ConfigurationError):
    """The report cannot be produced (a missing plotting library, an empty checkpoint)."""


@dataclass(frozen=True)
class Plot:
    """One rendered plot: its file name, title, caption and PNG bytes."""

    name: str
    title: str
    caption: str
    png: bytes


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; :class:`ReportError` with the install hint when missing."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "blobstate report needs matplotlib, which is not installed: pip install 'blobstate[report]'"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[BatchMetrics], get: Callable[[BatchMetrics], float | None]) -> list[float]:
    """Values per version with NaN where unknown, so lines break instead of dropping to zero."""
    return [float("nan") if (v := get(r)) is None else float(v) for r in rows]


def _at_partition(
    get: Callable[[BatchMetrics, int], float | None], partition: int, row: BatchMetrics
) -> float | None:
    return get(row, partition) if partition in row.partitions else None


def _split_seconds(key: str, row: BatchMetrics) -> float | None:
    return row.split.get(key)


def _known(values: Sequence[float]) -> bool:
    return any(v == v for v in values)  # NaN != NaN


def _partition_lines(
    ax: Any, rows: Sequence[BatchMetrics], get: Callable[[BatchMetrics, int], float | None], unit: str
) -> None:
    """One line per partition, or min/median/max across partitions when there are many."""
    import statistics

    batches = [r.batch_id for r in rows]
    partitions = sorted({p for r in rows for p in r.partitions})
    if len(partitions) <= MAX_PARTITION_LINES:
        for p in partitions:
            ys = _series(rows, functools.partial(_at_partition, get, p))
            if _known(ys):
                ax.plot(batches, ys, marker=".", linewidth=1.2, label=f"partition {p}")
    else:
        for name, stat in (("max", max), ("median", statistics.median), ("min", min)):

            def pick(r: BatchMetrics, stat: Any = stat) -> float | None:
                values = [v for p in r.partitions if (v := get(r, p)) is not None]
                return stat(values) if values else None

            ax.plot(
                batches, _series(rows, pick), marker=".", label=f"{name} over {len(partitions)} partitions"
            )
    ax.set_ylabel(unit)


class _Figures:
    """Builds the plots, one matplotlib figure at a time (closed after saving: memory stays flat)."""

    def __init__(self, rows: Sequence[BatchMetrics]) -> None:
        self.plt = pyplot()
        self.rows = rows
        self.batches = [r.batch_id for r in rows]
        self.drew_state_files = False
        """Whether :meth:`state_size` drew the snapshots' file sizes (known only where an index was read)."""

    def _axes(self) -> tuple[Any, Any]:
        fig, ax = self.plt.subplots(figsize=(9, 3.4), dpi=100, layout="constrained")
        ax.set_xlabel("batch id (version = batch id + 1)")
        ax.grid(True, alpha=0.3)
        return fig, ax

    def _png(self, fig: Any, ax: Any) -> bytes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        self.plt.close(fig)
        return buffer.getvalue()

    def _bars(
        self, ax: Any, values: Sequence[float], label: str, slot: int = 0, of: int = 1, **kw: Any
    ) -> None:
        """Bars per batch (``slot`` of ``of`` side by side); a step line when there are too many
        batches for bars to be legible (and thousands of bar patches take seconds to draw)."""
        if len(self.batches) > MAX_BARS:
            ax.step(self.batches, values, where="mid", label=label, linewidth=1, **kw)
            return
        width = 0.8 / of
        xs = [v - 0.4 + width * (slot + 0.5) for v in self.batches]
        ax.bar(xs, values, width, label=label, **kw)

    def latency(self) -> bytes:
        fig, ax = self._axes()
        ax.plot(self.batches, _series(self.rows, lambda r: r.seconds), marker="o", label="batch seconds")
        ax.plot(
            self.batches, _series(self.rows, lambda r: r.max_task_seconds), marker=".", label="slowest task"
        )
        overhead = _series(self.rows, lambda r: r.spark_overhead_seconds)
        if _known(overhead):
            ax.plot(self.batches, overhead, linestyle="--", label="Spark beyond slowest task")
        recovery = _series(self.rows, lambda r: r.spark_recovery_seconds)
        if any(v > 0 for v in recovery if v == v):  # only when some batch recovered from a failure
            ax.plot(self.batches, recovery, linestyle="-.", label="Spark recovery (retries)")
        for key in STAGE_SPLIT:
            ys = _series(self.rows, functools.partial(_split_seconds, key))
            if _known(ys):
                ax.plot(self.batches, ys, linestyle=":", marker=".", label=key.replace("_", " "))
        restarts = [
            r.batch_id for prev, r in zip(self.rows, self.rows[1:], strict=False) if r.writer != prev.writer
        ]
        for i, v in enumerate(restarts):
            ax.axvline(v - 0.5, color="grey", linestyle="-.", label="driver restarted" if i == 0 else None)
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        return self._png(fig, ax)

    def rows_in_out(self) -> bytes:
        fig, ax = self._axes()
        self._bars(ax, _series(self.rows, lambda r: r.input_rows), "input rows", 0, 2)
        self._bars(ax, _series(self.rows, lambda r: r.output_rows), "output rows", 1, 2)
        ax.set_ylabel("rows")
        return self._png(fig, ax)

    def bytes_uploaded(self) -> bytes:
        fig, ax = self._axes()
        kib = 1024
        self._bars(
            ax,
            _series(self.rows, lambda r: None if r.bytes_uploaded is None else r.bytes_uploaded / kib),
            "uploaded (deltas, snapshot blobs and indexes)",
        )
        ax.plot(
            self.batches,
            [r.delta_bytes / kib for r in self.rows],
            color="black",
            marker=".",
            label="deltas (from the commit)",
        )
        ax.set_ylabel("KiB")
        return self._png(fig, ax)

    def restore_seconds(self) -> bytes:
        fig, ax = self._axes()
        _partition_lines(ax, self.rows, lambda r, p: r.partitions[p].restore_seconds, "seconds")
        ax.set_ylim(bottom=0)
        return self._png(fig, ax)

    def state_size(self) -> bytes:
        fig, ax = self._axes()
        ax.plot(
            self.batches,
            _series(self.rows, lambda r: state_key_series(r)["state"]),
            marker="o",
            label="the query's state keys (estimate)",
        )
        side = _series(self.rows, lambda r: state_key_series(r)["side stores"])
        if _known(side):
            stores = ", ".join(sorted({name for r in self.rows for name in r.side_stores}))
            ax.plot(
                self.batches, side, marker="^", linestyle="--", label=f"side store keys, not state ({stores})"
            )
        together = _series(self.rows, lambda r: state_key_series(r)["together"])
        if _known(together):
            ax.plot(
                self.batches,
                together,
                marker="x",
                linestyle=":",
                label="state and side store keys together (commits that did not split them)",
            )
        ax.set_ylabel("keys")
        sizes = _series(
            self.rows,
            lambda r: (
                sum(p.state_bytes or 0 for p in r.partitions.values())
                if any(p.state_bytes is not None for p in r.partitions.values())
                else None
            ),
        )
        if _known(sizes):
            self.drew_state_files = True
            right = ax.twinx()
            right.plot(
                self.batches,
                [s / 1024 for s in sizes],
                "s",
                color="tab:red",
                label="RocksDB files of each snapshot (KiB)"
                + (", side stores' included" if any(r.side_stores for r in self.rows) else ""),
            )
            right.set_ylabel("KiB at snapshots", color="tab:red")
            right.set_ylim(0, max(s for s in sizes if s == s) / 1024 * 1.15)
            right.legend(loc="lower right", fontsize=8)
        ax.set_ylim(bottom=0)
        return self._png(fig, ax)

    def snapshots(self) -> bytes:
        fig, ax = self._axes()
        self._bars(ax, [r.snapshots for r in self.rows], "partitions snapshotted", color="tab:green")
        ax.set_ylabel("snapshots")
        ax.yaxis.get_major_locator().set_params(integer=True)
        return self._png(fig, ax)

    def standby_lag(self) -> bytes:
        fig, ax = self._axes()
        _partition_lines(
            ax,
            self.rows,
            lambda r, p: None if r.standby is None else r.standby.lag_versions.get(p),
            "versions behind",
        )
        ax.set_ylim(bottom=0)
        return self._png(fig, ax)

    def failovers(self) -> bytes:
        fig, ax = self._axes()
        self._bars(
            ax, [0 if r.standby is None else r.standby.failovers for r in self.rows], "to a standby", 0, 2
        )
        self._bars(
            ax,
            [0 if r.standby is None else r.standby.failovers_without_standby for r in self.rows],
            "cold (no standby)",
            1,
            2,
        )
        ax.set_ylabel("failovers")
        ax.yaxis.get_major_locator().set_params(integer=True)
        return self._png(fig, ax)


PLOTS: list[tuple[str, str, str]] = [
    ("latency", "Latency", "Each batch's seconds on the driver and its slowest task."),
    ("rows_in_out", "Rows in and out", "Input rows handed to the processor and output rows it emitted."),
    ("bytes_uploaded", "Bytes uploaded", "What the batch uploaded to the blob store, and its deltas' size."),
    ("restore_seconds", "Restore seconds per partition", "Seconds each task spent loading its state."),
    (
        "state_size",
        "State size",
        "The query's own state keys after each batch (RocksDB's estimate); a side stream's store (adjunct)"
        " is drawn apart, never as state.",
    ),
    ("snapshots", "Snapshots", "Partitions whose state after the batch was snapshotted (and committed)."),
]
STATE_FILES_CAPTION = (
    " Red squares: the size of the RocksDB files of each committed snapshot, at the batch whose state it"
    " holds."
)
"""Added to the state size plot's caption when it draws that series (some snapshot index was read)."""

STANDBY_PLOTS: list[tuple[str, str, str]] = [
    ("standby_lag", "Standby lag", "Versions each partition's furthest standby is behind the commit."),
    ("failovers", "Failovers", "Partitions that moved to a standby, or cold, when their executor was lost."),
]


def has_standby(rows: Sequence[BatchMetrics]) -> bool:
    """Whether any batch ran with standbys or lost a partition's executor (then lag and failovers are
    plotted)."""
    return any(r.standby is not None and r.standby.eventful for r in rows)


def render_plots(rows: Sequence[BatchMetrics], progress: Progress | None = None) -> list[Plot]:
    """Every plot for ``rows`` (standby plots only when some commit carries standby metrics)."""
    if not rows:
        raise ReportError("no committed versions to plot")
    figures = _Figures(rows)
    wanted = PLOTS + (STANDBY_PLOTS if has_standby(rows) else [])
    plots = []
    for i, (name, title, caption) in enumerate(wanted):
        if progress is not None:
            progress(i, len(wanted), "plots")
        png = getattr(figures, name)()
        if name == "state_size" and figures.drew_state_files:
            caption += STATE_FILES_CAPTION
        plots.append(Plot(name, title, caption, png))
    if progress is not None:
        progress(len(wanted), len(wanted), "plots")
    return plots


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: float | None, fmt: str = "{:,}") -> str:
    return "-" if value is None else fmt.format(value)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.summary td { text-align: left; } img { max-width: 100%; } .caption { color: #555; font-size: 0.9em; }
"""


def _operators(ids: Sequence[str]) -> str:
    """``1 (id 0)``: how many operators, then their ids (an id alone, ``0``, reads as a count)."""
    return f"{len(ids)} (id{'s' if len(ids) != 1 else ''} {', '.join(ids)})"


def failover_summary(rows: Sequence[BatchMetrics]) -> str:
    """The report header's failovers, counted as the failovers plot draws them: ``2 to a standby, 1 cold
    (no standby)``, and the tasks Spark's scheduler ran elsewhere while their executor lived (no
    failover)."""
    standbys = [r.standby for r in rows if r.standby is not None]
    text = (
        f"{sum(s.failovers for s in standbys)} to a standby, "
        f"{sum(s.failovers_without_standby for s in standbys)} cold (no standby)"
    )
    elsewhere = sum(1 for s in standbys for m in s.moves if m.reason == "elsewhere")
    if elsewhere:
        text += f"; {elsewhere} task(s) Spark ran on another executor while theirs lived (no failover)"
    return text


def _summary_table(summary: CheckpointSummary, rows: Sequence[BatchMetrics]) -> str:
    first, last = rows[0], rows[-1]
    span_s = (last.created_time_ms - first.created_time_ms) / 1000
    holes = f"; missing versions: {', '.join(map(str, summary.missing[:20]))}" if summary.missing else ""
    items = [
        ("checkpoint", summary.url),
        ("query id", summary.query_id),
        ("partitions", str(summary.num_partitions)),
        ("operators", _operators(summary.operators)),
        (
            "batches",
            f"{len(summary.versions)} committed, {first.batch_id} .. {last.batch_id}"
            f" (versions {first.version} .. {last.version}){holes}",
        ),
        ("time span", f"{_time(first.created_time_ms)} .. {_time(last.created_time_ms)} ({span_s:,.1f} s)"),
        ("snapshots", f"{sum(r.snapshots for r in rows)} partition snapshots committed"),
    ]
    if has_standby(rows):
        items.append(("failovers", failover_summary(rows)))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="summary">{body}</table>'


def _batch_table(rows: Sequence[BatchMetrics]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "batch",
            "version",
            "committed",
            "rows in",
            "rows out",
            "batch s",
            "uploaded B",
            "restore s",
            "state keys",
            "checkpoint",
        )
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(c)}</td>"
            for c in (
                str(r.batch_id),
                str(r.version),
                _time(r.created_time_ms),
                _cell(r.input_rows),
                _cell(r.output_rows),
                _cell(r.seconds, "{:.3f}"),
                _cell(r.bytes_uploaded),
                _cell(r.restore_seconds, "{:.3f}"),
                _cell(state_key_series(r)["state"]),
                r.checkpoint_kind,
            )
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page_html(summary: CheckpointSummary, rows: Sequence[BatchMetrics], plots: Sequence[Plot]) -> str:
    """The self-contained page: the summary, every plot as a data URI, and the per-batch table."""
    sections = []
    for plot in plots:
        data = base64.b64encode(plot.png).decode("ascii")
        sections.append(
            f'<section id="{plot.name}"><h2>{html.escape(plot.title)}</h2>'
            f'<p class="caption">{html.escape(plot.caption)}</p>'
            f'<img alt="{html.escape(plot.title)}" src="data:image/png;base64,{data}"></section>'
        )
    title = f"blobstate report: {summary.query_id}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"{_summary_table(summary, rows)}{''.join(sections)}<h2>Per batch</h2>{_batch_table(rows)}"
        "</body></html>\n"
    )


def write_report(
    summary: CheckpointSummary,
    rows: Sequence[BatchMetrics],
    out_dir: Path,
    progress: Progress | None = None,
    *,
    force: bool = False,
) -> tuple[Path, list[Path]]:
    """Write ``index.html`` and one ``<plot>.png`` per plot into ``out_dir``; returns their paths.

    Through :func:`blobstate.report.output.write_outputs`: never through a symbolic link, never over a
    file an earlier report did not write (unless ``force``); a plot's PNG an earlier report wrote but
    not drawn this time is removed, so the directory always matches the page.
    """
    from blobstate.report.output import write_outputs

    plots = render_plots(rows, progress)
    files = {f"{plot.name}.png": plot.png for plot in plots}
    files[PAGE_NAME] = page_html(summary, rows, plots).encode("utf-8")
    write_outputs(out_dir, files, force=force)
    return out_dir / PAGE_NAME, [out_dir / f"{plot.name}.png" for plot in plots]


__all__ = [
    "PAGE_NAME",
    "PLOTS",
    "STANDBY_PLOTS",
    "Plot",
    "ReportError",
    "page_html",
    "pyplot",
    "render_plots",
    "write_report",
]
