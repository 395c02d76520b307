"""The executor contract: ``run(job) -> Output`` and ``close()``, as
``concurrent.futures.Executor`` is ``submit``/``map``/``shutdown``; the two with workers
of their own (threads, processes) give them as ``engine`` (``submit(unit) -> Ticket``).

A :class:`~._job.Job` is one call of ``map_rows`` (:mod:`._job`). Every executor
fills every row of ``job.sink.output`` and returns it, or raises one of prep's
errors; afterwards it is still usable (a pool that lost a worker rebuilds itself
on the next call). What the rest of prep needs to know of a kind of executor is its
:class:`Traits`; what ``auto`` needs (how it measures itself, estimates a batch,
starts) is its cost model, beside auto (``prep.auto.models``), not here.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.output import Output
from ..errors import ConfigError
from ._job import Job


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


#: torch's intra-op threads (and OpenMP/BLAS threads) in each worker process of a pool
#: (``processes``, ``joblib``): one, whatever the worker count, as a DataLoader's
#: workers have. The caller runs torch beside them (a training loop, on every core by
#: default), and OpenMP teams in separate processes cannot see each other: a worker's
#: team of two spins at every op's barrier for a thread whose core another process
#: holds (processes at workers=1, 2 cores: 43-76 images/s on 2 threads, 355-412 on 1).
PROCESS_THREADS = 1


def threads_per_worker(workers: int) -> int:
    """Intra-op threads each of ``workers`` threads of one process may use (a ``threads``
    pool's), so that workers x threads <= cores: one OpenMP runtime manages all of the
    process's teams, and throttles their spinning when they outnumber the cores.
    (``prep run``'s shard workers take this share too; a pool's worker processes take
    :data:`PROCESS_THREADS`.)"""
    return max(1, available_cores() // workers)


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``start:stop`` cut into at most ``parts`` contiguous ranges of near-equal size."""
    n = stop - start
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)  # the first ``extra`` ranges take a row more
    edges = [start + p * size + min(p, extra) for p in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < b]


@dataclass(frozen=True)
class Traits:
    """What the rest of prep needs to know of a kind of executor, besides running it.
    (What ``auto`` needs, to measure, weigh and start one, is its cost model, beside
    auto: ``prep.auto.models``.)"""

    #: whether it runs the row function once per row (False: one batched call)
    per_row: bool = True
    #: whether it starts child processes (not allowed inside a DataLoader worker)
    needs_processes: bool = False
    #: whether it runs every row in the calling thread, with no workers of its own (what
    #: a shard worker of ``prep run`` may run its rows with)
    in_caller: bool = False
    #: the executors whose workers (their ``engine``) a stream of this one may give whole
    #: batches to, its own kind last (none: a stream splits every batch)
    stream_workers: tuple[str, ...] = ()
    #: whether it calls the row function's batched twin in place of it (whose rows are
    #: checked against the row function's, serial being the reference)
    calls_twin: bool = False
    #: whether rows run at once in threads of one process, sharing its global random
    #: generators (``seed=`` then needs a row function that draws from its own ``rng``)
    shares_generators: bool = False
    #: whether its first call of a function compiles it (seconds of a core): auto rents or
    #: buys it (its cost model), and nothing tries it unasked (``prep run``'s plan)
    compiles: bool = False


class Executor(ABC):
    """Runs jobs. Subclasses set ``name`` and implement :meth:`run`; those with workers
    of their own give them as :attr:`engine` (``submit(unit) -> Ticket``)."""

    name: ClassVar[str]
    traits: ClassVar[Traits] = Traits()
    #: its workers as units take them (``submit(unit) -> Ticket``): the one pool a
    #: Pool's batches, streams and shards run on; None for an executor without workers
    engine: Any = None

    def __init__(self, workers: int | None = None) -> None:
        self.workers = resolve_workers(workers)

    @abstractmethod
    def run(self, job: Job) -> Output | None:
        """Fill rows ``job.start:`` of ``job.sink.output`` (allocating it if None) and return
        it: None only for a batch of 0 rows without ``out=``, whose output no row shaped."""

    def close(self) -> None:
        """Release threads and processes (its engine's). It is safe to call this several times."""
        if self.engine is not None:
            self.engine.close()

    def release(self) -> bool:
        """Stop its workers if none holds work now (a later batch starts them again);
        True if it did. auto releases a pool none of its functions may use any more."""
        return False

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
