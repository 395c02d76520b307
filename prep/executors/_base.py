"""The executor contract: ``run(job) -> Output`` and ``close()``, and what ``auto`` asks.

A :class:`~._job.Job` is one call of ``map_rows`` (:mod:`._job`). Every executor
fills every row of ``job.sink.output`` and returns it, or raises one of prep's
errors; afterwards it is still usable (a pool that
lost a worker rebuilds itself on the next call).

``auto`` measures and starts executors through the rest of :class:`Executor`
alone, never by their class or name. Each measures itself on the batch auto
samples (:meth:`~Executor.measure`, or a batched form's
:meth:`~Executor.first_batch`: :class:`Sampling` is what the sample offers,
:class:`Measured` the figures), estimates a batch from those figures
(:meth:`~Executor.estimate`), and says by class attributes what role it plays
(``pooled``, ``rent_or_buy``, ``per_row``). Besides: what starting one costs
(:meth:`~Executor.start_cost`, :meth:`~Executor.warm_up`), what a batch costs it
beyond its rows (:meth:`~Executor.dispatch_cost`), whether it can take a job
here at all (:meth:`~Executor.ruled_out`, :meth:`~Executor.unsuitable`), how
one of its workers runs torch (:meth:`~Executor.as_worker`), making it ready
for a function (:meth:`~Executor.prepare`), and its batched form, if it has
one. Each has a
default that fits an executor with nothing to start.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol, TypeVar

from ..core.output import Output
from ..errors import ConfigError
from ._daemons import on_intra_op_threads
from ._job import Job

T = TypeVar("T")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def in_worker_process() -> bool:
    """True inside a DataLoader worker or any daemonic process (which cannot have children)."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None or multiprocessing.current_process().daemon


def resolve_workers(workers: int | None) -> int:
    if workers is None:
        return available_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(
            f"workers={workers!r} is not a positive integer; pass workers >= 1, "
            f"or None for one per core ({available_cores()} here)"
        )
    return workers


