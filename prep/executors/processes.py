"""``executor="processes"``: one batch cut into a part per worker (fewer for light rows),
on the same worker processes that run a stream's batches and ``prep run``'s shards
(``_batches``).

    parent                                              worker k (prep's forkserver)
    ──────                                              ────────────────────────────
    fn, cloudpickled (once per function) ── "fn" ─────▶ loads it, keeps a few
    the batch's tensors ─ shared memory (the ring) ─┐
    rows a:b of the batch, a part per worker ───────┴─▶ fn(row i) for i in a:b
       (as many parts as carry 0.5 ms each)
    Ticket.result() for each part  ◀── "done" (written into the shared output) or a
                                       chunk of its own (ragged rows, fill/skip), merged

``map_rows`` is a stream of one batch: it submits the batch's parts and waits for
their tickets, on the workers a stream keeps several batches in flight on. Each
part costs the caller a message out, one back and a merge (0.2-0.3 ms here), so
once a function's rows have been timed in a worker, a batch is cut into no more
parts than carry ``PART_WORK`` (0.5 ms) of work each: light rows go whole to one
worker (``_shapes.RowCosts``). Once a
function and row layout has shown its output's shape, the next batch's output is
made here in shared memory and each worker writes its rows in place; before that,
and where rows may differ in size or fail on their own (``pad=``, ``on_error=``),
parts come back as chunks (in the message itself when small) and are merged
(``_chunks``).

Failures become errors, never hangs: a worker that dies fails its part
(:class:`~prep.WorkerCrashed`) and a fresh one takes its place; under
``on_error='fill'``/``'skip'`` its rows run again, each alone, on the same workers
(``_isolation``), so the row that killed it fails alone. A part past the batch's
deadline has its worker killed (:class:`~prep.BatchTimeout`); Ctrl-C in the caller
replaces the workers that still hold its parts. A row that raises only costs the
batch (:class:`~prep.RowError`, the lowest row's, as serial raises it).
Workers are forked from prep's own forkserver (``_spawn``), which preloads torch,
so they start in milliseconds, never inherit a CUDA context and never import or
run the user's main script; each exits by itself when the parent disappears. The
row function travels with cloudpickle: by name when the workers can import it, by
value when they cannot (``__main__`` of a script, a notebook, ``python -c`` or
stdin; lambdas, closures, local functions).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..core.output import Output
from ..core.rows import TensorRows
from ..errors import (
    BatchTimeout,
    ConfigError,
    FunctionLoadError,
    StackError,
    WorkerCrashed,
)
from . import _spawn, _worker
from ._base import Executor, Measured, Sampling, copy_rows, split, threads_per_worker
from ._batches import ProcessBatches
from ._chunks import gather
from ._fdpipe import INLINE
from ._handles import how_it_ended
from ._isolation import Isolation
from ._job import BLOCK, Job
from ._ticket import Ticket
from ._transport import check_shm, describe_fn, pickle_fn, shm_fits, shm_free

__all__ = ["LOAD_TIMEOUT", "ProcessExecutor", "pickle_fn", "shm_fits", "shm_free"]

#: seconds a worker may take to load the row function (importing its modules)
LOAD_TIMEOUT = 120.0
#: bytes a second a batch's rows and results cross shared memory at, as auto counts it
SHM_BYTES_PER_SECOND = 4e9
#: parts per worker of a batch with a progress bar (else at most one: the fewest messages)
PROGRESS_PARTS = 4
#: seconds of serial work below which auto does not even consider worker processes
MIN_PROCESS_WORK = 0.01
#: dispatch cost auto assumes for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005


class ProcessExecutor(Executor):
    name = "processes"
    needs_processes = True
    stream_workers = ("processes",)
    pooled = True
    rent_or_buy = True

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        #: the workers: this executor's batches, and a stream's (``Executor.engine``)
        self.batches = self.engine = ProcessBatches(self.workers)
        self._dispatch: float | None = None

    # -------------------------------------------------------------- lifecycle

    @property
    def started(self) -> bool:
        """Whether the workers are up (started, not necessarily ready)."""
        return self.batches.started

    def start_cost(self) -> float | None:
        """0 when it runs, the workers' start (measured here) when prep's forkserver is
        up, None before the server was measured (:func:`_spawn.warm_up`)."""
        if self.started:
            return 0.0
        costs = _spawn.start_costs()
        if not _spawn.server_running() or costs.worker is None:
            return None
        return costs.worker * self.workers

    def warm_up(self) -> bool:
        return _spawn.warm_up()

    def warm_up_cost(self) -> float | None:
        return _spawn.start_costs().server

    def start_failure(self) -> str | None:
        return _spawn.start_costs().failed

    def unsuitable(self, job: Job, nbytes: int) -> str | None:
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
    def ruled_out(cls, job: Job, processes_allowed: bool) -> str | None:
        return None if processes_allowed else "inside a DataLoader worker (no child processes)"

    @classmethod
    def measure(cls, sample: Sampling) -> None:
        """Predicted, never started just to be measured: auto starts the pool once that
        pays (rent or buy). See :class:`_Prediction`."""
        _Prediction(sample, cls).run()

    @classmethod
    def estimate(cls, measured: Measured, rows: int, cores: int) -> float | None:
        """Serial's work (what a row spread over ``serial_cores`` cores) shared by the
        cores, plus the dispatch and the copy through shared memory."""
        dispatch = measured.dispatch.get(cls.name)
        if dispatch is None:
            return None
        copy = rows * measured.bytes_per_row / SHM_BYTES_PER_SECOND
        work = rows * measured.serial_row * measured.serial_cores / cores
        return work + dispatch + copy

    def worker_threads(self) -> int | None:
        return threads_per_worker(self.workers)

    def prepare(self, fn: Any, timeout: float | None = None) -> float:
        """Start the workers if needed and have every one load ``fn``; the seconds that
        took. Raises :class:`~prep.errors.FunctionLoadError` if a worker cannot load
        it, :class:`~prep.errors.ExecutorUnavailable` if the workers cannot start."""
        key = self.batches.prepare(fn)
        t = time.perf_counter()
        limit = LOAD_TIMEOUT if timeout is None else max(0.0, timeout)
        errors = []
        for ticket in self.batches.load(key, limit):
            try:
                ticket.result()
            except (BatchTimeout, WorkerCrashed, FunctionLoadError) as exc:
                errors.append(_load_error(exc, fn, limit))
        if errors:
            raise errors[0]
        return time.perf_counter() - t

    def dispatch_cost(self) -> float:
        """Measured once, on a no-op row function: the faster of two tries (the first
        may wait for workers still starting)."""
        if self._dispatch is None:
            probe = TensorRows((torch.zeros(self.workers * 2, 1),))
            best = math.inf
            for _ in range(2):
                t = time.perf_counter()
                self.run(Job.new(_worker.identity, probe))
                best = min(best, time.perf_counter() - t)
            self._dispatch = best
        return self._dispatch

    def close(self) -> None:
        self._dispatch = None
        self.batches.close()

    def release(self) -> bool:
        return self.batches.release()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty until the first batch)."""
        return self.batches.pids

    # -------------------------------------------------------------- one batch

    def run(self, job: Job) -> Output | None:
        n = len(job.rows)
        if job.start >= n:
            return job.sink.output
        key = self.batches.prepare(job.fn)
        given = job.sink.output
        shape_key = (key, job.rows.layout())
        into = None
        # rows of one shape, none failing alone, an output too large to travel inside a
        # message: written in place, in shared memory
        if job.policy.plain and given is None:
            into = self.batches.shapes.guess(shape_key, n, shared=True)
        elif (
            job.policy.plain and given is not None and min(b.nbytes for b in given.buffers) > INLINE
        ):
            into = given
            if not all(b.is_shared() and b.is_contiguous() for b in given.buffers):
                check_shm(given.nbytes, "the output")
                into = given.like(shared=True)  # staging: copied into out= at the end
        try:
            self._parts(job, key, into)
        except StackError:
            if into is None or given is not None:
                raise
            # rows unlike last batch's: run the batch again as the first one ran, so
            # that the error names what serial names (or it is no error: its own shape)
            self.batches.shapes.forget(shape_key)
            self._parts(job, key, None)
            into = None
        out = job.sink.output
        if out is None:
            return None  # every row failed (on_error='fill'/'skip'): none gave a shape
        if job.policy.plain and given is None:
            self.batches.shapes.keep(shape_key, out)
        if given is not None and into is not None and into is not given:
            job.sink.output = copy_rows(given, into, job.start)
        return job.sink.output

    def _parts(self, job: Job, key: str, into: Output | None) -> None:
        """Rows ``job.start:`` in a part per worker (fewer for light rows, more with a
        progress bar), each written into ``into`` or merged into ``job.sink`` as it
        comes back; under fill/skip the rows of a part whose worker died run again
        (:mod:`._isolation`)."""
        n, costs = len(job.rows), self.batches.costs
        if job.sink.progress is not None:
            parts = self.workers * PROGRESS_PARTS
        else:  # light rows: fewer parts, as many as pay for their messages (``RowCosts``)
            parts = costs.parts(key, n - job.start, self.workers)
        bounds = split(job.start, n, parts)
        isolation = Isolation(job)

        def crashed(ticket: Ticket, exc: WorkerCrashed) -> list[Ticket] | None:
            if not (ticket.crashed and job.policy.per_row_errors):
                return None
            held, who = ticket.bounds(), f"worker pid {exc.pid}"
            return self._submit(
                job, key, isolation.lost(held, who, how_it_ended(exc.exitcode)), into
            )

        tickets = self._submit(job, key, bounds, into)
        gather(job, list(tickets), into, self.batches.abandon, crashed)
        timed = [(t.busy, t.bounds()) for t in tickets if t.busy is not None]
        if timed:  # what a row costs: the slowest part per row, its worker's busy time
            busy, (start, stop) = max(timed, key=lambda x: x[0] / max(1, x[1][1] - x[1][0]))
            costs.keep(key, busy, stop - start)

    def _submit(
        self, job: Job, key: str, bounds: list[tuple[int, int]], into: Output | None
    ) -> list[Ticket]:
        tickets = self.batches.submit_parts(
            key, job.rows, job.policy, job.remaining(), bounds, into
        )
        for ticket in tickets:
            ticket.limit = job.timeout  # the batch's, as the caller gave it
        return tickets


