"""How ``prep bench`` results read: the terminal table, the summary, report.md and the files.

:func:`write` puts everything into one folder::

    results.json   every figure, the grid and the environment (Results.to_dict)
    table.txt      the terminal table: one row per cell, the winner of each group starred
    report.md      environment, summary of who wins where, auto vs the winner, the tables
    throughput.png rows/s against rows per batch, one panel per workload (needs matplotlib)
    winners.png    the fastest variant for each workload and rows per batch
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .results import (
    AUTO,
    AUTO_FIRST,
    LOOP,
    PLAIN_JOBLIB,
    POOLS,
    WITHIN,
    Cell,
    Results,
    label,
    uses_workers,
)
from .timing import table

__all__ = ["markdown", "summary", "terminal_table", "write"]


def _ms(seconds: float | None) -> str:
    """Milliseconds, 3 significant digits but never in e-notation."""
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _rate(cell: Cell) -> str:
    return "-" if cell.rows_per_s is None else f"{cell.rows_per_s:,.0f}"


def _startup(cell: Cell) -> str:
    b = cell.breakdown
    if "calibration_s" in b:
        return f"{b['calibration_s'] * 1e3:.3g} (calibration)"
    return _ms(b.get("startup_s")) if "startup_s" in b else ""


def _note(cell: Cell, width: int = 70) -> str:
    text = " ".join(cell.note.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def terminal_table(results: Results) -> str:
    """One row per cell; ``*`` marks the winner of its group (workload, rows, workers)."""
    body = []
    for c in results.cells:
        status = "" if c.status == "ok" else c.status.upper() + ": "
        body.append(
            [
                c.workload,
                str(c.rows),
                str(c.workers),
                ("* " if c.winner else "  ") + c.label,
                _ms(c.median_s),
                "-" if c.spread is None else f"{c.spread:.0%}",
                _rate(c),
                _x(c.speedup),
                _startup(c),
                status + _note(c),
            ]
        )
    header = ["workload", "rows", "workers", "variant", "median ms", "spread", "rows/s"]
    header += ["vs serial", "start-up ms", "note"]
    return (
        table(body, header) + "\n* fastest in its group (auto and estimated cells do not compete)"
    )


def _runs(points: list[tuple[int, str]]) -> list[tuple[str, list[int]]]:
    """Consecutive rows values with the same winner, merged: [(name, [rows, ...]), ...]."""
    runs: list[tuple[str, list[int]]] = []
    for rows, name in points:
        if runs and runs[-1][0] == name:
            runs[-1][1].append(rows)
        else:
            runs.append((name, [rows]))
    return runs


def _span(rows: list[int]) -> str:
    return f"{rows[0]}" if len(rows) == 1 else f"{rows[0]}-{rows[-1]}"


def _workload_line(results: Results, workload: str) -> str | None:
    """'python: serial at 16 rows; processes at 64-256 rows (1.9x serial, 2 workers). Why: ...'"""
    best_by_rows: dict[int, Cell] = {}
    for key, _ in results.groups():
        win = results.winner(key) if key[0] == workload else None
        if win is None or win.median_s is None:
            continue
        held = best_by_rows.get(key[1])
        if held is None or win.median_s < (held.median_s or float("inf")):
            best_by_rows[key[1]] = win
    if not best_by_rows:
        return None
    rows_sorted = sorted(best_by_rows)
    parts = []
    for name, rows in _runs([(r, best_by_rows[r].executor) for r in rows_sorted]):
        cells = [best_by_rows[r] for r in rows]
        speedups = [c.speedup for c in cells if c.speedup is not None]
        fig = ""
        if speedups and name != "serial":
            lo, hi = min(speedups), max(speedups)
            fig = f"{lo:.2f}x serial" if len(speedups) == 1 else f"{lo:.2f}-{hi:.2f}x serial"
            if uses_workers(name):
                fig += f", {cells[-1].workers} worker{'s' * (cells[-1].workers > 1)}"
        parts.append(f"{label(name)} at {_span(rows)} rows" + (f" ({fig})" if fig else ""))
    why = _why(results, best_by_rows[rows_sorted[-1]])
    return (
        f"- **{workload}**: "
        + "; ".join(parts)
        + "."
        + (f" Why, at {rows_sorted[-1]} rows: {why}." if why else "")
    )


def _why(results: Results, win: Cell) -> str:
    """The measured reason ``win`` won its group, in a clause."""
    group = {c.executor: c for c in results.cells if c.key == win.key and c.status == "ok"}
    serial = group.get("serial")
    per_row = (
        f"{serial.median_s / serial.rows * 1e6:,.0f} us a row" if serial and serial.median_s else ""
    )
    name = win.executor
    if name in ("vectorized", "vmap"):
        return f"one batched call replaces {win.rows} calls of the row function" + (
            f" (serial: {per_row})" if per_row else ""
        )
    if name in ("serial", LOOP):
        pools = [group[n] for n in (*POOLS, PLAIN_JOBLIB) if n in group and group[n].median_s]
        if not pools or not per_row:
            return ""
        best = min(pools, key=lambda c: c.median_s or 0.0)
        return (
            f"at {per_row}, handing rows to workers saves too little: the best parallel "
            f"variant, {label(best.executor)}, took {1 / (best.speedup or 1):.2f}x serial's "
            f"time, {label(name)} {1 / (win.speedup or 1):.2f}x"
        )
    text = f"{win.workers} workers share {per_row}" if per_row else ""
    b = win.breakdown
    if "overhead_est_s" in b:
        text += f"; ~{_ms(max(0.0, b['overhead_est_s']))} ms a call beyond an even split"
    if "calls_to_repay_startup" in b and name != "threads":
        repay = b["calls_to_repay_startup"]
        calls = max(1, round(repay))
        text += f"; its {_ms(b['startup_s'])} ms start-up is repaid after {calls} call"
        text += "s" * (calls > 1)
    if name == "threads":
        text += " (threads gain only where the row work runs outside the GIL)"
    return text.strip("; ")


def _vectorized_line(results: Results) -> str | None:
    """How the batched twin compares with the loop users write, where both ran."""
    ratios: list[tuple[float, Cell]] = []
    for _, cells in results.groups():
        by = {c.executor: c for c in cells if c.status == "ok" and c.median_s}
        if "vectorized" in by and LOOP in by:
            loop, vec = by[LOOP].median_s, by["vectorized"].median_s
            ratios.append((loop / vec, by["vectorized"]))  # type: ignore[operator]
    if not ratios:
        return None
    lo, hi = min(ratios, key=lambda r: r[0]), max(ratios, key=lambda r: r[0])
    text = (
        f"- Where a batched twin exists, vectorized runs at {lo[0]:.2g}x "
        f"({lo[1].workload}, {lo[1].rows} rows) to {hi[0]:.2g}x ({hi[1].workload}, "
        f"{hi[1].rows} rows) the speed of the loop + torch.stack"
    )
    if lo[0] < 1:
        text += "; below 1x, the batch is too small to pay for the batched call's fixed cost"
    return text + "."


def _naive_line(results: Results) -> str | None:
    ratios, skipped = [], 0
    for _, cells in results.groups():
        by = {c.executor: c for c in cells}
        naive = by.get(PLAIN_JOBLIB)
        if naive is None:
            continue
        skipped += naive.status == "skipped"
        ours = by.get("joblib")
        if naive.median_s and ours and ours.median_s and naive.workers > 1:
            ratios.append(naive.median_s / ours.median_s)
    if not ratios and not skipped:
        return None
    text = "- Plain joblib.Parallel over row views"
    if ratios:
        text += (
            f" took {min(ratios):.2g}-{max(ratios):.2g}x the time of prep's joblib executor "
            f"with the same workers (each row pickles the whole batch; prep ships each row once)"
        )
    if skipped:
        text += f"; skipped in {skipped} group(s) whose batch is over 64 MB"
    return text + "."


def _auto_line(results: Results) -> str | None:
    auto = results.auto_summary()
    groups = auto["groups"]
    if not groups:
        return None
    n = len(groups)

    def share(name: str) -> str:
        return f"{round(auto[name] * n)} of {n} groups ({auto[name]:.0%})"

    parts = []
    if auto["auto_calls_within"] is not None:
        calls = next(g["calls"] for g in groups if g["calls"])
        parts.append(
            f"over a fresh pool's first {calls} calls (calibration and start-up included, "
            f"for every executor alike) in {share('auto_calls_within')}"
        )
    if auto["auto_within"] is not None:
        parts.append(f"warm in {share('auto_within')}")
    if auto["auto_first_within"] is not None:
        parts.append(f"on its first call alone in {share('auto_first_within')}")
    text = f"- auto is within {WITHIN}x of the best executor " + "; ".join(parts)
    worst = max(groups, key=lambda g: g["auto_calls_ratio"] or g["auto_ratio"] or 0.0)
    ratio = worst["auto_calls_ratio"] or worst["auto_ratio"]
    if ratio:
        text += (
            f". Worst: {worst['workload']} at {worst['rows']} rows, {worst['workers']} "
            f"worker(s): {ratio:.2f}x the best ({label(worst['best'])})"
        )
    return text + "."


def _startup_line(results: Results) -> str | None:
    found = [s for s in results.startup if s.startup_s is not None]
    if not found:
        return None
    top = max(s.workers for s in found)
    parts = [f"{s.executor} {_ms(s.startup_s)} ms" for s in found if s.workers == top]
    return f"- Starting a fresh pool of {top} worker(s) costs " + ", ".join(parts) + "."


def summary(results: Results) -> list[str]:
    """Who wins where, with figures: one markdown bullet per workload, then the rest."""
    lines = [_workload_line(results, w) for w in results.workloads]
    lines += [_vectorized_line(results), _naive_line(results), _auto_line(results)]
    lines.append(_startup_line(results))
    lines += _failure_lines(results)
    return [line for line in lines if line]


def _failure_lines(results: Results) -> list[str]:
    """One line per variant that failed somewhere: on which workloads, and the first error."""
    by_variant: dict[str, list[Cell]] = {}
    for c in results.cells:
        if c.status == "failed":
            by_variant.setdefault(c.executor, []).append(c)
    lines = []
    for name, cells in by_variant.items():
        workloads = list(dict.fromkeys(c.workload for c in cells))
        first = _note(cells[0], 90)
        lines.append(
            f"- {label(name)} failed in {len(cells)} cell(s), on {', '.join(workloads)} "
            f"(e.g. {first})."
        )
    return lines


def _breakdown_text(cell: Cell) -> str:
    b = cell.breakdown
    parts = []
    if "compute_est_s" in b:
        parts.append(
            f"compute~{b['compute_est_s'] * 1e3:.3g} + overhead~{b['overhead_est_s'] * 1e3:.3g}"
        )
    if "moved_mb" in b:
        mb = b["moved_mb"]
        parts.append(f"moves {mb:.3g} MB" if mb >= 1 else f"moves {mb * 1024:.3g} KB")
    return "; ".join(parts)


def _workload_table(results: Results, workload: str) -> str:
    body = []
    for c in results.cells:
        if c.workload != workload:
            continue
        spread = "-" if c.low_s is None else f"{_ms(c.low_s)}-{_ms(c.high_s)}"
        if c.spread is not None:
            spread += f" ({c.spread:.0%})"
        body.append(
            [
                str(c.rows),
                str(c.workers),
                ("**" + c.label + "**") if c.winner else c.label,
                _ms(c.median_s),
                spread,
                _rate(c),
                _x(c.speedup),
                _startup(c),
                _breakdown_text(c),
                ("" if c.status == "ok" else c.status + ": ") + " ".join(c.note.split()),
            ]
        )
    header = ["rows", "workers", "variant", "median ms", "min-max ms (spread)", "rows/s"]
    header += ["vs serial", "start-up ms", "breakdown ms (estimates)", "note"]
    return table(body, header)


def markdown(results: Results, plots: list[str] | None = None) -> str:
    """report.md: environment, summary, auto vs the winner, start-up, one table per workload."""
    env = results.environment
    grid = results.grid
    out = ["# prep bench", ""]
    out.append(
        table(
            [[k, str(v)] for k, v in env.items()] + [["wall time", f"{results.wall_s:.0f} s"]],
            ["environment", ""],
        )
    )
    out += [
        "",
        f"Grid: workloads {', '.join(grid['workloads'])}; variants {', '.join(grid['executors'])}; "
        f"rows {grid['rows']}; workers {grid['workers']}; {grid['repeat']} interleaved repeats "
        f"per cell (median; spread = (max - min) / median).",
        "",
        "## Who wins where",
        "",
        *summary(results),
        "",
    ]
    out += [f"![{p}]({p})" for p in plots or []]
    auto = results.auto_summary()
    if auto["groups"]:
        body = [
            [
                g["workload"],
                str(g["rows"]),
                str(g["workers"]),
                label(g["winner"]) if g["winner"] else "-",
                label(g["best"]),
                _ms(g["best_s"]),
                _ms(g["auto_s"]),
                _x(g["auto_ratio"]),
                _ms(g["auto_first_s"]),
                _x(g["auto_first_ratio"]),
                _ms(g["auto_calls_s"]),
                _ms(g["best_calls_s"]),
                _x(g["auto_calls_ratio"]),
            ]
            for g in auto["groups"]
        ]
        header = ["workload", "rows", "workers", "winner", "best executor", "best ms"]
        header += ["auto ms", "auto/best", "auto first call ms", "first/best"]
        header += ["auto, N calls ms", "best, N calls + start-up ms", "N calls/best"]
        calls = next((g["calls"] for g in auto["groups"] if g["calls"]), None)
        out += [
            "",
            f"## {AUTO} against the best executor",
            "",
            f"N = {calls} calls of one fresh pool: auto's first call plus N - 1 times its "
            f"warm median, against the best executor's median times N plus its pool's "
            f"start-up.",
            "",
            table(body, header),
            "",
        ]
    if results.startup:
        body = [
            [
                s.executor,
                str(s.workers),
                _ms(s.first_call_s),
                _ms(s.warm_s),
                _ms(s.startup_s),
                s.error or "",
            ]
            for s in results.startup
        ]
        out += ["## Pool start-up (a fresh prep.Pool on 64 no-op rows)", ""]
        out += [table(body, ["executor", "workers", "first call ms", "warm ms", "start-up ms", ""])]
    for workload, about in results.workloads.items():
        out += ["", f"## {workload}", "", about, "", _workload_table(results, workload)]
    out += ["", "## How to read this", "", *NOTES]
    return "\n".join(out) + "\n"


NOTES = [
    "- Every cell's repeats are interleaved with the other variants of its group, so a slow "
    "spell of the machine hits all of them alike; the first call of each variant is untimed "
    "and its result is checked against serial's (a variant that raises or differs fails).",
    f"- `{label(AUTO_FIRST)}` is auto's first call for that group in this process, timed "
    "alone; if auto's calibration was already cached for the signature, it is a warm call.",
    "- Start-up is a fresh prep.Pool's first call minus its warm calls, measured once per "
    "executor and workers; the first process pool of an interpreter also starts the "
    "forkserver. 'start-up is repaid after N calls' divides it by the time saved per call.",
    "- The executors report no dispatch/compute/transfer split, so the breakdown is an "
    "estimate: compute = serial's time / workers (an even split), overhead = the rest "
    "(dispatch, transfer, waiting on the GIL, imbalance); 'moves' is the bytes copied "
    "between processes by design (shared memory for processes, pickles for joblib).",
    f"- `{label(LOOP)}` is the seed's `torch.stack([fn(*row) for row in zip(*columns)])`; "
    f"`{label(PLAIN_JOBLIB)}` is `joblib.Parallel(n_jobs=workers)(delayed(fn)(*row) ...)`. "
    "It pickles the whole batch for every row: it is skipped for batches over 64 MB, and "
    "timed on as many rows as ship 256 MB a call, then scaled (marked estimated; such "
    "cells do not compete for the winner).",
]


def write(results: Results, out: Path, note: Callable[[str], None] = print) -> list[Path]:
    """Write results.json, table.txt, report.md and the PNGs into ``out``; return the paths."""
    from .plots import draw

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "table.txt", out / "report.md"]
    data = results.to_dict()
    data["summary"] = summary(results)
    written[0].write_text(json.dumps(data, indent=2) + "\n")
    written[1].write_text(terminal_table(results) + "\n")
    pngs = draw(results, out, note=note)
    written[2].write_text(markdown(results, [p.name for p in pngs]))
    return written + pngs
