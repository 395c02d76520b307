"""Crash isolation, one algorithm for every process pool.

Under ``on_error='fill'``/``'skip'`` a worker that dies does not fail the batch.
The rows it held run again, one at a time, each alone on a worker; a row that
kills its worker while alone is the culprit: a failed row (its cause a
:class:`~prep.errors.WorkerCrashed` naming the worker), and the rest of the batch
completes. ``processes`` knows which range a dead worker held; loky cannot say
which task's worker died, so ``joblib`` hands over every range in flight.
"""

from __future__ import annotations

from ._job import Job

Range = tuple[int, int]


class Isolation:
    """The ranges of one batch's rows that lost their worker, and which ran alone."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._alone: set[Range] = set()  # single rows run again after a crash

    def lost(self, held: Range, worker: str, how: str = "") -> list[Range]:
        """``worker`` died holding rows ``held``: the ranges to run again, each alone (a
        row of its own), or none where it held one row alone, which then failed."""
        if held in self._alone:
            self.job.sink.killed(held[0], worker, how)
            return []
        singles = [(i, i + 1) for i in range(*held)]
        self._alone.update(singles)
        return singles


__all__ = ["Isolation", "Range"]