class _Prediction:
    """A started pool's batch predicted on auto's sample, or why processes are left out:
    serial's time shared by the workers (serial is timed again with torch on as many
    intra-op threads as each worker gets: when torch's own threads already spread a
    row over the cores, there is less left to divide), the warm pool's dispatch
    (measured once a pool runs, else ``COLD_DISPATCH``), and the copy of the batch
    and result through shared memory. What starting it costs is measured here too,
    for auto's rent or buy."""

    def __init__(self, sample: Sampling, kind: type[Executor]) -> None:
        self.s, self.cal, self.name, self.kind = sample, sample.cal, kind.name, kind

    def run(self) -> None:
        s, cal = self.s, self.cal
        if (reason := self._left_out()) is not None:
            cal.dropped[self.name] = reason
            return
        ex = s.executor(self.name)
        cal.bytes_per_row = self._bytes_per_row()
        if (reason := ex.unsuitable(s.job, cal.bytes_per_row * s.n)) is not None:
            cal.dropped[self.name] = reason
            return
        self._one_thread(ex)
        start = ex.start_cost()
        if start is None:
            cal.start.pop(self.name, None)
        else:
            cal.start[self.name] = start
        if start == 0:  # a warm pool: measure what a batch costs it
            cal.dispatch[self.name] = ex.dispatch_cost()
            cal.dispatch_measured = True
        else:  # do not start a pool just to measure it: auto starts it when it pays
            cal.dispatch[self.name] = COLD_DISPATCH

    def _left_out(self) -> str | None:
        s, cal = self.s, self.cal
        if (reason := self.kind.ruled_out(s.job, s.allow_processes)) is not None:
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
        intra, share = torch.get_num_threads(), ex.worker_threads()
        if intra < 2 or share is None or share >= intra or main.left < 8:
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

        # in a thread of its own: torch's setting is per thread, and the caller's stays
        per_row = ex.as_worker(measure)
        cal.one_thread_row = per_row
        cal.serial_cores = min(max(1.0, per_row / cal.serial_row), float(s.cores))


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
