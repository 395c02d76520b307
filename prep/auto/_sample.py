"""The batch a calibration measures, and serial's timing on it.

A :class:`Sample` is what every measurement step shares: the job (its rows, its
output, its deadline), the executors by name, the :class:`Calibration` being
filled, and a :class:`Cursor` over the rows already in the output. Each executor's
cost model measures itself on it (``prep.auto.models``). Serial is timed here
(:meth:`Sample.serial`) because
every other figure is relative to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..core.output import Output
from ..core.rows import Rows
from ..errors import ExecutorUnavailable
from ..executors import BLOCK, Executor, Job, available_cores
from ._cost import RowCursor
from .calibration import Calibration

#: calibration stops adding serial rows once this much time was spent
STEP_BUDGET = 0.02


def on_cuda(rows: Rows) -> bool:
    """Whether the batch lives on a GPU (its timings then need a synchronize)."""
    return rows.device.type == "cuda"


def now(cuda: bool) -> float:
    """The time, once the GPU's queued kernels have run when ``cuda``: time the work,
    not its launch."""
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def run_tolerant(ex: Executor, job: Job) -> Output | None:
    """``ex.run(job)``; a batched form under ``on_error='fill'``/``'skip'`` runs as one
    strict call, and if that fails the rows run one by one in this thread, so a
    failing row fails alone (a batch with a bad row is no reason to re-calibrate)."""
    if ex.traits.per_row or not job.policy.per_row_errors:
        return ex.run(job)
    try:
        return ex.run(job.strict())
    except ExecutorUnavailable:
        raise
    except Exception:
        job.run_range(job.start, len(job.rows))
        return job.sink.output


@dataclass
class Cursor:
    """A job and how many of its rows, from its start, are in its output so far."""

    job: Job
    done: int = 0

    @property
    def left(self) -> int:
        return len(self.job.rows) - self.done

    def run(self, ex: Executor, stop: int) -> None:
        """Rows ``done:stop`` with ``ex``, into the job's output, under its deadline."""
        run_tolerant(ex, self.job.part(self.done, stop))
        self.done = stop


class Sample:
    """One job under measurement: what the calibration's steps share.

    ``prior`` is the signature's unsettled calibration from the batch before (a
    batched form ran that whole batch without winning outright)."""

    def __init__(
        self,
        job: Job,
        get: Callable[[str], Executor],
        workers: int,
        left_out: Mapping[str, str],
        prior: Calibration | None = None,
    ) -> None:
        self.job = job
        self.main = Cursor(job, job.start)
        self._get = get
        self.n = len(job.rows)
        self.cal = Calibration(rows=self.n, workers=workers, options=job.policy.describe())
        self.left_out = left_out  # executors not weighed here, each with why
        self.prior = prior
        self.cores = min(workers, available_cores())
        self.cuda = on_cuda(job.rows)
        self.best_serial = math.inf  # seconds per row of the fastest serial block

    def now(self) -> float:
        return now(self.cuda)

    def executor(self, name: str) -> Executor:
        return self._get(name)

    def scratch(self, k: int) -> Cursor:
        """A cursor over copies of the first ``k`` rows, into an output of its own:
        serial timed beside a batched form, which makes the real output."""
        job = self.job
        return Cursor(Job.new(job.fn, job.rows.take(0, k), deadline=job.deadline))

    def serial(self, budget_rows: int, cursor: RowCursor | None = None) -> None:
        """Seconds per row, as the serial executor runs them: blocks of 1, 2, 4 ... rows
        (8, 16, 32 for rows under 1 ms) until the time or row budget is spent. The
        fastest block of two or more rows is the measurement: noise (another process,
        a page fault) only ever slows a block, and large blocks carry less overhead.
        ``cursor`` is the main job's by default, or one on copies of rows."""
        p = cursor or self.main
        if not p.left:
            return
        t = self.now()
        p.job.run_range(p.done, p.done + 1)  # the first row allocates the output: not timed
        p.done, first = p.done + 1, self.now() - t
        size, spent, took = (8 if first < 1e-3 else 1), 0.0, 0.0
        # enough when a block of 2+ rows took a couple of ms (slow rows are steady) or
        # the time budget is spent; fast rows go on to full blocks, as they run for real
        while (
            p.left
            and p.done < budget_rows
            and spent < STEP_BUDGET
            and not (took > 2e-3 and size > 2)
        ):
            took = self.serial_block(size, p)
            spent += took
            size = min(2 * size, BLOCK)
        self.cal.serial_row = self.best_serial if self.best_serial < math.inf else first

    def serial_block(self, size: int, cursor: RowCursor | None = None) -> float:
        """Run the next ``size`` rows serially; keep the fastest per-row time of 2+ rows."""
        p = cursor or self.main
        start, stop = p.done, min(len(p.job.rows), p.done + size)
        t = self.now()
        p.job.run_range(start, stop)
        took = self.now() - t
        p.done = stop
        if stop - start > 1 or self.best_serial == math.inf:
            self.best_serial = min(self.best_serial, took / (stop - start))
        return took
