"""The output shape of each row function and row layout a pool ran last: the next
batch's output is made before any row runs, for the workers to write their rows in
place. ``map_rows`` on ``processes`` and a stream's split batches both guess from
it (one table per pool of workers, so each learns from the other), and both run a
batch again as the first one ran when a guess proves wrong (a ``StackError``).
"""

from __future__ import annotations

import math
from typing import Any

from ..core.output import Output
from ._fdpipe import INLINE
from ._transport import check_shm

__all__ = ["SHAPES", "Shapes"]

#: (function, layout) pairs whose output shape a pool remembers
SHAPES = 16


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
        self._last.pop(key, None)
        self._last[key] = out.like(0)  # the newest last
        while len(self._last) > SHAPES:
            del self._last[next(iter(self._last))]

    def forget(self, key: Any) -> None:
        """A guess for ``key`` proved wrong: the next batch shapes its output again."""
        self._last.pop(key, None)
