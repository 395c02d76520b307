"""What a pool learned of each row function from its last batch.

* :class:`Shapes`: the output shape of each function and row layout: the next
  batch's output is made before any row runs, for the workers to write their rows
  in place. ``map_rows`` on ``processes`` and a stream's split batches both guess
  from it (one table per pool of workers, so each learns from the other), and both
  run a batch again as the first one ran when a guess proves wrong (a ``StackError``).
* :class:`RowCosts`: what a row of each function costs a worker, so that a batch is
  cut into no more parts than pay for their messages (:meth:`RowCosts.parts`).
"""

from __future__ import annotations

import math
from typing import Any

from .._kept import keep_newest
from ..core.output import Output
from ._fdpipe import INLINE
from ._transport import check_shm

__all__ = ["PART_WORK", "SHAPES", "RowCosts", "Shapes"]

#: (function, layout) pairs whose output shape a pool remembers
SHAPES = 16
#: seconds of a worker's work a part of a batch must carry to be worth a part of its
#: own: each part costs the caller about 0.2-0.3 ms (a message out, one back, a merge)
#: on the 2-core machine ``scripts/bench_engine.py`` ran on, so halving 0.5 ms of work
#: saves about what the second part costs
PART_WORK = 5e-4


class Shapes:
    """The last output shape of each key (a function's, and its rows' layout)."""

    def __init__(self) -> None:
        self._last: dict[Any, Output] = {}  # key -> a 0-row output shaped like its last

    def guess(self, key: Any, rows: int, shared: bool) -> Output | None:
        """An output of ``rows`` rows shaped as the last of ``key`` was; None where that is
        unknown. ``shared`` (for worker processes): in shared memory, and None where
        each buffer is small enough to come back inside a message (a copy, cheaper
        than a new segment); a ConfigError where /dev/shm has no room for it."""
        like = self._last.get(key)
        if like is None:
            return None
        if not shared:
            return like.like(rows)
        sizes = [rows * math.prod(b.shape[1:]) * b.element_size() for b in like.buffers]
        if min(sizes) <= INLINE:
            return None
        check_shm(sum(sizes), "the output")
        return like.like(rows, shared=True)

    def keep(self, key: Any, out: Output) -> None:
        keep_newest(self._last, key, out.like(0), SHAPES)

    def forget(self, key: Any) -> None:
        """A guess for ``key`` proved wrong: the next batch shapes its output again."""
        self._last.pop(key, None)


class RowCosts:
    """Seconds a row of each function (by its key) took in a worker, in its last batch."""

    def __init__(self) -> None:
        self._per_row: dict[str, float] = {}

    def parts(self, key: str, rows: int, workers: int) -> int:
        """How many parts ``rows`` rows are worth: one per worker until the function has
        been timed, then no more than carry ``PART_WORK`` each (a batch of light rows
        goes whole to one worker: two messages, not four)."""
        per_row = self._per_row.get(key)
        if per_row is None:
            return workers
        return max(1, min(workers, int(rows * per_row / PART_WORK)))

    def keep(self, key: str, busy: float, rows: int) -> None:
        """A worker took ``busy`` seconds for ``rows`` rows of ``key``'s function."""
        if rows > 0:
            keep_newest(self._per_row, key, busy / rows, SHAPES)
