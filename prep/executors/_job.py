"""A :class:`Job`: one call of ``map_rows`` as an executor runs it: the row function,
the rows, where their results land (``job.sink``: the output, given or made from
the first row's result, and the failed rows), the batch's :class:`Deadline`, and
the row loop every per-row executor runs in the end (:meth:`Job.run_range`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.output import Output
from ..core.policy import RAISE, Policy
from ..core.rows import Rows
from ..core.sink import Sink
from ..errors import BatchTimeout, RowError, SetupError

#: rows computed before they are written with one torch.stack per output tensor
BLOCK = 32
#: what :meth:`Job.outcome` gives for a row that failed under a per-row error policy
FAILED: Any = object()


class Deadline:
    """One batch's time limit, shared by every part of the batch that runs it: auto's
    calibration, the executor it picks and any sub-job. An executor that must first
    start its workers (seconds with torch) restarts it once they are up: the
    timeout is for the rows, not for a pool's start-up."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.restart()

    def restart(self) -> None:
        self._start = time.monotonic()

    def remaining(self) -> float | None:
        """Seconds left (None: no timeout)."""
        if self.timeout is None:
            return None
        return self.timeout - (time.monotonic() - self._start)


@dataclass
class Job:
    """One batch: run ``fn`` on rows ``start:`` of ``rows``, each result into ``sink``
    (:class:`~prep.core.sink.Sink`: the output, the failed rows, progress).

    Rows before ``start`` are already in the output (auto computed them while it
    measured). An executor runs the rest and never moves ``start``; whoever runs
    the batch in parts makes a job per part with :meth:`part`, which shares the
    sink and the deadline: one deadline a batch, whoever runs it. :meth:`new`
    makes a job and its sink from ``map_rows``' terms.
    """

    fn: Callable[..., Any]
    rows: Rows
    sink: Sink
    policy: Policy = RAISE  # padding, and what a failing row does
    start: int = 0
    deadline: Deadline = field(default_factory=lambda: Deadline(None))  # shared by its parts

    @property
    def timeout(self) -> float | None:
        """The batch's timeout as the caller gave it (None: no limit)."""
        return self.deadline.timeout

    @classmethod
    def new(
        cls,
        fn: Callable[..., Any],
        rows: Rows,
        output: Output | None = None,
        timeout: float | None = None,
        *,
        policy: Policy = RAISE,
        pin: bool = False,
        shared: bool = False,
        progress: Callable[[int], None] | None = None,
        deadline: Deadline | None = None,
    ) -> Job:
        """A job of ``rows`` writing into ``output`` (None: allocated from the first
        result, in pinned memory with ``pin``, in shared memory with ``shared``)."""
        sink = Sink(len(rows), policy, rows.offset, output, pin, shared, progress=progress)
        return cls(fn, rows, sink, policy, deadline=deadline or Deadline(timeout))

    def part(self, start: int, stop: int | None = None) -> Job:
        """Rows ``start:stop`` of this batch, written into this job's output (which must
        exist once ``stop`` is given), under this job's deadline."""
        rows = self.rows
        if stop is not None and stop < len(rows):
            assert self.sink.output is not None, "a part up to a stop writes into an output"
            rows = rows.head(stop)  # rows past stop are not run, so none is written
        return dataclasses.replace(self, rows=rows, start=start)

    def strict(self) -> Job:
        """This job with ``on_error='raise'``: for a batched call, which cannot keep a
        failing row's error to that row (the caller then runs the rows one by one)."""
        return dataclasses.replace(self, policy=Policy(self.policy.padding))

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no timeout)."""
        return self.deadline.remaining()

    def timed_out(self, what_now: str) -> BatchTimeout:
        """The error for a batch past its deadline; ``what_now`` says what was done."""
        return BatchTimeout(
            f"the batch of {len(self.rows)} rows did not finish within "
            f"timeout={self.timeout} s; {what_now}"
        )

    def check_deadline(self) -> None:
        left = self.remaining()
        if left is not None and left <= 0:
            raise self.timed_out("raise the timeout or look for a row that hangs")

    def compute(self, start: int, stop: int) -> list[Any]:
        """The row function's results for rows ``start:stop``, in one loop; a row's
        exception wrapped as RowError."""
        call, fn, results = self.rows.call, self.fn, []
        i = start
        try:
            for i in range(start, stop):
                results.append(call(fn, i))
        except SetupError:
            raise  # the worker's setup, not this row: never a row error
        except Exception as exc:
            raise _row_error(i, exc) from exc
        return results

    def compute_row(self, i: int) -> Any:
        """Row ``i``'s result alone (no list to build: a per-row path), as :meth:`compute`."""
        try:
            return self.rows.call(self.fn, i)
        except SetupError:
            raise
        except Exception as exc:
            raise _row_error(i, exc) from exc

    def outcome(self, i: int) -> Any:
        """Row ``i``'s result once the deadline is checked (per row: a slow row cannot
        hide a block's worth), or FAILED where the policy keeps its error to itself."""
        if self.timeout is not None:
            self.check_deadline()
        try:
            return self.compute_row(i)
        except RowError as error:
            if not self.policy.per_row_errors:
                raise
            self.sink.fail(i, error)
            return FAILED

    def run_range(self, start: int, stop: int, cancelled: Callable[[], bool] = bool) -> None:
        """Compute and store rows ``start:stop`` in this thread, a block at a time."""
        sink, i = self.sink, start
        # without a deadline to check or a row's error to keep, a block is one loop
        fast = self.timeout is None and not self.policy.per_row_errors
        with self.rows.seeded_run():
            while i < stop and not cancelled():
                if sink.output is None:  # the first row fixes the output's shape
                    if (result := self.outcome(i)) is not FAILED:
                        sink.store(i, result)
                    i += 1
                    sink.advance(1)
                    continue
                end = min(stop, i + BLOCK)
                results = self.compute(i, end) if fast else [self.outcome(j) for j in range(i, end)]
                if not fast and any(r is FAILED for r in results):
                    for j, r in enumerate(results, start=i):
                        if r is not FAILED:
                            sink.output.write(j, r)
                else:
                    sink.output.write_block(i, results)
                sink.advance(end - i)
                i = end


def _row_error(i: int, exc: Exception) -> RowError:
    return RowError(i, f"row {i}: {type(exc).__name__}: {exc}")


__all__ = ["BLOCK", "FAILED", "Deadline", "Job"]
