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


class CountBar:
    """A bar of items (a stream's batches, ``prep run``'s shards), each with the rows it
    held: ``N rows, R rows/s`` beside the count. On ``file`` (default stderr); None
    off a terminal."""

    def __init__(
        self, unit: str, total: int | None = None, desc: str | None = None, file: Any = None
    ) -> None:
        if file is None:
            self._bar = bar(total, unit, desc)
        else:
            self._bar = tqdm(total=total, unit=unit, desc=desc, file=file, dynamic_ncols=True)
        self._rows = 0
        self._start = time.perf_counter()

    def advance(self, rows: int, note: str | None = None) -> None:
        """One more item, of ``rows`` rows; ``note`` after the rate ("waited 41%")."""
        if self._bar is None:
            return
        self._rows += rows
        rate = self._rows / max(time.perf_counter() - self._start, 1e-9)
        text = f"{self._rows:,} rows, {rate:,.0f} rows/s" + (f", {note}" if note else "")
        self._bar.set_postfix_str(text, refresh=False)
        self._bar.update(1)

    def write(self, line: str, file: Any = None) -> None:
        """A line above the bar."""
        if self._bar is not None:
            self._bar.write(line, file=file)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
