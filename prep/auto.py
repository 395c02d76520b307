"""``executor="auto"``: measure the row function on a few rows, predict, choose, explain.

On the first call for a signature (the function and its bound arguments, the
batch's structure, per-row shapes, dtypes and device), ``auto`` calibrates on
rows of the batch itself, writing their results into the output as it goes,
so no row is computed twice and side effects do not repeat:

1. serial: blocks of 1, 2, 4 ... rows, run as the serial executor runs them;
   the fastest block of two or more rows gives the seconds per row (noise
   only ever slows a block down);
2. a batched twin, if the function has one, runs on the whole batch at once
   and its result is the output, while the row function runs on a few rows
   into a scratch buffer, just to time serial. If the twin beats serial by
   more than the cores could, it has won: no pool divides serial time by
   more than its cores. If not, the next batch is calibrated in full (twin
   on 1/8 and 3/8 of it, then the pools);
3. ``torch.func.vmap`` of the row function (no twin), run once on the serial
   rows and compared bit for bit; dropped on any error, warning or mismatch,
   or when the whole batch takes less serially (0.3 ms) than trying costs.
   Like a twin, it then runs all the rest of the first batch in one call;
   unless that wins outright, the next batch is calibrated in full (vmap on
   1/8 and 3/8 of it, separating its fixed cost per call from its cost per
   row, then the pools);
4. the thread pool on the next rows (about 0.1 s of work) -> its speed-up
   over serial, which shows how much of the function runs outside the GIL
   (when threads look faster, serial is timed again right after, and the
   speed-up is capped at the cores);
5. processes: predicted from serial time / workers, plus the warm pool's
   dispatch cost (measured once per pool, on a no-op), the cost of copying
   the batch and result through shared memory, and, for a pool not started
   yet, its start-up (0.2 s with the forkserver running, 2.5 s without).
   Left out inside DataLoader workers, on one core, for functions that cannot
   be pickled, for CUDA batches, and for less than 10 ms of work.

The lowest predicted time wins, a pool only when it saves more than 15%
(measurement noise); the choice is cached for the pool's lifetime and
re-measured when the batch size changes more than 4x. A process pool that
loses a batch only because it has to start is rented, not bought: the
batches keep count of what it would have saved, and once that pays for its
start-up, it starts (never more than twice the best in hindsight).
"""

from __future__ import annotations

import functools
import math
import pickle
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._rowwise import twin_of
from ._structure import Output, Rows, TensorRows, flatten
from .executors import Executor, Job, available_cores
from .executors._base import BLOCK

#: seconds of serial work below which worker processes are not even considered
MIN_PROCESS_WORK = 0.01
#: seconds to start a process pool: with the forkserver already up, and without it
#: (it imports torch first); measured on a 2-core machine, where the second is ~2.3 s
START_WITH_FORKSERVER, START_COLD = 0.2, 2.5
#: dispatch cost assumed for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005
#: calibration stops adding serial rows once this much time was spent
STEP_BUDGET = 0.02
#: threads or processes are chosen over the rest only when predicted this much faster
#: (the calibration's slices vary by 10-20% on a busy machine); ties go to no pool
POOL_MARGIN = 1.15
POOLS = ("threads", "processes")
#: seconds of serial work for a whole batch below which no pool is measured: a thread
#: pool's dispatch costs a few tenths of a millisecond
MIN_POOL_WORK = 2e-3
#: seconds of serial work for a whole batch below which vmap is not tried: a first
#: vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


