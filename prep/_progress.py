"""``progress=True``: a tqdm bar of rows (or batches, for a stream), moved from
where rows finish (each block a thread writes, each chunk a worker returns), not
only at the end. On a stderr that is not a terminal it prints nothing: a log
file or CI has no use for carriage returns."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from tqdm import tqdm


def on_terminal() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def bar(total: int | None, unit: str, desc: str | None = None) -> Any:
    """A tqdm bar on stderr, or None off a terminal."""
    if not on_terminal():
        return None
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


class RowProgress:
    """``advance(n)`` from any thread: n more rows finished."""

    def __init__(self, total: int, desc: str | None = None) -> None:
        self._bar = bar(total, "row", desc)
        self._lock = threading.Lock()

    def advance(self, rows: int) -> None:
        if self._bar is not None and rows:
            with self._lock:
                self._bar.update(rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class BatchProgress:
    """A stream's bar: batches done, with the rows a second over the stream so far."""

    def __init__(self) -> None:
        self._bar = bar(None, "batch")
        self._rows = 0
        self._start = time.perf_counter()

    def advance(self, rows: int) -> None:
        if self._bar is None:
            return
        self._rows += rows
        rate = self._rows / max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix_str(f"{rate:,.0f} rows/s", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
