"""``executor="auto"``: measure the row function on the batch, predict, choose, explain.

On the first call for a signature (the function and its bound arguments, the
batch's structure, per-row shapes, dtypes and device), ``auto`` calibrates on
rows of the batch itself, writing their results into the output as it goes:
every row of the batch is computed once. The only extra runs (serial's
timing rows beside a batched form, the vmap checks) work on copies of rows,
so a function that changes its row in place changes the batch once (a failed
vmap try costs those few rows once more):

1. serial: blocks of 1, 2, 4 ... rows (8, 16, 32 for light rows), run as the
   serial executor runs them; the fastest block of two or more rows gives the
   seconds per row (noise only ever slows a block down);
2. a batched form, if there is one, makes the whole output of the first batch
   in one call. A twin runs while serial is timed on copies of a few rows.
   Without a twin, ``torch.func.vmap`` of the row function is tried: a call
   on a copy of one row rules out functions vmap cannot run (``.item()``,
   data-dependent shapes), serial is timed on copies of a few rows, vmap runs
   the whole batch, and its first rows must equal serial's bit for bit (it is
   dropped on any error or mismatch, and not tried when the whole batch
   takes under 0.3 ms serially; an op without a batching rule makes vmap
   loop, which its timing shows). If
   the batched form beats serial by more than the cores could, it has won: no
   pool divides serial time by more than its cores. If not, the next batch
   measures the pools (3-4) and runs its rest with the batched form again;
3. the thread pool, warmed up on a few rows, then timed on the next ones
   (about 0.1 s of work) -> its speed-up over serial, which shows how much of
   the function runs outside the GIL (when threads look faster, serial is
   timed again right after; the speed-up is capped at the cores);
4. processes: predicted from serial time / workers (serial is timed again
   with torch on as many intra-op threads as each worker gets: when torch's
   own threads already spread a row over the cores, there is less left to
   divide), plus the warm pool's dispatch cost (measured once per pool, on a
   no-op), and the cost of copying the batch and result through shared
   memory. The prediction is for a started pool; whether and when to start
   one (its start-up measured here) is :meth:`Calibration.plan_start`'s call.
   Left out inside DataLoader workers, on one core, for functions that cannot
   be pickled, for CUDA batches, and for less than 10 ms of work.

The batched forms are in :mod:`._batched`, the pools in :mod:`._pools`; this
module runs them in order and times serial. No pool is measured for a batch
under 2 ms of serial work. What the
calibrator finds is a prediction; :class:`~prep.auto.AutoExecutor` then times
every batch it runs and lets the measured figures decide.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._rows import Rows
from .._rowwise import twin_of
from ..executors._base import BLOCK, Executor, Job, available_cores
from . import _batched, _pools
from .calibration import Calibration

#: calibration stops adding serial rows once this much time was spent
STEP_BUDGET = 0.02
#: seconds of serial work for a whole batch below which no pool is measured: a thread
#: pool's dispatch costs a few tenths of a millisecond
MIN_POOL_WORK = 2e-3


@dataclass
class Progress:
    """A job and how many of its rows, from its start, are in its output so far."""

    job: Job
    done: int = 0

    def __post_init__(self) -> None:
        self.done = max(self.done, self.job.start)

    @property
    def left(self) -> int:
        return len(self.job.rows) - self.done

    def run(self, ex: Executor, stop: int) -> None:
        """Rows ``done:stop`` with ``ex``, into the job's output, under its deadline."""
        _batched.run_tolerant(ex, self.job.part(self.done, stop))
        self.done = stop


