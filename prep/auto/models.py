"""auto's model of each kind of executor: how it measures itself on auto's sample,
what it estimates a batch takes, what starting it costs, and what role it plays
(a pool, one auto rents or buys). One table, :data:`MODELS`, by executor name, beside
the registry: adding an executor is one module in ``prep/executors`` plus, if auto
should weigh it, one model here. An executor without a model is one auto never
weighs (the contract's defaults: :class:`CostModel`).

The executors themselves know none of this (``concurrent.futures`` keeps no cost
model in its ``Executor`` either): a model takes the executor auto runs, where it
needs its workers, as an argument.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from ..core.rows import TensorRows
from ..errors import BatchTimeout, ConfigError, FunctionLoadError, WorkerCrashed
from ..executors import (
    BLOCK,
    PROCESS_THREADS,
    Executor,
    Job,
    Load,
    describe_fn,
    noop_row,
    on_intra_op_threads,
    pickle_fn,
    server_running,
    shm_fits,
    shm_free,
    start_costs,
    traits_of,
    warm_up,
)
from ._cost import CostModel, Measured, Sampling
from ._forms import CompiledModel, VectorizedModel, VmapModel

#: seconds handing a batch's parts to the threads and back adds, as auto counts it
HAND_OVER = 2e-4
#: bytes a second a batch's rows and results cross shared memory at, as auto counts it
SHM_BYTES_PER_SECOND = 4e9
#: seconds a worker may take to load the row function (importing its modules)
LOAD_TIMEOUT = 120.0
#: seconds of serial work below which auto does not even consider worker processes
MIN_PROCESS_WORK = 0.01
#: dispatch cost auto assumes for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005

T = TypeVar("T")


class SerialModel(CostModel):
    name = "serial"

    @classmethod
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        return rows * cal.serial_row


class ThreadsModel(CostModel):
    name = "threads"
    pooled = True

    @classmethod
    def ruled_out(cls, job: Job) -> str | None:
        seeds = job.rows.seeds
        if seeds is not None and not seeds.rng:
            return "seed= and a function that draws from the global generators, which threads share"
        return None

    @classmethod
    def measure(cls, sample: Sampling) -> None:
        """The thread pool itself on the next rows (about 0.1 s of serial work): its
        speed-up over serial, as it runs, which shows how much of the function runs
        outside the GIL. No pool divides serial time by more than its cores."""
        s, cal, main = sample, sample.cal, sample.main
        if (reason := cls.ruled_out(s.job)) is not None:
            cal.dropped[cls.name] = reason
            return
        if cal.workers < 2 or main.left < 4 * cal.workers:
            cal.dropped[cls.name] = "one worker, or too few rows left to measure"
            return
        ex = s.executor(cls.name)
        # a new thread's first torch call sets up its own state: warm each one untimed
        main.run(ex, min(s.n, main.done + cal.workers))
        # about 0.1 s of serial work, at least two rows per thread, at most 8 blocks
        rows = int(min(max(0.1 / max(cal.serial_row, 1e-9), 2 * cal.workers), 8 * BLOCK))
        rows = min(rows, max(2 * cal.workers, main.left // 4))  # leave the most
        start, stop = main.done, min(s.n, main.done + rows)
        t = s.now()
        main.run(ex, stop)
        per_row = (s.now() - t) / max(1, stop - start)
        if cal.serial_row > 1.2 * per_row and main.left:
            # threads look faster: serial again, side by side, before believing it
            s.serial_block(min(BLOCK, max(2, rows // 2)))
            cal.serial_row = s.best_serial
        cal.speedup[cls.name] = min(s.cores, cal.serial_row / per_row)

    @classmethod
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        """Serial's time over the speed-up measured on the sample, plus a hand-over of
        the parts to the threads (about 0.2 ms)."""
        speedup = cal.speedup.get(cls.name)
        if speedup is None:
            return None
        return rows * cal.serial_row / max(speedup, 1e-9) + HAND_OVER


class ProcessesModel(CostModel):
    """Predicted, never started just to be measured (:class:`Prediction`): auto starts
    the pool once that pays (rent or buy)."""

    name = "processes"
    pooled = True
    rent_or_buy = True

    @classmethod
    def measure(cls, sample: Sampling) -> None:
        Prediction(sample, cls).run()

    @classmethod
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        """Serial's work (what a row spread over ``serial_cores`` cores) shared by the
        cores, plus the dispatch and the copy through shared memory."""
        dispatch = cal.dispatch.get(cls.name)
        if dispatch is None:
            return None
        copy = rows * cal.bytes_per_row / SHM_BYTES_PER_SECOND
        work = rows * cal.serial_row * cal.serial_cores / cores
        return work + dispatch + copy

    @classmethod
    def start_cost(cls, ex: Executor) -> float | None:
        """0 when it runs, the workers' start (measured here) when prep's forkserver is
        up, None before the server was measured (``warm_up``)."""
        if len(ex.engine.pids) == ex.workers:  # every worker up
            return 0.0
        costs = start_costs()
        if not server_running() or costs.worker is None:
            return None
        return costs.worker * ex.workers

    @classmethod
    def warm_up(cls) -> bool:
        return warm_up()

    @classmethod
    def warm_up_cost(cls) -> float | None:
        return start_costs().server

    @classmethod
    def start_failure(cls) -> str | None:
        return start_costs().failed

    @classmethod
    def unsuitable(cls, ex: Executor, job: Job, nbytes: int) -> str | None:
        """Why ``ex`` cannot run ``job`` here (rows and results of ``nbytes``); None if it can."""
        if job.rows.device.type != "cpu":
            return "the batch is on a GPU"
        try:
            pickle_fn(job.fn)
        except ConfigError:
            return "the function cannot be pickled"
        if not shm_fits(nbytes):
            return (
                f"the batch and its result need {nbytes / 2**20:.0f} MB of shared memory, "
                f"/dev/shm has {(shm_free() or 0) / 2**20:.0f} MB free"
            )
        return None

    @classmethod
    def dispatch_cost(cls, ex: Executor) -> float:
        """Seconds a batch costs a started ``ex`` beyond its rows, measured on a no-op row
        function: the faster of two tries (the first may wait for workers still starting)."""
        probe = TensorRows((torch.zeros(ex.workers * 2, 1),))
        best = math.inf
        for _ in range(2):
            t = time.perf_counter()
            ex.run(Job.new(noop_row, probe))
            best = min(best, time.perf_counter() - t)
        return best

    @classmethod
    def prepare(cls, ex: Executor, job: Job) -> float:
        """Start the workers if needed and have every one load the function; the seconds
        that took. Raises :class:`~prep.errors.FunctionLoadError` if a worker cannot load
        it, :class:`~prep.errors.ExecutorUnavailable` if the workers cannot start."""
        fn, timeout = job.fn, job.remaining()
        key = ex.engine.prepare(fn).key
        t = time.perf_counter()
        limit = LOAD_TIMEOUT if timeout is None else max(0.0, timeout)
        errors = []
        for ticket in ex.engine.submit([Load(key, limit) for _ in range(ex.workers)]):
            try:
                ticket.result()
            except (BatchTimeout, WorkerCrashed, FunctionLoadError) as exc:
                errors.append(_load_error(exc, fn, limit))
        if errors:
            raise errors[0]
        return time.perf_counter() - t

    @classmethod
    def as_worker(cls, ex: Executor, fn: Callable[[], T]) -> T:
        """``fn()`` as one of ``ex``'s workers runs a row (torch on as many threads)."""
        # in a thread of its own: torch's setting is per thread, and the caller's stays
        return on_intra_op_threads(fn, PROCESS_THREADS)


