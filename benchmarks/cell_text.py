"""How a cell's figures read: milliseconds, ratios, rows/s, start-up, notes, progress lines."""

from __future__ import annotations

import math

from prep.bench.timing import ms, times

from .results import Cell

__all__ = ["group_line", "ms", "note", "rate", "startup", "times"]


def rate(cell: Cell) -> str:
    """Rows per second, as a whole number."""
    return "-" if cell.rows_per_s is None else f"{cell.rows_per_s:,.0f}"


def startup(cell: Cell) -> str:
    """The start-up a cell paid (auto: its calibration), in ms; '' if none was measured."""
    b = cell.breakdown
    if "calibration_s" in b:
        return f"{b['calibration_s'] * 1e3:.3g} (calibration)"
    return ms(b.get("startup_s")) if "startup_s" in b else ""


def note(cell: Cell, width: int = 70) -> str:
    """A cell's note on one line, cut to ``width`` characters."""
    text = " ".join(cell.note.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def group_line(group: list[Cell]) -> str:
    """A group's progress line: its fastest contender, and how many variants failed."""
    head = group[0] if group else None
    if head is None:
        return ""
    ok = [c for c in group if c.status == "ok" and c.contender and c.median_s is not None]
    failed = sum(c.status == "failed" for c in group)
    best = min(ok, key=lambda c: c.median_s or math.inf) if ok else None
    text = f"{head.workload} rows={head.rows} workers={head.workers}: "
    if best is not None and best.median_s is not None:
        text += f"fastest {best.executor} {best.median_s * 1e3:.2f} ms"
    else:
        text += "no result"
    return text + (f", {failed} failed" if failed else "")