@dataclass
class Calibration:
    """What ``auto`` measured for one signature, what it predicts, and what it chose."""

    rows: int
    workers: int
    serial_row: float = math.nan
    vectorized_row: float | None = None
    vectorized_fixed: float = 0.0
    vmap_row: float | None = None
    vmap_fixed: float = 0.0
    thread_speedup: float | None = None
    process_dispatch: float | None = None
    process_start: float = 0.0
    bytes_per_row: int = 0
    sample: int = 0
    predicted: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    choice: str = "serial"
    seconds: float = 0.0
    #: seconds a started process pool would have saved on the batches run so far
    saved_by_processes: float = 0.0
    batches: int = 0
    switched: str = ""
    #: False: a twin ran the first batch but did not win outright; the next measures more
    settled: bool = True
    #: the process pool was started during calibration, for the batches after this one
    prestarted: bool = False

    def processes_would_save(self, rows: int) -> float:
        """Seconds a started process pool would save over the choice on ``rows`` rows."""
        if (
            not self.process_start
            or self.choice == "processes"
            or "processes" not in self.predicted
        ):
            return 0.0
        warm = (self.predicted["processes"] - self.process_start) * POOL_MARGIN
        return max(0.0, self.predicted[self.choice] - warm) * rows / max(1, self.rows)

    def count_batch(self, rows: int) -> None:
        """Rent or buy. A process pool that loses this batch only because it has to
        start is started anyway when that is cheap (the forkserver is up: its workers
        come up while this batch finishes), and used from the next batch. When it is
        not (2.5 s with torch to import), it starts once the batches run so far would
        have saved that much with it: never paying more than twice the best in
        hindsight, whether the batches stop now or go on for ever."""
        self.batches += 1
        self.saved_by_processes += self.processes_would_save(rows)
        paid = self.saved_by_processes >= self.process_start
        if not self.process_start or not (paid or (self.prestarted and self.batches > 1)):
            return
        why = (
            f"the {self.saved_by_processes:.2f} s they would have saved paid for starting "
            f"the pool ({self.process_start:.1f} s)"
            if paid
            else "its workers started during the first batch"
        )
        self.predicted["processes"] -= self.process_start
        before, self.process_start = self.choice, 0.0
        self.choice = _choose(self.predicted)
        self.switched = f"from batch {self.batches} on: {before} -> {self.choice}, as {why}"

    def __str__(self) -> str:
        us = lambda s: f"{s * 1e6:,.1f} us" if s is not None else "-"  # noqa: E731
        lines = [
            f"auto: {self.rows} rows, {self.workers} workers; calibrated on {self.sample} rows "
            f"in {self.seconds * 1e3:.1f} ms",
            f"  serial {us(self.serial_row)}/row"
            + (_batched_cost("vectorized", self.vectorized_fixed, self.vectorized_row))
            + (_batched_cost("vmap", self.vmap_fixed, self.vmap_row))
            + (f", threads run {self.thread_speedup:.2f}x serial" if self.thread_speedup else "")
            + (
                f", process dispatch {self.process_dispatch * 1e3:.2f} ms/batch"
                if self.process_dispatch is not None
                else ""
            )
            + (f" (+{self.process_start:.1f} s to start the pool)" if self.process_start else ""),
            "  predicted for a whole batch: "
            + ", ".join(
                f"{k} {v * 1e3:.1f} ms"
                for k, v in sorted(self.predicted.items(), key=lambda kv: kv[1])
            ),
        ]
        lines += [f"  not considered: {k} ({why})" for k, why in self.dropped.items()]
        if self.switched:
            lines.append(f"  {self.switched}")
        elif self.prestarted:
            lines.append(
                "  processes lose this batch only by their start-up: their workers are "
                "starting now, for the next batches"
            )
        elif saving := self.processes_would_save(self.rows):
            lines.append(
                f"  processes would save {saving * 1e3:,.1f} ms a batch once started: "
                f"they start after about {math.ceil(self.process_start / saving)} batches "
                f"({self.saved_by_processes * 1e3:,.1f} ms saved so far)"
            )
        lines.append(f"  choice: {self.choice}")
        return "\n".join(lines)


def _batched_cost(name: str, fixed: float, per_row: float | None) -> str:
    if per_row is None:
        return ""
    return f", {name} {per_row * 1e6:,.1f} us/row" + (
        f" + {fixed * 1e3:.2f} ms a call" if fixed else ""
    )


# ---------------------------------------------------------------- signature


