"""The executor contract: ``run(job) -> Output`` and ``close()``, and what ``auto`` asks.

A :class:`~._job.Job` is one call of ``map_rows`` (:mod:`._job`). Every executor
fills every row of ``job.sink.output`` and returns it, or raises one of prep's
errors; afterwards it is still usable (a pool that
lost a worker rebuilds itself on the next call).

``auto`` measures and starts executors through the rest of :class:`Executor`
alone, never by their class: what starting one costs (:meth:`~Executor.start_cost`,
:meth:`~Executor.warm_up`), what a batch costs it beyond its rows
(:meth:`~Executor.dispatch_cost`), whether it can take a job here at all
(:meth:`~Executor.unsuitable`), how one of its workers runs torch
(:meth:`~Executor.as_worker`), making it ready for a function
(:meth:`~Executor.prepare`), and its batched form, if it has one. Each has a
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
    """What ``auto`` measured on a sample (``prep.auto``'s figures), from which an
    executor estimates a batch (:meth:`Executor.estimate`): serial's seconds a row and
    how many cores' worth torch's own threads made it faster by, the thread pool's
    speed-up, a started process pool's seconds a batch beyond its rows, and the bytes
    a row and its result weigh."""

    serial_row: float
    serial_cores: float
    thread_speedup: float | None
    process_dispatch: float | None
    bytes_per_row: int

    @property
    def batched_rows(self) -> dict[str, float]:
        """Seconds a row, per batched form (by its name) that ran on the sample."""


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
