"""torchdata's ParallelMapper as a row mapper, on threads and on processes.

Peers of :mod:`benchmarks.peers` on :class:`prep.bench.peers.PeerPool`, as the
DataLoader is (:class:`prep.bench.peers.DataLoaderPeer`): both are made to
stream a data set once, not to map one batch after another, so each needs a way
to stay warm between calls (see :class:`TorchdataPeer`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from prep.bench.peers import PeerPool, SharedInputs

__all__ = ["ChunkCall", "TorchdataPeer", "TorchdataProcesses"]


class _Feed:
    """An endless iterable of chunks put in by the caller: a torchdata source that stays
    open between calls, so the ParallelMapper's workers stay warm."""

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()

    def put(self, chunk: list[tuple[Any, ...]]) -> None:
        self._queue.put(chunk)

    def end(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[Any]:
        while (chunk := self._queue.get()) is not self._END:
            yield chunk


class ChunkCall:
    """``fn(*item)`` for every item of a chunk: a picklable map function for torchdata
    (what its ``prebatch=`` does, for a source that never ends)."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call

    def __call__(self, chunk: list[tuple[Any, ...]]) -> list[Any]:
        return [self.call(*item) for item in chunk]


class TorchdataPeer(PeerPool):
    """``torchdata.nodes.ParallelMapper(IterableWrapper(rows), fn, num_workers, method="thread")``.

    A ParallelMapper starts new workers on every ``reset()``, so a warm one reads
    an endless feed: each call puts its chunks in and takes as many results out
    (``in_order=True``, torchdata's default, keeps them in order).
    """

    method = "thread"
    context: str | None = None

    def _open(self, stack: contextlib.ExitStack) -> Any:
        from torchdata.nodes import IterableWrapper, ParallelMapper

        self._feed = _Feed()
        stack.callback(self._feed.end)  # if reset() fails midway, its reading thread still ends
        node = ParallelMapper(
            IterableWrapper(self._feed),
            ChunkCall(self.rows.call),
            num_workers=self.workers,
            method=self.method,
            multiprocessing_context=self.context,
        )
        default = _new_threads_default()
        node.reset()
        stack.callback(self._end, node)
        if self.method == "thread":
            # its worker threads start with torch.set_num_threads(1), which also sets the
            # process-wide default for new threads: put that back (they keep their own 1)
            _set_new_threads_default(default)
        return node

    def map(self, items: list[tuple[Any, ...]], chunk: int) -> list[Any]:
        chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
        for part in chunks:
            self._feed.put(part)
        return [result for _ in chunks for result in next(self._pool)]

    def _end(self, node: Any) -> None:
        self._feed.end()  # its reading thread waits on the feed: let it see the end
        # torchdata 0.11 has no public close: ParallelMapper -> _ParallelMapperImpl ->
        # _ParallelMapperIter, whose _shutdown() sets its stop events and joins its workers
        inner = getattr(getattr(node, "_it", None), "_it", None)
        if inner is None:
            return
        inner._shutdown()
        for worker in getattr(inner, "_workers", []):
            if isinstance(worker, multiprocessing.process.BaseProcess) and worker.is_alive():
                worker.terminate()  # still busy with a chunk of an abandoned call
                worker.join(5)


def _new_threads_default() -> int:
    """torch's intra-op threads for a new thread (under OpenMP each thread has its own)."""
    found: list[int] = []
    reader = threading.Thread(target=lambda: found.append(torch.get_num_threads()))
    reader.start()
    reader.join()
    return found[0]


def _set_new_threads_default(threads: int) -> None:
    # from a short-lived thread, whose own setting dies with it (as prep's threads executor)
    setter = threading.Thread(target=torch.set_num_threads, args=(threads,))
    setter.start()
    setter.join()


class TorchdataProcesses(SharedInputs, TorchdataPeer):
    """The same with ``method="process"``, ``multiprocessing_context="forkserver"``."""

    method = "process"
    context = "forkserver"