class Calibrator:
    """Runs the measurements on one job, writing the results of every row it runs;
    ``done`` is how many rows of the job are in its output when :meth:`run` returns.

    ``prior`` is the signature's unsettled calibration from the batch before:
    its batched form's figure is kept, and this batch measures the pools.
    """

    def __init__(
        self,
        job: Job,
        get: Callable[[str], Executor],
        workers: int,
        allow_processes: bool,
        prior: Calibration | None = None,
    ) -> None:
        self.job = job
        self.main = Progress(job)
        self.get = get
        self.n = len(job.rows)
        self.cal = Calibration(rows=self.n, workers=workers, options=job.policy.describe())
        self.allow_processes = allow_processes
        self.prior = prior
        self.cores = min(workers, available_cores())
        self.cuda = on_cuda(job.rows)
        self.best_serial = math.inf  # seconds per row of the fastest serial block

    @property
    def done(self) -> int:
        return self.main.done

    def now(self) -> float:
        return now(self.cuda)

    def run(self) -> Calibration:
        t0 = self.now()
        cal = self.cal
        tensors = self.job.rows.batched and self._batched_forms_allowed()
        twin = tensors and twin_of(self.job.fn) is not None
        first = _batched.twin_first if twin else _batched.vmap_first
        if self.prior is None and tensors and first(self):
            # first batch: a batched form made the whole output in one call
            if not self.won_outright() and not self._too_light_for_pools():
                cal.settled = False
                name = "vectorized" if twin else "vmap"
                cal.dropped["threads, processes"] = f"measured on the next batch, with {name}"
            return self._finish(t0)
        # no batched form, or the batch after one that did not win outright; a twin
        # that gave other rows than the row function is not used again
        twin = twin and "vectorized" not in cal.dropped
        batched = "vectorized" if twin else ("vmap" if self._prior_row("vmap") else None)
        self.serial(budget_rows=max(4, min(32, self.n // 8)))
        if not tensors and "vectorized, vmap" not in cal.dropped:
            cal.dropped["vectorized"] = "a list of samples has no batched form"
        elif batched == "vmap" and not _batched.vmap_agrees(self):
            batched = None
        if batched and self.won_outright(self._prior_row(batched)):
            self._run_rest(batched)
            return self._finish(t0)
        if not self._too_light_for_pools():
            if cal.workers > 1 and self.main.left >= 4 * cal.workers:
                _pools.measure_threads(self)
            else:
                cal.dropped["threads"] = "one worker, or too few rows left to measure"
            _pools.consider_processes(self)
        if batched and self.main.left:
            self._run_rest(batched)
        return self._finish(t0)

    def _batched_forms_allowed(self) -> bool:
        if self.job.policy.padding is None:
            return True
        self.cal.dropped["vectorized, vmap"] = (
            "with pad=, rows are padded one by one (vmap cannot return ragged rows, and a "
            "twin's padded batch says nothing of each row's length)"
        )
        return False

    # ------------------------------------------------------------ serial

    def serial(self, budget_rows: int, progress: Progress | None = None) -> None:
        """Seconds per row, as the serial executor runs them: blocks of 1, 2, 4 ... rows
        (8, 16, 32 for rows under 1 ms) until the time or row budget is spent. The
        fastest block of two or more rows is the measurement: noise (another process,
        a page fault) only ever slows a block, and large blocks carry less overhead.
        ``progress`` is the main job's by default, or one on copies of rows."""
        p = progress or self.main
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

    def serial_block(self, size: int, progress: Progress | None = None) -> float:
        """Run the next ``size`` rows serially; keep the fastest per-row time of 2+ rows."""
        p = progress or self.main
        start, stop = p.done, min(len(p.job.rows), p.done + size)
        t = self.now()
        p.job.run_range(start, stop)
        took = self.now() - t
        p.done = stop
        if stop - start > 1 or self.best_serial == math.inf:
            self.best_serial = min(self.best_serial, took / (stop - start))
        return took

    # ------------------------------------------------------------ batched forms, in order

    def _run_rest(self, name: str) -> None:
        """The batched form on all rows left, in one call: seconds per row (its fixed
        cost per call spread over them; the lower of this batch's and the one before)."""
        left, t = self.main.left, self.now()
        if left:
            self.main.run(self.get(name), self.n)
        per_row = (self.now() - t) / left if left else math.inf
        per_row = min(per_row, self._prior_row(name) or math.inf)
        setattr(self.cal, f"{name}_row", per_row if per_row < math.inf else None)

    def _prior_row(self, name: str) -> float | None:
        return getattr(self.prior, f"{name}_row", None) if self.prior else None

    def won_outright(self, per_row: float | None = None) -> bool:
        cal = self.cal
        best = per_row or min(x for x in (cal.vectorized_row, cal.vmap_row, math.inf) if x)
        if best * self.cores >= cal.serial_row:
            return False
        cal.dropped["threads, processes"] = (
            f"a batched form is over {self.cores}x faster than serial, more than "
            f"{self.cores} cores give"
        )
        return True

    def _too_light_for_pools(self) -> bool:
        if self.n * self.cal.serial_row >= MIN_POOL_WORK:
            return False
        self.cal.dropped["threads, processes"] = (
            f"the batch takes {self.n * self.cal.serial_row * 1e3:.2f} ms serially: "
            f"about what a pool's dispatch costs"
        )
        return True

    # ------------------------------------------------------------ prediction

    def _finish(self, t0: float) -> Calibration:
        # predicted for a whole batch of this size: the choice is kept for the next ones
        cal, rows, p = self.cal, self.n, self.cal.predicted
        p["serial"] = rows * cal.serial_row
        for name in ("vectorized", "vmap"):
            if (per_row := getattr(cal, f"{name}_row")) is not None:
                p[name] = rows * per_row
        if cal.thread_speedup is not None:
            p["threads"] = rows * cal.serial_row / max(cal.thread_speedup, 1e-9) + 2e-4
        if cal.process_dispatch is not None:
            copy = rows * cal.bytes_per_row / 4e9  # through shared memory, about 4 GB/s
            # each worker gets cores // workers threads: the work a serial row spread over
            # serial_cores (>= 1) cores is what the workers share
            work = rows * cal.serial_row * cal.serial_cores / self.cores
            p["processes"] = work + cal.process_dispatch + copy
        cal.choice = cal.best()
        cal.sample = self.done
        cal.seconds = self.now() - t0
        return cal


def on_cuda(rows: Rows) -> bool:
    """Whether the batch lives on a GPU (its timings then need a synchronize)."""
    return rows.device.type == "cuda"


def now(cuda: bool) -> float:
    """The time, once the GPU's queued kernels have run when ``cuda``: time the work,
    not its launch."""
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()
