"""How a cell's figures read in a table: milliseconds, ratios, rows/s, start-up, notes."""

from __future__ import annotations

from .results import Cell

__all__ = ["ms", "note", "rate", "startup", "times"]


def ms(seconds: float | None) -> str:
    """Milliseconds, 3 significant digits but never in e-notation."""
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def times(ratio: float | None) -> str:
    """A ratio as ``1.23x``."""
    return "-" if ratio is None else f"{ratio:.2f}x"


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