def _value_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), str(v.device))
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return (type(v).__qualname__, id(v))


def _fn_key(fn: Callable[..., Any]) -> Any:
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        args, kwargs = fn.args + args, {**fn.keywords, **kwargs}
        fn = fn.func
    return (
        id(fn),
        tuple(map(_value_key, args)),
        tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())),
    )


def signature(fn: Callable[..., Any], rows: Rows, device: Any) -> Any:
    """What a cached choice is valid for (everything but the number of rows)."""
    if isinstance(rows, TensorRows):
        layout: Any = (
            rows.names,
            tuple((tuple(c.shape[1:]), str(c.dtype), str(c.device)) for c in rows.columns),
        )
    else:
        layout = ("samples", type(rows.samples[0]).__qualname__ if len(rows) else None)
    return (_fn_key(fn), layout, str(device))


# ---------------------------------------------------------------- calibration


class Calibrator:
    """Runs the measurements on the first rows of one job, writing their results."""

    def __init__(
        self,
        job: Job,
        get: Callable[[str], Executor],
        workers: int,
        allow_processes: bool,
        thorough: bool = False,
        prestart: bool = True,
    ) -> None:
        self.job = job
        self.thorough = thorough  # measure the pools even when a twin exists
        self.prestart = prestart  # may start a process pool for the next batches
        self.get = get
        self.n = len(job.rows)
        self.cal = Calibration(rows=self.n, workers=workers)
        self.allow_processes = allow_processes
        self._best_serial = math.inf  # seconds per row of the fastest serial block

    def _serial(self, budget_rows: int, job: Job | None = None) -> None:
        """Seconds per row, as the serial executor runs them: blocks of 1, 2, 4 ... rows
        (8, 16, 32 for rows under 1 ms) until the time or row budget is spent. The
        fastest block of two or more rows is the measurement: noise (another process,
        a page fault) only ever slows a block, and large blocks carry less overhead."""
        job = job or self.job
        n = len(job.rows)
        t = time.perf_counter()
        job.run_range(job.done, job.done + 1)  # the first row allocates the output: not timed
        job.done, first = job.done + 1, time.perf_counter() - t
        # fast rows start at a block of 8 (a block of 1 times mostly the block's own cost)
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
        t = time.perf_counter()
        job.run_range(job.done, stop)
        took = time.perf_counter() - t
        if stop - job.done > 1 or self._best_serial == math.inf:
            self._best_serial = min(self._best_serial, took / (stop - job.done))
        job.done = stop
        return took

    def _twin_first(self) -> None:
        """The quick path for a function with a batched twin.

        The twin runs on the whole batch and its result is the output (no copy);
        the row function runs serially on a few rows into a scratch output, to
        measure what the twin is up against, so it still runs at most once a row.
        The twin wins outright when it beats serial by more than the cores could;
        otherwise the pools are measured on the next batch (see ``Auto.run``).
        """
        job, cal = self.job, self.cal
        scratch = Job(job.fn, job.rows.head(min(self.n, 4)), None, job.timeout)
        self._serial(budget_rows=4, job=scratch)
        t = time.perf_counter()
        job.output = self.get("vectorized").run(job)
        cal.vectorized_row = (time.perf_counter() - t) / self.n
        job.done = self.n
        cores = min(cal.workers, available_cores())
        if cal.vectorized_row * cores < cal.serial_row:
            cal.dropped["threads, processes"] = (
                f"vectorized is over {cores}x faster than serial, more than {cores} cores give"
            )
        elif self.n * cal.serial_row < MIN_POOL_WORK:
            cal.dropped["threads, processes"] = (
                f"the batch takes {self.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"about what a pool's dispatch costs"
            )
        else:
            cal.settled = False
            cal.dropped["threads, processes"] = "measured on the next batch, against the twin"

    def _take(self, count: int) -> tuple[int, int]:
        start = self.job.done
        return start, min(self.n, start + max(1, count))

    def _batched(self, name: str, call: Callable[[int], None]) -> None:
        """Time a batched candidate (the twin, or vmap) on new rows of the batch.

        The first slice is 1/8 of the batch (less when few rows are left). A
        candidate that beats serial by more than the cores could is the winner
        outright: it runs the rest of the batch at once, and that call is the
        second point of its fit. Otherwise a second slice three times the first
        (at most half of what is left) separates its fixed cost per call from its
        cost per row (a wide lever: a call of a few rows is mostly fixed cost),
        and the pools are measured on the rest.
        """
        sizes, times = [], []

        def timed(count: int) -> None:
            start, stop = self._take(count)
            t = time.perf_counter()
            call(stop)
            times.append(time.perf_counter() - t)
            sizes.append(stop - start)

        # slices of 1/8 and 3/8 of the batch, leaving at least half the rows for the pools
        left = self.n - self.job.done
        first = max(2, min(max(8, self.n // 8), left // 4))
        timed(first)
        cores = min(self.cal.workers, available_cores())
        clear = times[0] / sizes[0] * cores < self.cal.serial_row
        left = self.n - self.job.done
        if left:
            timed(left if clear else min(3 * first, left // 2))
        fixed, per_row = _fit(sizes, times)
        if name == "vectorized":
            self.cal.vectorized_fixed, self.cal.vectorized_row = fixed, per_row
        else:
            self.cal.vmap_fixed, self.cal.vmap_row = fixed, per_row

    def _vectorized(self) -> None:
        ex = self.get("vectorized")
        self._batched("vectorized", lambda stop: _run_slice(ex, self.job, stop))

    def _vmap(self) -> None:
        job = self.job
        if not isinstance(job.rows, TensorRows) or job.output is None or job.done < 2:
            self.cal.dropped["vmap"] = "needs a batch of tensors and two measured rows"
            return
        k = min(job.done, 8)  # enough rows to compare; each is computed twice
        head = job.rows.replace([c[:k] for c in job.rows.columns])
        ex = self.get("vmap")
        fn, _ = ex.batched(job.fn)  # type: ignore[attr-defined]
        # one call on the rows serial computed: compared bit for bit, and it warms vmap up
        # (its first call in a process can take 100x a later one), so it is not timed
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a vmap fallback warning means "slow path"
                spec, leaves = flatten(head.call_batched(fn))
        except Exception as exc:  # any failure just removes the candidate
            self.cal.dropped["vmap"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            return
        same = spec == job.output.spec and all(
            leaf.shape == buf[:k].shape and leaf.dtype == buf.dtype and torch.equal(leaf, buf[:k])
            for leaf, buf in zip(leaves, job.output.buffers)
        )
        if not same:
            self.cal.dropped["vmap"] = "its results differ from serial"
            return
        if job.done >= self.n:
            return
        if self.thorough:
            self._batched("vmap", lambda stop: _run_slice(ex, job, stop))
            return
        # first batch: vmap runs all the rest in one call, as a twin would; if it does not
        # win outright, the next batch measures it against the pools (see ``run``)
        start, t = job.done, time.perf_counter()
        _run_slice(ex, job, self.n)
        self.cal.vmap_fixed, self.cal.vmap_row = 0.0, (time.perf_counter() - t) / (self.n - start)

    def _threads(self, workers: int) -> None:
        """The thread pool itself on the next rows: its speed-up over serial, as it runs."""
        # about 0.1 s of serial work, at least two rows per thread, at most 8 blocks
        rows = int(min(max(0.1 / max(self.cal.serial_row, 1e-9), 2 * workers), 8 * BLOCK))
        rows = min(rows, max(2 * workers, (self.n - self.job.done) // 4))  # leave the most
        start, stop = self._take(rows)
        t = time.perf_counter()
        _run_slice(self.get("threads"), self.job, stop)
        per_row = (time.perf_counter() - t) / (stop - start)
        cores = min(workers, available_cores())
        if self.cal.serial_row > 1.2 * per_row and self.job.done < self.n:
            # threads look faster: serial again, side by side, before believing it
            self._serial_block(min(BLOCK, max(2, rows // 2)))
            self.cal.serial_row = self._best_serial
        # no pool divides serial time by more than its cores
        self.cal.thread_speedup = min(cores, self.cal.serial_row / per_row) if per_row else 1.0

    def _process_dispatch(self) -> float:
        ex = self.get("processes")
        cached = getattr(ex, "_auto_dispatch", None)
        if cached is None:
            from .api import _run
            from .executors._worker import identity

            probe = TensorRows((torch.zeros(ex.workers * 2, 1),))
            t = time.perf_counter()
            _run(ex, identity, probe, out=None, device=None, timeout=None)
            cached = time.perf_counter() - t
            ex._auto_dispatch = cached  # type: ignore[attr-defined]
        return cached

    def run(self) -> Calibration:
        t0 = time.perf_counter()
        job, cal, workers = self.job, self.cal, self.cal.workers
        tensors = isinstance(job.rows, TensorRows)
        twin = tensors and twin_of(job.fn) is not None
        if twin and not self.thorough:
            self._twin_first()
            return self._finish(t0)
        # with a twin, a few serial rows suffice: they only have to show how far behind it is
        self._serial(budget_rows=4 if twin else max(4, min(32, self.n // 8)))
        rest = lambda: self.n - job.done  # noqa: E731
        if twin and rest() > 0:
            self._vectorized()
        elif tensors and self.n * cal.serial_row < MIN_VMAP_WORK:
            cal.dropped["vmap"] = (
                f"the batch takes {self.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"less than trying vmap costs"
            )
        elif tensors:
            self._vmap()
        else:
            cal.dropped["vectorized"] = "a list of samples has no batched form"
        cores = min(workers, available_cores())
        best_vec = min(x for x in (cal.vectorized_row, cal.vmap_row, math.inf) if x is not None)
        if best_vec * cores < cal.serial_row:
            cal.dropped["threads, processes"] = (
                f"vectorized is over {cores}x faster than serial, more than {cores} cores give"
            )
        elif self.n * cal.serial_row < MIN_POOL_WORK:
            cal.dropped["threads, processes"] = (
                f"the batch takes {self.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"about what a pool's dispatch costs"
            )
        elif rest() == 0 and not self.thorough:  # vmap ran the rest and did not win outright
            cal.settled = False
            cal.dropped["threads, processes"] = "measured on the next batch, against vmap"
        else:
            if workers > 1 and rest() >= 4 * workers:
                self._threads(workers)
            else:
                cal.dropped["threads"] = "one worker, or too few rows left to measure"
            self._consider_processes(rest(), cores)
        return self._finish(t0)

    def _finish(self, t0: float) -> Calibration:
        # predicted for a whole batch of this size: the choice is kept for the next ones
        self._predict(self.n)
        self.cal.sample = self.job.done
        self.cal.seconds = time.perf_counter() - t0
        return self.cal

    def _consider_processes(self, left: int, cores: int) -> None:
        cal, job = self.cal, self.job
        reason = None
        if not self.allow_processes:
            reason = "inside a DataLoader worker (no child processes)"
        elif cores < 2:
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
                pickle.dumps(job.fn)
            except Exception:
                reason = "the function cannot be pickled"
        if reason:
            cal.dropped["processes"] = reason
            return
        if self._warm():
            cal.process_dispatch = self._process_dispatch()
        else:  # do not start a pool just to measure it: it starts if it is chosen
            cal.process_start = _process_start_cost()
            cal.process_dispatch = COLD_DISPATCH
        out_bytes = (
            sum(b[0].numel() * b.element_size() for b in job.output.buffers)
            if job.output is not None
            else 0
        )
        in_bytes = job.rows.nbytes // max(1, self.n) if isinstance(job.rows, TensorRows) else 0
        cal.bytes_per_row = in_bytes + out_bytes

    def _warm(self) -> bool:
        ex = self.get("processes")
        return bool(getattr(ex, "pids", None))

    def _predict(self, rows: int) -> None:
        cal = self.cal
        cores = min(cal.workers, available_cores())
        p = cal.predicted
        p["serial"] = rows * cal.serial_row
        if cal.vectorized_row is not None:
            p["vectorized"] = cal.vectorized_fixed + rows * cal.vectorized_row
        if cal.vmap_row is not None:
            p["vmap"] = cal.vmap_fixed + rows * cal.vmap_row
        if cal.thread_speedup is not None:
            p["threads"] = rows * cal.serial_row / max(cal.thread_speedup, 1e-9) + 2e-4
        if cal.process_dispatch is not None:
            copy = rows * cal.bytes_per_row / 4e9  # through shared memory, about 4 GB/s
            p["processes"] = (
                cal.process_start + rows * cal.serial_row / cores + cal.process_dispatch + copy
            )
        cal.choice = _choose(p)
        if (
            self.prestart
            and cal.process_start == START_WITH_FORKSERVER
            and cal.processes_would_save(cal.rows) > 0
        ):
            self.get("processes").prestart()  # type: ignore[attr-defined]
            cal.prestarted = True


def _choose(predicted: dict[str, float]) -> str:
    # a pool has to save more than measurement noise to be worth the cores it takes
    return min(predicted, key=lambda k: predicted[k] * (POOL_MARGIN if k in POOLS else 1.0))


def _process_start_cost() -> float:
    """Seconds a new ``processes`` pool will take to start here."""
    from multiprocessing import forkserver

    from .executors.processes import START_METHOD

    server = getattr(forkserver, "_forkserver", None)
    running = START_METHOD == "forkserver" and getattr(server, "_forkserver_pid", None)
    return START_WITH_FORKSERVER if running else START_COLD


def _fit(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """(fixed seconds per call, seconds per row) from calls of one or two sizes."""
    if len(sizes) < 2 or sizes[1] <= sizes[0]:
        return 0.0, times[0] / max(1, sizes[0])
    per_row = max(0.0, (times[1] - times[0]) / (sizes[1] - sizes[0]))
    return max(0.0, times[1] - per_row * sizes[1]), per_row


def _run_slice(ex: Executor, job: Job, stop: int) -> None:
    """Run rows ``job.done:stop`` with ``ex`` into ``job.output``."""
    assert job.output is not None  # the serial rows ran first
    sub = Job(
        job.fn,
        job.rows.head(stop),
        _head(job.output, stop),
        job.timeout,
        done=job.done,
    )
    ex.run(sub)  # writes into views of job.output
    job.done = stop


def _head(out: Output, stop: int) -> Output:
    return Output(out.spec, [b[:stop] for b in out.buffers], out.first_row, out.offset)


# ---------------------------------------------------------------- the executor


class Auto:
    """Per-signature choices of one pool; ``run`` calibrates or reuses, then runs."""

    def __init__(self) -> None:
        self._choices: dict[Any, Calibration] = {}
        self._lock = threading.Lock()

    def run(
        self,
        job: Job,
        get: Callable[[str], Executor],
        workers: int,
        device: Any,
        allow_processes: bool,
    ) -> tuple[Any, Calibration]:
        key = signature(job.fn, job.rows, device)
        n = len(job.rows)
        with self._lock:
            cal = self._choices.get(key)
        usable = cal is not None and (allow_processes or cal.choice not in ("processes", "joblib"))
        if cal is not None and usable and cal.settled and cal.rows / 4 <= n <= cal.rows * 4:
            with self._lock:
                cal.count_batch(n)
            return get(cal.choice).run(job), cal
        thorough = cal is not None and not cal.settled
        cal = Calibrator(job, get, workers, allow_processes, thorough).run()
        cal.count_batch(n)
        with self._lock:
            self._choices[key] = cal
        if job.done >= n:
            return job.output, cal
        return get(cal.choice).run(job), cal

    def choices(self) -> dict[Any, Calibration]:
        with self._lock:
            return dict(self._choices)
