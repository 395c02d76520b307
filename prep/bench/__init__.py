"""Benchmark harness: which executor wins for which workload (``prep bench``)."""

from __future__ import annotations

from .timing import Timing, interleaved, table

__all__ = ["Timing", "interleaved", "table"]
