"""The peer tools' pools, one class each: made once per group, run on every call, closed.

The data-loading libraries' mappers (torchdata, the DataLoader) are in
:mod:`prep.bench.peer_loaders`; this module has the pools and what they share.

Each one runs a group's row function the way its tool's documentation has it
(:mod:`prep.bench.peers` lists them)::

    batch ─▶ items(batch): one argument tuple per row (the rows go as the tool needs them)
          ─▶ map(items, chunk): the tool calls fn(*item) in its workers, results in order
          ─▶ stack(results): one output, as a user would build it (baselines.stack)

How the rows travel is the tool's: ``multiprocessing`` and everything built on
its queues (``concurrent.futures``, mpire, torchdata, the DataLoader) pickle
tensors with the reductions torch registers on import, which move a tensor's
storage into shared memory and send a file descriptor. So those pools get views
of a fresh shared-memory copy of the batch, made in the call: the one copy a
user's own batch pays when its first row is sent (sending views of the bench's
batch itself would move it into shared memory for good, and the prep executors
timed beside them would find it there). loky pickles a view's whole storage, so
joblib gets each row copied on its own. Thread pools get plain views.

A pool starts on its first ``run``, so a group's first call includes it.
Process pools of the tools that take a start method use forkserver, and set
torch's intra-op threads to cores // workers in each worker (torch's advice
against oversubscription); torchdata and the DataLoader set 1 themselves.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import math
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..executors import available_cores, shm_fits, shm_free
from .baselines import rows_of_batch, stack
from .verify import leaves

__all__ = [
    "CfProcesses",
    "CfThreads",
    "JoblibLoky",
    "MpPool",
    "Mpire",
    "PeerPool",
    "PeerRows",
    "SharedInputs",
    "chunk_size",
    "shared_copy",
]


def chunk_size(rows: int, workers: int) -> int:
    """Rows per task: what ``multiprocessing.Pool.map`` picks by default, 4 tasks a worker."""
    return max(1, math.ceil(rows / (4 * workers)))


def limit_threads(threads: int) -> None:
    """A worker initializer: torch's intra-op threads for this process."""
    torch.set_num_threads(threads)


