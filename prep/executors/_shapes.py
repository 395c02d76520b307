"""What an engine learned of each row function from its last batches: one record a
function (:class:`Known`), made where the function is prepared to travel
(``engine.prepare(fn)``), so that the key it travels under, its output's shape and
what a row of it costs are kept, and forgotten, together.

* The output shape of each row layout: the next batch's output is made before any
  row runs, for the workers to write their rows in place. ``map_rows`` on
  ``threads``/``processes`` and a stream's split batches both guess from it (one
  record per function per engine, so each learns from the other), and both run a
  batch again as the first one ran when a guess proves wrong (a ``StackError``).
* What a row costs a worker, so that a batch is cut into no more parts than pay for
  their messages (:meth:`Known.parts`).
"""

from __future__ import annotations

import math
from typing import Any

from .._kept import keep_newest
from ..core.output import Output
from ._fdpipe import INLINE
from ._transport import check_shm

__all__ = ["FUNCTIONS", "LAYOUTS", "PART_WORK", "Known"]

#: row functions an engine keeps a record of, the latest used (processes: their pickled
#: bytes too; a worker keeps fewer, and is sent one again when it needs it)
FUNCTIONS = 64
#: row layouts a record remembers an output shape for
LAYOUTS = 4
#: seconds of a worker's work a part of a batch must carry to be worth a part of its
#: own: each part costs the caller about 0.2-0.3 ms (a message out, one back, a merge)
#: on the 2-core machine ``scripts/bench_engine.py`` ran on, so halving 0.5 ms of work
#: saves about what the second part costs
PART_WORK = 5e-4


class Known:
    """What an engine knows of one row function: ``key``, what its units name it by;
    its output's last shape for each row layout; what a row of it costs a worker.
    ``shared``: the engine's workers are other processes, so an output they write in
    place must be in shared memory."""

    def __init__(self, key: Any, shared: bool) -> None:
        self.key, self.shared = key, shared
        self._shapes: dict[Any, Output] = {}  # layout -> a 0-row output shaped like its last
        self._per_row: float | None = None

    def guess(self, layout: Any, rows: int) -> Output | None:
        """An output of ``rows`` rows shaped as the last of ``layout`` was; None where that
        is unknown, or (shared) where each buffer is small enough to come back inside a
        message (a copy, cheaper than a new segment); a ConfigError where /dev/shm has
        no room for it."""
        like = self._shapes.get(layout)
        if like is None:
            return None
        if not self.shared:
            return like.like(rows)
        sizes = [rows * math.prod(b.shape[1:]) * b.element_size() for b in like.buffers]
        if min(sizes) <= INLINE:
            return None
        check_shm(sum(sizes), "the output")
        return like.like(rows, shared=True)

    def keep(self, layout: Any, out: Output) -> None:
        keep_newest(self._shapes, layout, out.like(0), LAYOUTS)

    def forget(self, layout: Any) -> None:
        """A guess for ``layout`` proved wrong: the next batch shapes its output again."""
        self._shapes.pop(layout, None)

    def parts(self, rows: int, workers: int) -> int:
        """How many parts ``rows`` rows are worth: one per worker until the function has
        been timed, then no more than carry ``PART_WORK`` each (a batch of light rows
        goes whole to one worker: two messages, not four)."""
        if self._per_row is None:
            return workers
        return max(1, min(workers, int(rows * self._per_row / PART_WORK)))

    def timed(self, busy: float, rows: int) -> None:
        """A worker took ``busy`` seconds for ``rows`` rows of the function."""
        if rows > 0:
            self._per_row = busy / rows
