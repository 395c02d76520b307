"""The two pictures of a benchmarks run: throughput against rows per batch, and a winner map.

matplotlib is an optional extra (``pip install 'prep[bench]'``): without it
:func:`draw` says so in one line and returns no paths. Figures are drawn with
the Agg canvas directly, never through pyplot, so no GUI backend is touched and
the caller's matplotlib settings stay as they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .grid import AUTO, FIRST_CALLS, LOOP, PLAIN_JOBLIB, label, uses_workers
from .peers import PEERS
from .results import Cell, Results

__all__ = ["COLORS", "draw"]

#: one color per variant, the same in both pictures
COLORS = {
    "serial": "#4c4c4c",
    "threads": "#1f77b4",
    "processes": "#d62728",
    "joblib": "#ff7f0e",
    "vectorized": "#2ca02c",
    "vmap": "#bcbd22",
    AUTO: "#9467bd",
    LOOP: "#8c564b",
    PLAIN_JOBLIB: "#e377c2",
    # the peers (--peers), dash-dotted
    "mp_pool": "#aec7e8",
    "cf_processes": "#ff9896",
    "cf_threads": "#98df8a",
    "joblib_loky": "#ffbb78",
    "mpire": "#c5b0d5",
    "torchdata_threads": "#c49c94",
    "torchdata_processes": "#f7b6d2",
    "dataloader": "#7f7f7f",
}
_OTHER = "#17becf"
_STYLE = {AUTO: ":", LOOP: "--", PLAIN_JOBLIB: "--"}
_PEER_STYLE = "-."


def _matplotlib() -> tuple[Any, Any, Any] | None:
    """(Figure, FigureCanvasAgg, Rectangle), or None where matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        return None
    return Figure, FigureCanvasAgg, Rectangle


def draw(results: Results, out: Path, note: Callable[[str], None] = print) -> list[Path]:
    """Write ``throughput.png`` and ``winners.png`` into ``out``; the paths written."""
    mpl = _matplotlib()
    if mpl is None:
        note("matplotlib is not installed: PNG plots skipped (pip install 'prep[bench]')")
        return []
    if not any(c.status == "ok" for c in results.cells):
        note("no cell has a result: PNG plots skipped")
        return []
    return [
        _throughput(results, out / "throughput.png", mpl),
        _winners(results, out / "winners.png", mpl),
    ]


def _save(fig: Any, canvas_cls: Any, path: Path) -> Path:
    canvas_cls(fig)
    fig.savefig(path, dpi=110)
    return path


def _throughput(results: Results, path: Path, mpl: tuple[Any, Any, Any]) -> Path:
    """One panel per workload: rows/s against rows per batch, a line per variant."""
    figure_cls, canvas_cls, _ = mpl
    workloads = list(results.workloads)
    workers = max(results.grid["workers"])
    cols = min(3, len(workloads))
    nrows = math.ceil(len(workloads) / cols)
    fig = figure_cls(figsize=(4.6 * cols, 3.4 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    seen: dict[str, Any] = {}
    for ax, workload in zip(axes, workloads):
        lines: dict[str, list[Cell]] = {}
        for c in results.cells:
            ok = c.status == "ok" and c.rows_per_s is not None and c.executor not in FIRST_CALLS
            if ok and c.workload == workload and c.workers == workers:
                lines.setdefault(c.executor, []).append(c)
        for name, cells in lines.items():
            cells.sort(key=lambda c: c.rows)
            (line,) = ax.plot(
                [c.rows for c in cells],
                [c.rows_per_s for c in cells],
                _STYLE.get(name, _PEER_STYLE if name in PEERS else "-"),
                marker="o",
                markersize=4,
                color=COLORS.get(name, _OTHER),
                label=label(name),
            )
            seen.setdefault(label(name), line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(results.grid["rows"], [str(r) for r in results.grid["rows"]])
        ax.set_xticks([], minor=True)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("rows per batch", fontsize=8)
        ax.set_ylabel("rows / s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
        if not lines:
            ax.text(0.5, 0.5, "no result", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[len(workloads) :]:
        ax.set_visible(False)
    fig.suptitle(f"Throughput, {workers} worker(s) (higher is better)", fontsize=11)
    fig.legend(
        list(seen.values()),
        list(seen),
        loc="outside lower center",
        ncols=min(4, len(seen)),
        fontsize=8,
    )
    return _save(fig, canvas_cls, path)


def _winners(results: Results, path: Path, mpl: tuple[Any, Any, Any]) -> Path:
    """Workload x rows per batch, each square colored by its fastest variant (any workers)."""
    figure_cls, canvas_cls, rect_cls = mpl
    workloads = list(results.workloads)
    rows = sorted(set(results.grid["rows"]))
    best: dict[tuple[str, int], Cell] = {}
    for key, _ in results.groups():
        win = results.winner(key)
        if win is None or win.median_s is None:
            continue
        held = best.get(key[:2])
        if held is None or win.median_s < (held.median_s or math.inf):
            best[key[:2]] = win
    fig = figure_cls(
        figsize=(1.7 * len(rows) + 3.2, 0.62 * len(workloads) + 1.6), layout="constrained"
    )
    ax = fig.subplots()
    for i, workload in enumerate(workloads):
        for j, r in enumerate(rows):
            cell = best.get((workload, r))
            color = COLORS.get(cell.executor, _OTHER) if cell else "#dddddd"
            ax.add_patch(rect_cls((j - 0.5, i - 0.5), 1, 1, facecolor=color, edgecolor="white"))
            text = "no result"
            if cell is not None:
                speed = f"{cell.speedup:.2g}x serial" if cell.speedup else ""
                if uses_workers(cell.executor):
                    speed += f", {cell.workers} workers"
                text = f"{label(cell.executor)}\n{speed}".strip()
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white" if cell else "black",
            )
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylim(len(workloads) - 0.5, -0.5)
    ax.set_xticks(range(len(rows)), [str(r) for r in rows], fontsize=8)
    ax.set_yticks(range(len(workloads)), workloads, fontsize=8)
    ax.set_xlabel("rows per batch", fontsize=9)
    ax.set_title("Fastest variant (workers: best of those timed)", fontsize=10)
    order = list(COLORS)
    used = sorted(
        {c.executor for c in best.values()},
        key=lambda n: order.index(n) if n in order else len(order),
    )
    ax.legend(
        handles=[
            rect_cls((0, 0), 1, 1, facecolor=COLORS.get(n, _OTHER), label=label(n)) for n in used
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    return _save(fig, canvas_cls, path)