def threads_per_worker(workers: int) -> int:
    """Intra-op threads each worker may use so that workers x threads <= cores."""
    return max(1, available_cores() // workers)


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``start:stop`` cut into at most ``parts`` contiguous ranges of near-equal size."""
    n = stop - start
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    ranges, at = [], start
    for p in range(parts):
        end = at + size + (p < extra)
        ranges.append((at, end))
        at = end
    return [r for r in ranges if r[0] < r[1]]


class Measured(Protocol):
    """What ``auto`` measured on a sample (``prep.auto``'s figures), filled by each
    executor's :meth:`Executor.measure` and read by its :meth:`Executor.estimate`.
    Serial's figures are auto's own (every other one is relative to them); what one
    executor measures of itself is kept under its name, so that auto holds no field
    of any executor: the seconds a row of a batched form, the speed-up of a pool,
    what a batch costs a started executor beyond its rows, and what starting it
    costs here."""

    workers: int
    #: serial's seconds a row, and how many cores' worth torch's own threads made it
    #: faster by (the seconds a row on one worker's share of them: ``one_thread_row``)
    serial_row: float
    serial_cores: float
    one_thread_row: float | None
    #: bytes a row and its result weigh
    bytes_per_row: int
    batched_rows: dict[str, float]
    speedup: dict[str, float]
    dispatch: dict[str, float]
    #: the dispatch costs were measured on a running pool (else they are assumed)
    dispatch_measured: bool
    start: dict[str, float]
    #: why an executor is left out, by its name (``explain`` prints it)
    dropped: dict[str, str]


class RowCursor(Protocol):
    """A job and how many of its rows, from its start, are in its output so far."""

    done: int

    @property
    def job(self) -> Job: ...

    @property
    def left(self) -> int: ...

    def run(self, ex: Executor, stop: int) -> None:
        """Rows ``done:stop`` with ``ex``, into the job's output; ``done`` moves to ``stop``."""


class Sampling(Protocol):
    """A batch under ``auto``'s measurement (``prep.auto``'s ``Sample``), as an
    executor's own steps see it (:meth:`Executor.measure`, and a batched form's
    :meth:`Executor.first_batch` and :meth:`Executor.still_agrees`): every row they
    run goes into the output (``main``), so no row of the batch runs twice."""

    @property
    def job(self) -> Job: ...

    @property
    def main(self) -> RowCursor:
        """The rows of the job already in its output: a step runs the next ones."""

    @property
    def n(self) -> int: ...

    @property
    def cores(self) -> int:
        """Cores the workers may use: ``min(workers, available_cores())``."""

    @property
    def allow_processes(self) -> bool:
        """False inside a DataLoader worker (no child processes)."""

    @property
    def cal(self) -> Measured:
        """The figures being filled."""

    @property
    def best_serial(self) -> float:
        """Seconds a row of the fastest serial block so far."""

    def now(self) -> float:
        """The time, once a GPU batch's queued kernels have run."""

    def executor(self, name: str) -> Executor:
        """The executor of that name that auto measures and runs (started on first use)."""

    def scratch(self, k: int) -> RowCursor:
        """A cursor over copies of the first ``k`` rows, into an output of its own."""

    def serial(self, budget_rows: int, cursor: RowCursor | None = None) -> None:
        """Serial timed on up to ``budget_rows`` rows of ``cursor`` (``main`` by default)."""

    def serial_block(self, size: int, cursor: RowCursor | None = None) -> float:
        """The next ``size`` rows run serially; the seconds they took."""


class Executor(ABC):
    """Runs jobs. Subclasses set ``name`` and implement :meth:`run`."""

    name: ClassVar[str]
    #: whether it runs the row function once per row (False for ``vectorized``)
    per_row: ClassVar[bool] = True
    #: whether it starts child processes (not allowed inside a DataLoader worker)
    needs_processes: ClassVar[bool] = False
    #: whether it runs every row in the calling thread, with no workers of its own (what
    #: a shard worker of ``prep run`` may run its rows with)
    in_caller: ClassVar[bool] = False
    #: the executors whose workers (their ``engine``) a stream of this one may give whole
    #: batches to, its own kind last (none: a stream splits every batch)
    stream_workers: ClassVar[tuple[str, ...]] = ()
    #: whether it spreads the rows over workers of its own (a pool): auto wants it
    #: predicted clearly faster (``prep.auto.POOL_MARGIN``) before it takes the cores
    pooled: ClassVar[bool] = False
    #: whether starting it costs enough that auto predicts it without starting it, and
    #: starts it only once what it would have saved pays for the start (rent or buy)
    rent_or_buy: ClassVar[bool] = False

    def __init__(self, workers: int | None = None) -> None:
        self.workers = resolve_workers(workers)

    #: its workers as units take them (``submit(unit) -> Ticket``): the one pool a
    #: Pool's batches, streams and shards run on; None for an executor without workers
    engine: Any = None

    @abstractmethod
    def run(self, job: Job) -> Output | None:
        """Fill rows ``job.start:`` of ``job.sink.output`` (allocating it if None) and return
        it: None only for a batch of 0 rows without ``out=``, whose output no row shaped."""

    def close(self) -> None:  # noqa: B027 (executors without resources need not close)
        """Release threads and processes. It is safe to call this several times."""

    def release(self) -> bool:
        """Stop its workers if none holds work now (a later batch starts them again);
        True if it did. auto releases a pool none of its functions may use any more."""
        return False

    # ------------------------------------------------------------ what auto asks of it

    @classmethod
    def ruled_out(cls, job: Job, processes_allowed: bool) -> str | None:
        """Why auto cannot weigh it for ``job`` at all, known before anything is
        measured (a batched form without the form it calls, child processes inside a
        DataLoader worker); None when it may."""
        return None

    @classmethod
    def measure(cls, sample: Sampling) -> None:
        """Measure itself on the next rows of ``sample`` (their results go into the
        output, as for real) and keep its figures in ``sample.cal`` under its name, or
        say there why it is left out. Nothing by default: serial is auto's own
        measure (every figure is relative to it), and a batched form is measured by
        :meth:`first_batch` or as it runs the rest of a batch."""
        return None

    @classmethod
    def first_batch(cls, sample: Sampling) -> bool:
        """A batched form on the first batch of a signature: make the whole output in
        one call, checked against serial's rows, and keep its seconds a row in
        ``sample.cal.batched_rows``; False (and nothing written) where it cannot."""
        return False

    @classmethod
    def still_agrees(cls, sample: Sampling) -> bool:
        """A batched form on a later batch, before it runs the rows serial left: whether
        it still reproduces serial's rows (False: ``sample.cal.dropped`` says why)."""
        return True

    @classmethod
    def estimate(cls, measured: Measured, rows: int, cores: int) -> float | None:
        """Seconds ``rows`` rows would take it on ``cores`` cores, once started, from
        what auto measured; None: nothing measured says (auto does not weigh it)."""
        return None

    def start_cost(self) -> float | None:
        """Seconds starting it would take now, as measured here: 0 when it is ready to
        run (nothing to start), None while that is not known (see :meth:`warm_up`)."""
        return 0.0

    def warm_up(self) -> bool:
        """Start in the background what makes :meth:`start_cost` known (prep's
        forkserver, for processes); True if this call started it."""
        return False

    def warm_up_cost(self) -> float | None:
        """Seconds of CPU :meth:`warm_up` was measured to take here (None: not yet)."""
        return None

    def start_failure(self) -> str | None:
        """Why its workers could not start here, once that was tried and failed."""
        return None

    def dispatch_cost(self) -> float:
        """Seconds a batch costs it beyond its rows, once started (auto asks only when
        :meth:`start_cost` is 0: no executor is started just to be measured)."""
        return 0.0

    def unsuitable(self, job: Job, nbytes: int) -> str | None:
        """Why it cannot run ``job`` here, whose rows and results weigh ``nbytes``;
        None when it can."""
        return None

    def worker_threads(self) -> int | None:
        """Intra-op threads torch runs on in each of its workers (None: the caller's)."""
        return None

    def as_worker(self, fn: Callable[[], T]) -> T:
        """``fn()`` run as one of its workers runs a row: in a thread of its own, torch
        on :meth:`worker_threads` intra-op threads (torch's setting is per thread, so
        the caller's stays as it is)."""
        threads = self.worker_threads()
        return fn() if threads is None else on_intra_op_threads(fn, threads)

    def prepare(self, fn: Callable[..., Any], timeout: float | None = None) -> float:
        """Make it ready to run ``fn`` (start its workers, have each load ``fn``); the
        seconds that took. Raises :class:`~prep.errors.ExecutorUnavailable` (its
        workers cannot start, or cannot load ``fn``) before any row has run."""
        return 0.0

    def batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        """The one call that makes every row at once (``per_row`` False), and its name
        for messages."""
        raise ConfigError(f"executor={self.name!r} runs the row function once a row")

    def batched_twin(self, fn: Callable[..., Any]) -> Any:
        """The batched twin it calls in place of ``fn`` (None: it calls ``fn``): the
        twin's rows are checked against ``fn``'s, serial being the reference."""
        return None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} workers={self.workers}>"


def copy_rows(given: Output, staged: Output, start: int = 0) -> Output:
    """Rows ``start:`` of ``staged`` copied into ``given`` (the ``out=`` a caller passed,
    which an executor could not write in place); ``given``. A pinned staging buffer
    is copied without blocking, as its CUDA copy follows."""
    for dst, src in zip(given.buffers, staged.buffers):
        dst[start:].copy_(src[start:], non_blocking=src.is_pinned())
    return given


def first_error(errors: list[BaseException]) -> BaseException:
    """Of the errors several workers reported, the one of the lowest row (as serial
    would have met it first); errors without a row come last."""
    return min(errors, key=lambda e: math.inf if (r := getattr(e, "row", None)) is None else r)


def iter_chunks(
    n: int, workers: int, per_worker: int = 4, first: int = 0
) -> Iterator[tuple[int, int]]:
    """Ranges over rows ``first:n``, a few per worker so fast workers take up slack."""
    yield from split(first, n, workers * per_worker)
