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
   dropped on any error or mismatch, an op without a batching rule raises,
   and it is not tried when the whole batch takes under 0.3 ms serially). If
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

No pool is measured for a batch under 2 ms of serial work. What the
calibrator finds is a prediction; :class:`~prep.auto.AutoExecutor` then times
every batch it runs and lets the measured figures decide.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from .._rowwise import twin_of
from .._structure import Output, Rows, TensorRows, flatten
from ..errors import ConfigError
from ..executors._base import BLOCK, Executor, Job, available_cores, threads_per_worker
from ..executors.processes import pickle_fn, shm_fits, shm_free
from ._vmap import no_vmap_fallback, same_rows, why
from .calibration import Calibration

#: seconds of serial work below which worker processes are not even considered
MIN_PROCESS_WORK = 0.01
#: dispatch cost assumed for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005
#: calibration stops adding serial rows once this much time was spent
STEP_BUDGET = 0.02
#: seconds of serial work for a whole batch below which no pool is measured: a thread
#: pool's dispatch costs a few tenths of a millisecond
MIN_POOL_WORK = 2e-3
#: seconds of serial work for a whole batch below which vmap is not tried: a first
#: vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


class Calibrator:
    """Runs the measurements on one job, writing the results of every row it runs.

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
        self.get = get
        self.n = len(job.rows)
        self.cal = Calibration(rows=self.n, workers=workers)
        self.allow_processes = allow_processes
        self.prior = prior
        self.cores = min(workers, available_cores())
        self.cuda = on_cuda(job.rows)
        self._best_serial = math.inf  # seconds per row of the fastest serial block

    def _now(self) -> float:
        return now(self.cuda)

    def run(self) -> Calibration:
        t0 = self._now()
        job, cal = self.job, self.cal
        tensors = isinstance(job.rows, TensorRows)
        twin = tensors and twin_of(job.fn) is not None
        if self.prior is None and tensors and (self._twin_first() if twin else self._vmap_first()):
            # first batch: a batched form made the whole output in one call
            if not self._won_outright() and not self._too_light_for_pools():
                cal.settled = False
                name = "vectorized" if twin else "vmap"
                cal.dropped["threads, processes"] = f"measured on the next batch, with {name}"
            return self._finish(t0)
        # no batched form, or the batch after one that did not win outright
        batched = "vectorized" if twin else ("vmap" if self._prior_row("vmap") else None)
        self._serial(budget_rows=max(4, min(32, self.n // 8)))
        if not tensors:
            cal.dropped["vectorized"] = "a list of samples has no batched form"
        elif batched == "vmap" and not self._vmap_agrees():
            batched = None
        if batched and self._won_outright(self._prior_row(batched)):
            self._run_rest(batched)
            return self._finish(t0)
        if not self._too_light_for_pools():
            if self.cal.workers > 1 and self.n - job.done >= 4 * self.cal.workers:
                self._threads()
            else:
                cal.dropped["threads"] = "one worker, or too few rows left to measure"
            self._consider_processes()
        if batched and job.done < self.n:
            self._run_rest(batched)
        return self._finish(t0)

    # ------------------------------------------------------------ serial

    def _serial(self, budget_rows: int, job: Job | None = None) -> None:
        """Seconds per row, as the serial executor runs them: blocks of 1, 2, 4 ... rows
        (8, 16, 32 for rows under 1 ms) until the time or row budget is spent. The
        fastest block of two or more rows is the measurement: noise (another process,
        a page fault) only ever slows a block, and large blocks carry less overhead."""
        job = job or self.job
        n = len(job.rows)
        if job.done >= n:
            return
        t = self._now()
        job.run_range(job.done, job.done + 1)  # the first row allocates the output: not timed
        job.done, first = job.done + 1, self._now() - t
        size, spent, took = (8 if first < 1e-3 else 1), 0.0, 0.0
        # enough when a block of 2+ rows took a couple of ms (slow rows are steady) or
        # the time budget is spent; fast rows go on to full blocks, as they run for real
        while (
            job.done < n
            and job.done < budget_rows
            and spent < STEP_BUDGET
            and not (took > 2e-3 and size > 2)
        ):
            took = self._serial_block(size, job)
            spent += took
            size = min(2 * size, BLOCK)
        self.cal.serial_row = self._best_serial if self._best_serial < math.inf else first

    def _serial_block(self, size: int, job: Job | None = None) -> float:
        """Run the next ``size`` rows serially; keep the fastest per-row time of 2+ rows."""
        job = job or self.job
        stop = min(len(job.rows), job.done + size)
        t = self._now()
        job.run_range(job.done, stop)
        took = self._now() - t
        if stop - job.done > 1 or self._best_serial == math.inf:
            self._best_serial = min(self._best_serial, took / (stop - job.done))
        job.done = stop
        return took

    # ------------------------------------------------------------ batched forms

    def _twin_first(self) -> bool:
        """The first batch of a function with a twin: the twin makes the whole output
        (no copy), the row function runs on a few rows into a scratch output, only to
        time serial, so it still runs at most once a row."""
        job, cal = self.job, self.cal
        # copies: a row function that changes its row in place must not change the
        # rows the twin then reads
        scratch = Job(job.fn, job.rows.take(0, min(self.n, 4)), None, job.timeout)
        scratch.started = job.started
        self._serial(budget_rows=4, job=scratch)
        t = self._now()
        job.output = self.get("vectorized").run(job)
        cal.vectorized_row = (self._now() - t) / self.n
        job.done = self.n
        return True

    def _vmap_first(self) -> bool:
        """The first batch of a function without a twin: ``vmap`` of it, if it works,
        makes the whole output in one call; False (and nothing written) if not.

        vmap on a copy of one row first rules out, cheaply and before any row has
        run, the many functions vmap cannot run (``.item()``, data-dependent
        shapes). Serial is then timed on copies of a few rows, vmap runs the whole
        batch, and its first rows must equal serial's bit for bit. Only when that
        fails, or the batch proves too light to be worth it, do those few rows
        run once more, as serial starts over on the batch itself.
        """
        job, cal = self.job, self.cal
        ex = self.get("vmap")
        fn, _ = ex.batched(job.fn)  # type: ignore[attr-defined]
        try:
            with no_vmap_fallback():  # not timed: a first vmap call can take 100x more
                job.rows.take(0, 1).call_batched(fn)
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped["vmap"] = why(exc)
            return False
        k = min(self.n, max(4, min(32, self.n // 8)))
        scratch = Job(job.fn, job.rows.take(0, k), None, job.timeout)
        scratch.started = job.started
        self._serial(budget_rows=k, job=scratch)
        if self.n * cal.serial_row < MIN_VMAP_WORK:
            cal.dropped["vmap"] = (
                f"the batch takes {self.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"less than trying vmap costs"
            )
            return False
        t = self._now()
        try:
            with no_vmap_fallback():
                out = ex.run(job)  # every row (job.done is 0)
        except Exception as exc:
            cal.dropped["vmap"] = why(exc)
            return False
        took = self._now() - t
        ref, done = scratch.output, scratch.done
        if ref is None or not same_rows(out.spec, [b[:done] for b in out.buffers], ref, done):
            cal.dropped["vmap"] = "its results differ from serial"
            return False
        job.output, job.done, cal.vmap_row = out, self.n, took / self.n
        return True

    def _vmap_agrees(self) -> bool:
        """Whether vmap of the row function reproduces serial's rows bit for bit."""
        job, cal = self.job, self.cal
        if job.output is None or job.done < 2:
            cal.dropped["vmap"] = "needs two measured rows"
            return False
        if job.done >= self.n:
            return False  # serial ran every row: nothing left for vmap to run
        # copies of up to 8 rows serial computed: a row function that changes its input
        # in place must not change the caller's batch a second time
        k = min(job.done, 8)
        head = job.rows.take(0, k)
        fn, _ = self.get("vmap").batched(job.fn)  # type: ignore[attr-defined]
        # not timed: a first vmap call in a process can take 100x a later one
        try:
            with no_vmap_fallback():  # an op without a batching rule raises, not loops
                spec, leaves = flatten(head.call_batched(fn))
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped["vmap"] = why(exc)
            return False
        same = same_rows(spec, leaves, job.output, k)
        if not same:
            cal.dropped["vmap"] = "its results differ from serial"
        return same

    def _run_rest(self, name: str) -> None:
        """The batched form on all rows left, in one call: seconds per row (its fixed
        cost per call spread over them; the lower of this batch's and the one before)."""
        start, t = self.job.done, self._now()
        if start < self.n:
            _run_slice(self.get(name), self.job, self.n)
            per_row = (self._now() - t) / (self.n - start)
        else:
            per_row = math.inf
        per_row = min(per_row, self._prior_row(name) or math.inf)
        setattr(self.cal, f"{name}_row", per_row if per_row < math.inf else None)

    def _prior_row(self, name: str) -> float | None:
        return getattr(self.prior, f"{name}_row", None) if self.prior else None

    def _won_outright(self, per_row: float | None = None) -> bool:
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

    # ------------------------------------------------------------ pools

    def _threads(self) -> None:
        """The thread pool itself on the next rows: its speed-up over serial, as it runs."""
        workers, ex = self.cal.workers, self.get("threads")
        # a new thread's first torch call sets up its own state: warm each one untimed
        _run_slice(ex, self.job, min(self.n, self.job.done + workers))
        # about 0.1 s of serial work, at least two rows per thread, at most 8 blocks
        rows = int(min(max(0.1 / max(self.cal.serial_row, 1e-9), 2 * workers), 8 * BLOCK))
        rows = min(rows, max(2 * workers, (self.n - self.job.done) // 4))  # leave the most
        start, stop = self.job.done, min(self.n, self.job.done + rows)
        t = self._now()
        _run_slice(ex, self.job, stop)
        per_row = (self._now() - t) / max(1, stop - start)
        if self.cal.serial_row > 1.2 * per_row and self.job.done < self.n:
            # threads look faster: serial again, side by side, before believing it
            self._serial_block(min(BLOCK, max(2, rows // 2)))
            self.cal.serial_row = self._best_serial
        # no pool divides serial time by more than its cores
        self.cal.thread_speedup = min(self.cores, self.cal.serial_row / per_row)

    def _consider_processes(self) -> None:
        cal, job = self.cal, self.job
        left = self.n - job.done
        reason = None
        if not self.allow_processes:
            reason = "inside a DataLoader worker (no child processes)"
        elif self.cores < 2:
            reason = "one core or one worker"
        elif left * cal.serial_row < MIN_PROCESS_WORK:
            reason = (
                f"the rest of the batch takes {left * cal.serial_row * 1e3:.1f} ms "
                f"serially; worker processes cannot pay off"
            )
        elif isinstance(job.rows, TensorRows) and any(
            c.device.type != "cpu" for c in job.rows.columns
        ):
            reason = "the batch is on a GPU"
        else:
            try:
                pickle_fn(job.fn)
            except ConfigError:
                reason = "the function cannot be pickled"
        if not reason:
            out_bytes = (
                sum(b[0].numel() * b.element_size() for b in job.output.buffers)
                if job.output is not None
                else 0
            )
            in_bytes = job.rows.nbytes // max(1, self.n) if isinstance(job.rows, TensorRows) else 0
            cal.bytes_per_row = in_bytes + out_bytes
            if not shm_fits(cal.bytes_per_row * self.n):
                reason = (
                    f"the batch and its result need {cal.bytes_per_row * self.n / 2**20:.0f} MB "
                    f"of shared memory, /dev/shm has {(shm_free() or 0) / 2**20:.0f} MB free"
                )
        if reason:
            cal.dropped["processes"] = reason
            return
        self._one_thread()
        ex = self.get("processes")
        cal.process_start = ex.start_cost()  # type: ignore[attr-defined]
        if cal.process_start == 0:  # a warm pool: measure what a batch costs it
            cal.process_dispatch = ex.dispatch_cost()  # type: ignore[attr-defined]
            cal.dispatch_measured = True
        else:  # do not start a pool just to measure it: auto starts it when it pays
            cal.process_dispatch = COLD_DISPATCH

    def _one_thread(self) -> None:
        """Serial again with torch on one intra-op thread, as each of ``workers`` worker
        processes on as many cores runs it: when torch's own threads already spread
        a row over the cores, the workers have nothing left to divide."""
        job, cal = self.job, self.cal
        intra = torch.get_num_threads()
        if intra < 2 or threads_per_worker(cal.workers) >= intra or self.n - job.done < 8:
            return
        rows = int(min(max(0.02 / max(cal.serial_row, 1e-9), 2), BLOCK, (self.n - job.done) // 8))

        def block() -> float:
            t, start = self._now(), job.done
            job.run_range(start, start + rows)
            job.done = start + rows
            return (self._now() - t) / rows

        torch.set_num_threads(threads_per_worker(cal.workers))
        try:
            per_row = block()
            if per_row > 1.2 * cal.serial_row:  # slower: once more before believing it,
                per_row = min(per_row, block())  # as noise only ever slows a block down
        finally:
            torch.set_num_threads(intra)
        cal.one_thread_row = per_row
        cal.serial_cores = min(max(1.0, per_row / cal.serial_row), float(self.cores))

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
        cal.sample = self.job.done
        cal.seconds = self._now() - t0
        return cal


def on_cuda(rows: Rows) -> bool:
    """Whether the batch lives on a GPU (its timings then need a synchronize)."""
    return isinstance(rows, TensorRows) and any(c.device.type == "cuda" for c in rows.columns)


def now(cuda: bool) -> float:
    """The time, once the GPU's queued kernels have run when ``cuda``: time the work,
    not its launch."""
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def _run_slice(ex: Executor, job: Job, stop: int) -> None:
    """Run rows ``job.done:stop`` with ``ex`` into ``job.output``."""
    assert job.output is not None  # the serial rows ran first
    out = job.output
    head = Output(out.spec, [b[:stop] for b in out.buffers], out.first_row, out.offset)
    sub = Job(job.fn, job.rows.head(stop), head, job.timeout, done=job.done)
    sub.started = job.started  # one deadline for the whole batch, calibration included
    ex.run(sub)
    job.done = stop
