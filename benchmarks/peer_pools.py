"""The peer tools' pools beyond prep's own two, one class each: made once per group, run
on every call, closed.

Each is a :class:`prep.bench.peers.PeerPool`, as ``prep bench --peers``'
``multiprocessing.Pool`` and ``DataLoader`` are (that module says how the rows
travel, and why through a fresh shared-memory copy); the torchdata mappers are
in :mod:`benchmarks.peer_loaders`, the table of every peer in
:mod:`benchmarks.peers`. loky pickles a view's whole storage, so joblib gets
each row copied on its own; thread pools get plain views.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
from typing import Any

import torch

from prep.bench.peers import PeerPool, SharedInputs, each_tensor, forkserver, limit_threads

__all__ = ["CfProcesses", "CfThreads", "JoblibLoky", "Mpire"]


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
