"""Who wins where, in words: one markdown bullet per workload, then the findings across them.

Each bullet carries its figures (speed-ups, workers, start-up, the measured
reason a variant won), so the summary reads without the tables.
"""

from __future__ import annotations

from typing import Any

from .alternatives import against_peers
from .auto_vs_best import WITHIN, summarize
from .cell_text import ms, note
from .grid import LOOP, PLAIN_JOBLIB, POOLS, label, uses_workers
from .results import Cell, Results

__all__ = ["summary"]


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
        text += f"; ~{ms(max(0.0, b['overhead_est_s']))} ms a call beyond an even split"
    if "calls_to_repay_startup" in b and name != "threads":
        repay = b["calls_to_repay_startup"]
        calls = max(1, round(repay))
        text += f"; its {ms(b['startup_s'])} ms start-up is repaid after {calls} call"
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
    auto = summarize(results)
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


def _peers_line(results: Results) -> str | None:
    """prep against the best peer tool: in how many groups it keeps up, and the worst one."""
    found = against_peers(results)
    groups = [g for g in found["groups"] if g["best_ratio"] is not None]
    if not groups:
        return None
    n = len(groups)
    kept = round(found["best_at_most_peer"] * n)
    text = (
        f"- Against the best peer tool, prep's best executor is as fast or faster in "
        f"{kept} of {n} groups"
    )
    if found["auto_at_most_peer"] is not None:
        text += f", auto (warm) in {round(found['auto_at_most_peer'] * n)}"

    def where(g: dict[str, Any]) -> str:
        return f"{g['workload']}, {g['rows']} rows, against {label(g['best_peer'])}"

    lo = min(groups, key=lambda g: g["best_ratio"])
    hi = max(groups, key=lambda g: g["best_ratio"])
    text += f"; prep's time is {lo['best_ratio']:.2f}x the peer's ({where(lo)})"
    if hi is not lo:
        text += f" to {hi['best_ratio']:.2f}x ({where(hi)})"
    return text + "."


def _startup_line(results: Results) -> str | None:
    found = [s for s in results.startup if s.startup_s is not None]
    if not found:
        return None
    top = max(s.workers for s in found)
    parts = [f"{s.executor} {ms(s.startup_s)} ms" for s in found if s.workers == top]
    return f"- Starting a fresh pool of {top} worker(s) costs " + ", ".join(parts) + "."


def summary(results: Results) -> list[str]:
    """Who wins where, with figures: one markdown bullet per workload, then the rest."""
    lines = [_workload_line(results, w) for w in results.workloads]
    lines += [_vectorized_line(results), _naive_line(results), _auto_line(results)]
    lines.append(_peers_line(results))
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
        first = note(cells[0], 90)
        lines.append(
            f"- {label(name)} failed in {len(cells)} cell(s), on {', '.join(workloads)} "
            f"(e.g. {first})."
        )
    return lines
