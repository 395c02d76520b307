"""Timing that survives a noisy, shared machine: interleaved repeats and medians.

Every repeat runs each variant once, in an order that rotates from repeat to
repeat, so a slow spell of the machine hits all variants alike; ratios are
taken between medians measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Timing", "interleaved", "ms", "table", "times"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one variant: the median and the spread of the repeats."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repeats were."""
        return (self.high - self.low) / self.median if self.median else 0.0


def interleaved(
    variants: Mapping[str, Callable[[], object]], repeat: int = 7, warmup: int = 1
) -> dict[str, Timing]:
    """Time each variant ``repeat`` times, interleaved; ``warmup`` untimed rounds first."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            variants[name]()
            samples[name].append(time.perf_counter() - start)
    return {
        name: Timing(statistics.median(s), min(s), max(s), tuple(s)) for name, s in samples.items()
    }


def ms(seconds: float | None) -> str:
    """Milliseconds, 3 significant digits but never in e-notation."""
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def times(ratio: float | None) -> str:
    """A ratio as ``1.23x``."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(rows: list[list[str]], header: list[str]) -> str:
    """A markdown table."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
