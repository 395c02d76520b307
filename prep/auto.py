"""``executor="auto"``: measure the row function on a few rows, predict, choose, explain.

On the first call for a signature (the function and its bound arguments, the
batch's structure, per-row shapes, dtypes and device), ``auto`` calibrates on
rows of the batch itself, writing their results into the output as it goes,
so no row is computed twice and side effects do not repeat:

1. serial: a few blocks of rows, run as the serial executor runs them ->
   seconds per row;
2. the batched twin, if the function has one, on 1/16 and then 1/8 of the
   batch -> its fixed cost per call and its cost per row. If it beats serial
   by more than the cores could, it wins at once: no pool can divide serial
   time by more than the cores;
3. ``torch.func.vmap`` of the row function (no twin), re-run on the serial
   rows and compared bit for bit; dropped on any error, warning or mismatch.
   (vmap calls the function once for many rows: it is only ever considered
   for functions that pass that bit-for-bit check);
4. the thread pool on the next rows (about 0.1 s of work) -> its speed-up
   over serial, which shows how much of the function runs outside the GIL;
5. processes: predicted from serial time / workers, plus the warm pool's
   dispatch cost (measured once per pool, on a no-op), the cost of copying
   the batch and result through shared memory, and, for a pool not started
   yet, its start-up (0.2 s with the forkserver running, 2.5 s without).
   Left out inside DataLoader workers, on one core, for functions that cannot
   be pickled, for CUDA batches, and for less than 10 ms of work.

The lowest predicted time wins; the choice is cached for the pool's lifetime
and re-measured when the batch size changes more than 4x.
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

    def __str__(self) -> str:
        us = lambda s: f"{s * 1e6:,.1f} us" if s is not None else "-"  # noqa: E731
        lines = [
            f"auto: {self.rows} rows, {self.workers} workers; calibrated on {self.sample} rows "
            f"in {self.seconds * 1e3:.1f} ms",
            f"  serial {us(self.serial_row)}/row"
            + (f", vectorized {us(self.vectorized_row)}/row" if self.vectorized_row else "")
            + (f", vmap {us(self.vmap_row)}/row" if self.vmap_row else "")
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
        lines.append(f"  choice: {self.choice}")
        return "\n".join(lines)


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
        self, job: Job, get: Callable[[str], Executor], workers: int, allow_processes: bool
    ) -> None:
        self.job = job
        self.get = get
        self.n = len(job.rows)
        self.cal = Calibration(rows=self.n, workers=workers)
        self.allow_processes = allow_processes

    def _serial(self, budget_rows: int) -> None:
        """Seconds per row, as the serial executor runs them: blocks of 1, 2, 4 ... rows
        (up to BLOCK) until the time or row budget is spent; the last, largest block
        is the measurement."""
        job = self.job
        t = time.perf_counter()
        job.run_range(0, 1)  # the first row allocates the output: not timed
        job.done, per_row = 1, time.perf_counter() - t
        size, spent, took = 1, 0.0, 0.0
        # enough when a block of 2+ rows took a couple of ms (slow rows are steady) or
        # the time budget is spent; fast rows go on to full blocks, as they run for real
        while (
            job.done < self.n
            and job.done < budget_rows
            and spent < STEP_BUDGET
            and not (took > 2e-3 and size > 2)
        ):
            stop = min(self.n, job.done + size)
            t = time.perf_counter()
            job.run_range(job.done, stop)
            took = time.perf_counter() - t
            spent += took
            per_row = took / (stop - job.done)
            job.done, size = stop, min(2 * size, BLOCK)
        self.cal.serial_row = per_row

    def _take(self, count: int) -> tuple[int, int]:
        start = self.job.done
        return start, min(self.n, start + max(1, count))

    def _vectorized(self) -> None:
        # two calls of different sizes separate the fixed cost of a call from the per-row one
        ex, sizes, times = self.get("vectorized"), [], []
        # slices of 1/16 and 1/8 of the batch: big enough that the twin's fixed cost per
        # call does not pass for a cost per row
        first = max(8, self.n // 16)
        for size in (first, 2 * first):
            start, stop = self._take(size)
            if start >= self.n:
                break
            t = time.perf_counter()
            _run_slice(ex, self.job, stop)
            times.append(time.perf_counter() - t)
            sizes.append(stop - start)
        self.cal.vectorized_fixed, self.cal.vectorized_row = _fit(sizes, times)

    def _vmap(self) -> None:
        job = self.job
        if not isinstance(job.rows, TensorRows) or job.output is None or job.done < 2:
            self.cal.dropped["vmap"] = "needs a batch of tensors and two measured rows"
            return
        k = job.done
        head = job.rows.replace([c[:k] for c in job.rows.columns])
        ex = self.get("vmap")
        fn, _ = ex.batched(job.fn)  # type: ignore[attr-defined]
        # the first call warms vmap up; then two sizes, each the best of two calls (vmap
        # re-runs rows that are already in the output, so repeating costs no side effects)
        sizes, times = [1, k // 2, k], []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a vmap fallback warning means "slow path"
                for size in sizes:
                    part = head.replace([c[:size] for c in head.columns])
                    best = math.inf
                    for _ in range(1 if size == 1 else 2):
                        t = time.perf_counter()
                        result = part.call_batched(fn)
                        best = min(best, time.perf_counter() - t)
                    times.append(best)
            spec, leaves = flatten(result)
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
        self.cal.vmap_fixed, self.cal.vmap_row = _fit(sizes[1:], times[1:])

    def _threads(self, workers: int) -> None:
        """The thread pool itself on the next rows: its speed-up over serial, as it runs."""
        # about 0.1 s of serial work, at least two rows per thread, at most 8 blocks
        rows = int(min(max(0.1 / max(self.cal.serial_row, 1e-9), 2 * workers), 8 * BLOCK))
        rows = min(rows, max(2 * workers, (self.n - self.job.done) // 4))  # leave the most
        start, stop = self._take(rows)
        t = time.perf_counter()
        _run_slice(self.get("threads"), self.job, stop)
        per_row = (time.perf_counter() - t) / (stop - start)
        self.cal.thread_speedup = self.cal.serial_row / per_row if per_row else 1.0

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
        # with a twin, a few serial rows suffice: they only have to show how far behind it is
        self._serial(budget_rows=4 if twin else max(2, min(32, self.n // 8)))
        rest = lambda: self.n - job.done  # noqa: E731
        if twin and rest() > 0:
            self._vectorized()
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
        else:
            if workers > 1 and rest() >= 4 * workers:
                self._threads(workers)
            else:
                cal.dropped["threads"] = "one worker, or too few rows left to measure"
            self._consider_processes(rest(), cores)
        # predicted for a whole batch of this size: the choice is kept for the next ones
        self._predict(self.n)
        cal.sample = job.done
        cal.seconds = time.perf_counter() - t0
        return cal

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
        cal.choice = min(p, key=p.__getitem__)


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
        if cal is not None and usable and cal.rows / 4 <= n <= cal.rows * 4:
            return get(cal.choice).run(job), cal
        cal = Calibrator(job, get, workers, allow_processes).run()
        with self._lock:
            self._choices[key] = cal
        if job.done >= n:
            return job.output, cal
        return get(cal.choice).run(job), cal

    def choices(self) -> dict[Any, Calibration]:
        with self._lock:
            return dict(self._choices)
