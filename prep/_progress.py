"""``progress=True``: a tqdm bar of rows (or batches, for a stream), moved from
where rows finish (each block a thread writes, each chunk a worker returns), not
only at the end. On a stderr that is not a terminal it prints nothing: a log
file or CI has no use for carriage returns."""

from __future__ import annotations

import sys
import threading
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
