"""The two tools a user would otherwise map a row function with, as ``prep bench --peers``
races them: a ``multiprocessing.Pool`` and a ``DataLoader`` with workers.

Each runs the row function the way its documentation has it, its pool made on
the first call and reused (warm), and builds the output as a user would::

    batch ─▶ items(batch): one argument tuple per row (rows_of_batch)
          ─▶ map(items, chunk): the tool calls fn(*item) in its workers, results in order
          ─▶ stack(results): one output, results collected and then torch.stack'ed

How the rows travel is the tool's: multiprocessing's queues (the Pool's and the
DataLoader's) pickle tensors with the reductions torch registers on import,
which move a tensor's storage into shared memory and send a file descriptor.
So both get views of a fresh shared-memory copy of the batch, made in the call:
the one copy a user's own batch pays when its first row is sent (sending views
of the bench's batch itself would move it into shared memory for good, and the
prep executors timed beside them would find it there).

Both start their workers with forkserver (fork would copy a parent whose threads
may hold locks; spawn re-imports torch in every worker), whose server
:func:`session` starts with torch preloaded, as prep's own is. Chunks are
``rows / (4 x workers)`` rows, what ``Pool.map`` picks by default. The Pool's
workers set torch's intra-op threads to cores // workers (torch's advice
against oversubscription); the DataLoader's set 1 themselves.

The repository's ``benchmarks/`` folder builds more peers on :class:`PeerPool`
(concurrent.futures, joblib, mpire, torchdata).
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import forkserver as mp_forkserver
from typing import Any

import torch
from torch import Tensor

from ..executors import available_cores, shm_fits, shm_free
from .verify import leaves

__all__ = [
    "PEERS",
    "DataLoaderPeer",
    "MpPool",
    "Peer",
    "PeerPool",
    "PeerRows",
    "RowsDataset",
    "SharedInputs",
    "chunk_size",
    "each_tensor",
    "forkserver",
    "limit_threads",
    "rows_of_batch",
    "session",
    "shared_copy",
    "stack",
]


def rows_of_batch(
    batch: Any, *, samples: bool = False
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` of each row, as a plain loop over ``batch`` would make them.

    ``samples=True``: ``batch`` is a list of samples for ``map_samples``, one argument each.
    """
    if samples:
        return [((sample,), {}) for sample in batch]
    if isinstance(batch, torch.Tensor):
        return [((row,), {}) for row in batch]
    if isinstance(batch, (tuple, list)):
        return [(row, {}) for row in zip(*batch)]
    if isinstance(batch, dict):
        names = list(batch)
        return [((), dict(zip(names, row))) for row in zip(*batch.values())]
    raise TypeError(
        f"a batch is a Tensor, a tuple/list or a dict of Tensors, got {type(batch).__name__}; "
        f"make the --batch factory return one of those"
    )


def stack(results: list[Any], join: Callable[[list[Tensor]], Tensor] = torch.stack) -> Any:
    """``torch.stack`` of row results that are Tensors, tuples or dicts of Tensors
    (``join=torch.cat``: of chunk results, each already stacked)."""
    first = results[0]
    if isinstance(first, torch.Tensor):
        return join(results)
    if isinstance(first, (tuple, list)):
        return tuple(join(list(col)) for col in zip(*results))
    if isinstance(first, dict):
        return {k: join([r[k] for r in results]) for k in first}
    raise TypeError(
        f"the row function returned a {type(first).__name__}; a peer stacks "
        f"Tensors, tuples or dicts of Tensors only"
    )


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
    """How one batch becomes argument tuples, and what to call on each.

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
    """One peer tool's pool: started by the first :meth:`run`, then warm."""

    def __init__(self, rows: PeerRows, workers: int) -> None:
        self.rows = rows
        self.workers = workers
        self.threads = max(1, available_cores() // workers)
        self._stack = contextlib.ExitStack()
        self._pool: Any = None

    def run(self, batch: Any) -> Any:
        """The output for ``batch``: every row through the tool, then stacked."""
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


class RowsDataset(torch.utils.data.Dataset):
    """A map-style data set whose item ``i`` is ``fn(*items[i])``."""

    def __init__(self, call: Callable[..., Any], items: list[tuple[Any, ...]]) -> None:
        self.call = call
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.call(*self.items[i])


class DataLoaderPeer(PeerPool):
    """``DataLoader(rows, batch_size=chunk, num_workers=workers, collate_fn=default_collate,
    persistent_workers=True, multiprocessing_context="forkserver")`` as a row mapper.

    Its workers get the data set once, when they start; so the data set holds
    the rows as views of shared memory, and each call copies its batch in (the
    one copy the other process pools pay too) before iterating. A list of
    samples cannot be refilled that way: its workers keep the first call's.
    The workers stack each chunk (into shared memory); the chunks are then
    concatenated.
    """

    def run(self, batch: Any) -> Any:
        if self._pool is None:
            self._shared = shared_copy(batch)
            self._pool = self._loader(self._shared, self._stack)
        else:
            for mine, given in zip(leaves(self._shared), leaves(batch)):
                mine.copy_(given)
        return stack(list(self._pool), join=torch.cat)

    def _loader(self, shared: Any, stack: contextlib.ExitStack) -> Any:
        from torch.utils.data import DataLoader, default_collate

        items = self.rows.items(shared)
        loader = DataLoader(
            RowsDataset(self.rows.call, items),
            batch_size=chunk_size(len(items), self.workers),
            num_workers=self.workers,
            collate_fn=default_collate,
            persistent_workers=True,
            multiprocessing_context="forkserver",
        )
        stack.callback(_stop_loader, loader)
        return loader


def _stop_loader(loader: Any) -> None:
    # no public close: persistent workers stop when the loader's iterator is collected.
    # Do it now (what its __del__ calls), instead of whenever the GC gets to it
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


@dataclass(frozen=True)
class Peer:
    """A peer tool: its name in results, its label in tables, its pool, what it imports."""

    name: str
    label: str
    pool: type[PeerPool]
    requires: tuple[str, ...] = ()


#: the peers ``prep bench --peers`` races, by name
PEERS: dict[str, Peer] = {
    p.name: p
    for p in [
        Peer("mp_pool", "multiprocessing.Pool.starmap", MpPool),
        Peer("dataloader", "DataLoader (persistent workers)", DataLoaderPeer),
    ]
}


@contextlib.contextmanager
def session() -> Iterator[None]:
    """multiprocessing's forkserver for a run's peers: up before the first call, torch
    preloaded; stopped, and its preload list restored, at the end if this started it.

    So a peer's first call measures its pool's start-up, not torch's import.
    multiprocessing has no public way to ask whether its forkserver runs or to
    stop it: ``_forkserver_pid``, ``_preload_modules`` and ``_stop`` are those
    of CPython's ``ForkServer``, the one every forkserver context shares.
    """
    server: Any = mp_forkserver._forkserver
    if server._forkserver_pid is not None:
        yield  # the caller's own: leave it as it is
        return
    saved = list(server._preload_modules)
    server.set_forkserver_preload([*saved, "torch"])
    try:
        server.ensure_running()
        # it imports torch after it returns: one process through it waits for that here,
        # so no peer's first call pays it
        child = forkserver().Process(target=int)
        child.start()
        child.join()
        yield
    finally:
        server._stop()
        server.set_forkserver_preload(saved)