def _load_error(exc: Exception, fn: Any, limit: float) -> FunctionLoadError:
    """Why a worker could not load ``fn``, for the caller: what happened and what to do."""
    if isinstance(exc, FunctionLoadError):
        return exc
    if isinstance(exc, BatchTimeout):
        return FunctionLoadError(
            f"executor='processes' workers did not load the row function {describe_fn(fn)} "
            f"within {limit:.1f} s (does importing what it needs hang?); check that its "
            f"modules import quickly in a fresh interpreter, or use executor='threads'"
        )
    return FunctionLoadError(
        f"a worker died while it loaded the row function {describe_fn(fn)} ({exc}); "
        f"or use executor='threads'"
    )


class Prediction:
    """A started pool's batch predicted on auto's sample, or why processes are left out:
    serial's time shared by the workers (serial is timed again with torch on as many
    intra-op threads as each worker gets: when torch's own threads already spread a
    row over the cores, there is less left to divide), the warm pool's dispatch
    (measured once a pool runs, else ``COLD_DISPATCH``), and the copy of the batch
    and result through shared memory. What starting it costs is measured here too,
    for auto's rent or buy."""

    def __init__(self, sample: Sampling, kind: type[ProcessesModel]) -> None:
        self.s, self.cal, self.name, self.kind = sample, sample.cal, kind.name, kind

    def run(self) -> None:
        s, cal = self.s, self.cal
        if (reason := self._left_out()) is not None:
            cal.dropped[self.name] = reason
            return
        ex = s.executor(self.name)
        cal.bytes_per_row = self._bytes_per_row()
        if (reason := self.kind.unsuitable(ex, s.job, cal.bytes_per_row * s.n)) is not None:
            cal.dropped[self.name] = reason
            return
        self._one_thread(ex)
        start = self.kind.start_cost(ex)
        if start is None:
            cal.start.pop(self.name, None)
        else:
            cal.start[self.name] = start
        if start == 0:  # a warm pool: measure what a batch costs it
            cal.dispatch[self.name] = self.kind.dispatch_cost(ex)
            cal.dispatch_measured = True
        else:  # do not start a pool just to measure it: auto starts it when it pays
            cal.dispatch[self.name] = COLD_DISPATCH

    def _left_out(self) -> str | None:
        s, cal = self.s, self.cal
        if (reason := s.left_out.get(self.name) or self.kind.ruled_out(s.job)) is not None:
            return reason
        if s.cores < 2:
            return "one core or one worker"
        if s.main.left * cal.serial_row < MIN_PROCESS_WORK:
            return (
                f"the rest of the batch takes {s.main.left * cal.serial_row * 1e3:.1f} ms "
                f"serially; worker processes cannot pay off"
            )
        return None

    def _bytes_per_row(self) -> int:
        """What one row costs to send through shared memory: its columns and its result."""
        s = self.s
        out = s.job.sink.output
        result = out.nbytes // max(1, len(out)) if out is not None else 0
        return s.job.rows.nbytes // max(1, s.n) + result

    def _one_thread(self, ex: Executor) -> None:
        """Serial again with torch on as many intra-op threads as each of ``ex``'s
        workers has: when torch's own threads already spread a row over the cores,
        the workers have nothing left to divide."""
        s, cal, main = self.s, self.cal, self.s.main
        intra, share = torch.get_num_threads(), PROCESS_THREADS
        if intra < 2 or share >= intra or main.left < 8:
            return
        rows = int(min(max(0.02 / max(cal.serial_row, 1e-9), 2), BLOCK, main.left // 8))

        def block() -> float:
            t, start = s.now(), main.done
            main.job.run_range(start, start + rows)
            main.done = start + rows
            return (s.now() - t) / rows

        def measure() -> float:
            per_row = block()
            if per_row > 1.2 * cal.serial_row:  # slower: once more before believing it,
                per_row = min(per_row, block())  # as noise only ever slows a block down
            return per_row

        per_row = self.kind.as_worker(ex, measure)
        cal.one_thread_row = per_row
        cal.serial_cores = min(max(1.0, per_row / cal.serial_row), float(s.cores))


#: the model of each executor auto weighs, by name, in the registry's order (a batched
#: twin the user wrote comes before vmap, and vmap before its compiled form). joblib has
#: none: its loky workers are not predicted (docs/auto.md says why), so auto never
#: weighs it.
MODELS: dict[str, type[CostModel]] = {
    m.name: m
    for m in (
        SerialModel,
        ThreadsModel,
        ProcessesModel,
        VectorizedModel,
        VmapModel,
        CompiledModel,
    )
}


#: the pools auto weighs (a batch cut across workers) and the batched forms (one call)
POOLS = tuple(name for name, m in MODELS.items() if m.pooled)
BATCHED = tuple(name for name in MODELS if not traits_of(name).per_row)


def left_out(processes_allowed: bool) -> Mapping[str, str]:
    """The executors auto does not weigh in this process, each with why: those that start
    child processes, where none may start (inside a DataLoader worker). Worked out once
    a call (``AutoExecutor.run``, ``prep.explain``) and handed down."""
    if processes_allowed:
        return {}
    why = "inside a DataLoader worker (no child processes)"
    return {name: why for name in MODELS if traits_of(name).needs_processes}


def model(name: str) -> type[CostModel]:
    """The model of the executor of that name (the defaults for one without)."""
    return MODELS.get(name, CostModel)


__all__ = [
    "BATCHED",
    "COLD_DISPATCH",
    "MIN_PROCESS_WORK",
    "MODELS",
    "POOLS",
    "CostModel",
    "Prediction",
    "ProcessesModel",
    "model",
]