def call_with_keywords(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return fn(*args, **kwargs)


@dataclass(frozen=True)
class PeerRows:
    """How one group's batch becomes argument tuples, and what to call on each.

    A dict batch passes its columns by keyword: then each item is ``(args, kwargs)``
    and the call is :func:`call_with_keywords` bound to ``fn`` (picklable, unlike a lambda).
    """

    fn: Callable[..., Any]
    samples: bool  # a list of samples (map_samples), not a batch of tensors
    keywords: bool

    @property
    def call(self) -> Callable[..., Any]:
        return functools.partial(call_with_keywords, self.fn) if self.keywords else self.fn

    def items(self, batch: Any) -> list[tuple[Any, ...]]:
        rows = rows_of_batch(batch, samples=self.samples)
        return [(args, kwargs) for args, kwargs in rows] if self.keywords else [a for a, _ in rows]


def each_tensor(value: Any, f: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``f`` applied to every tensor in it (tuples, lists and dicts walked)."""
    if isinstance(value, torch.Tensor):
        return f(value)
    if isinstance(value, (tuple, list)):
        return type(value)(each_tensor(v, f) for v in value)
    if isinstance(value, dict):
        return {k: each_tensor(v, f) for k, v in value.items()}
    return value


def into_shared(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in shared memory, as torch's reductions would move it there."""
    return torch.empty(t.shape, dtype=t.dtype).share_memory_().copy_(t)


def shared_copy(batch: Any) -> Any:
    """``batch`` with every tensor copied into shared memory, if /dev/shm has the room
    (writing past a full /dev/shm is a SIGBUS, which would end the whole bench)."""
    needed = sum(t.numel() * t.element_size() for t in leaves(batch))
    if not shm_fits(needed):
        raise MemoryError(
            f"the batch needs {needed / 2**20:.1f} MiB of shared memory to reach this tool's "
            f"workers, but /dev/shm has {(shm_free() or 0) / 2**20:.1f} MiB free; time "
            f"fewer rows, or give it a larger /dev/shm (docker run --shm-size=...)"
        )
    return each_tensor(batch, into_shared)


def forkserver() -> Any:
    return multiprocessing.get_context("forkserver")


class PeerPool:
    """One peer tool's pool for one group: started by the first :meth:`run`, then warm."""

    def __init__(self, rows: PeerRows, workers: int) -> None:
        self.rows = rows
        self.workers = workers
        self.threads = max(1, available_cores() // workers)
        self._stack = contextlib.ExitStack()
        self._pool: Any = None

    def run(self, batch: Any) -> Any:
        """The group's output for ``batch``: every row through the tool, then stacked."""
        if self._pool is None:
            self._pool = self._open(self._stack)
        items = self.items(batch)
        return stack(self.map(items, chunk_size(len(items), self.workers)))

    def items(self, batch: Any) -> list[tuple[Any, ...]]:
        """One argument tuple per row; this base class gives views, for threads."""
        return self.rows.items(batch)

    def close(self) -> None:
        """Stop the workers and wait for them (safe to call twice, or before any run)."""
        self._pool = None
        self._stack.close()

    def _open(self, stack: contextlib.ExitStack) -> Any:
        """Make the tool's pool, registering on ``stack`` what stops it."""
        raise NotImplementedError

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        raise NotImplementedError


class SharedInputs(PeerPool):
    """Rows as views of a fresh shared-memory copy of the batch: see the module docstring."""

    def items(self, batch: Any) -> list[tuple[Any, ...]]:
        return self.rows.items(shared_copy(batch))


class MpPool(SharedInputs):
    """``multiprocessing.Pool(workers).starmap(fn, rows, chunksize)``, forkserver context."""

    def _open(self, stack: contextlib.ExitStack) -> Any:
        pool = forkserver().Pool(self.workers, limit_threads, (self.threads,))
        stack.callback(pool.join)  # after terminate, which __exit__ calls but does not wait on
        return stack.enter_context(pool)

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        return self._pool.starmap(self.rows.call, items, chunksize=chunk)


class CfProcesses(SharedInputs):
    """``concurrent.futures.ProcessPoolExecutor(workers, mp_context=forkserver).map(...)``."""

    def _open(self, stack: contextlib.ExitStack) -> Any:
        pool = cf.ProcessPoolExecutor(
            self.workers, forkserver(), initializer=limit_threads, initargs=(self.threads,)
        )
        return stack.enter_context(pool)  # __exit__: shutdown(wait=True)

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        return list(self._pool.map(self.rows.call, *zip(*items), chunksize=chunk))


class CfThreads(PeerPool):
    """``concurrent.futures.ThreadPoolExecutor(workers).map(fn, ...)`` (chunksize means nothing
    to threads)."""

    def _open(self, stack: contextlib.ExitStack) -> Any:
        return stack.enter_context(cf.ThreadPoolExecutor(self.workers))

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        return list(self._pool.map(self.rows.call, *zip(*items)))


class JoblibLoky(PeerPool):
    """``with joblib.Parallel(n_jobs, backend="loky", batch_size="auto") as parallel``: the
    context manager is joblib's way to keep its workers for many calls.

    loky pickles a view's whole storage, so each row is copied on its own (one
    copy of the batch, each row shipped once). The workers are joblib's one
    reusable loky executor per interpreter (the ``plain_joblib`` baseline's
    too); closing shuts it down, so no worker outlives the group.
    """

    def items(self, batch: Any) -> list[tuple[Any, ...]]:
        return [each_tensor(item, torch.clone) for item in self.rows.items(batch)]

    def _open(self, stack: contextlib.ExitStack) -> Any:
        import joblib
        from joblib.externals.loky import get_reusable_executor

        stack.callback(lambda: get_reusable_executor().shutdown(wait=True))
        parallel = joblib.Parallel(n_jobs=self.workers, backend="loky", batch_size="auto")
        return stack.enter_context(parallel)

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        import joblib

        task = joblib.delayed(self.rows.call)
        return list(self._pool(task(*item) for item in items))


class Mpire(SharedInputs):
    """``mpire.WorkerPool(workers, keep_alive=True, start_method="forkserver").map(fn, rows,
    chunk_size=...)``; mpire unpacks each tuple of rows into arguments."""

    def _open(self, stack: contextlib.ExitStack) -> Any:
        from mpire import WorkerPool

        # one object for every map: mpire sends new map settings to its workers when they change
        self._init = functools.partial(limit_threads, self.threads)
        pool = WorkerPool(n_jobs=self.workers, keep_alive=True, start_method="forkserver")
        return stack.enter_context(pool)  # __exit__: terminate, joining the workers

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        return self._pool.map(self.rows.call, items, chunk_size=chunk, worker_init=self._init)
