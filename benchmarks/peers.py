"""The tools people reach for instead of prep, timed beside it (``python -m benchmarks --peers``).

Each *peer* runs the group's row function over the group's batch the way its
documentation recommends, its pool made once and reused (warm), and builds
the output as a user would (results collected, then ``torch.stack``):

=====================  ======================================================
mp_pool                ``multiprocessing.Pool.starmap(fn, rows, chunksize)``
cf_processes           ``concurrent.futures.ProcessPoolExecutor.map(..., chunksize)``
cf_threads             ``concurrent.futures.ThreadPoolExecutor.map``
joblib_loky            ``joblib.Parallel(backend="loky", batch_size="auto")``
mpire                  ``mpire.WorkerPool(keep_alive=True).map(..., chunk_size)``
torchdata_threads      ``torchdata.nodes.ParallelMapper(method="thread")``
torchdata_processes    ``torchdata.nodes.ParallelMapper(method="process")``
dataloader             ``torch.utils.data.DataLoader`` with persistent workers
=====================  ======================================================

Every one that takes a start method gets forkserver (fork would copy a parent
whose threads may hold locks; spawn re-imports torch in every worker).
multiprocessing's forkserver is shared by all of them: :func:`session` (from
:mod:`prep.bench.peers`) starts it before the first group with torch preloaded,
as prep's own forkserver does (``set_forkserver_preload``, multiprocessing's
documented speed-up), so a first call measures the pool's start-up, not torch's
import; it is stopped at the end if the session started it. Chunks are
``rows / (4 x workers)`` rows, what ``Pool.map`` picks by default. How each
one's rows travel is in :mod:`prep.bench.peers` (``prep bench --peers``' own
two), :mod:`benchmarks.peer_pools` and :mod:`benchmarks.peer_loaders`.

A peer whose package does not import here is skipped, with the reason; one
that fails on a workload (it cannot pickle a lambda, say) is a failed cell.

>>> from benchmarks.peers import PEERS, available
>>> ok, skipped = available(list(PEERS))
>>> sorted([*ok, *skipped]) == sorted(PEERS)
True
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from prep.bench.peers import PEERS as BENCH_PEERS
from prep.bench.peers import Peer, PeerRows, session

from .libraries import is_samples, missing
from .peer_loaders import TorchdataPeer, TorchdataProcesses
from .peer_pools import CfProcesses, CfThreads, JoblibLoky, Mpire
from .workloads import Workload

__all__ = ["FIRST", "NOTES", "PEERS", "Peer", "PeerGroup", "available", "first_call", "session"]

#: a peer's first call on a fresh pool is the cell named ``<peer><FIRST>``
FIRST = "_first"

#: every peer: ``prep bench --peers``' two (the Pool first, the DataLoader last) and the rest
PEERS: dict[str, Peer] = {
    p.name: p
    for p in [
        BENCH_PEERS["mp_pool"],
        Peer("cf_processes", "ProcessPoolExecutor.map", CfProcesses),
        Peer("cf_threads", "ThreadPoolExecutor.map", CfThreads),
        Peer("joblib_loky", "joblib.Parallel (loky, batch_size=auto)", JoblibLoky, ("joblib",)),
        Peer("mpire", "mpire.WorkerPool", Mpire, ("mpire",)),
        Peer(
            "torchdata_threads",
            "torchdata ParallelMapper (thread)",
            TorchdataPeer,
            ("torchdata.nodes",),
        ),
        Peer(
            "torchdata_processes",
            "torchdata ParallelMapper (process)",
            TorchdataProcesses,
            ("torchdata.nodes",),
        ),
        BENCH_PEERS["dataloader"],
    ]
}

NOTES = [
    "- Peers (`--peers`) are the tools people use instead of prep, each used as its "
    "documentation recommends: its pool made once per group and reused (warm), rows in "
    "chunks of rows / (4 x workers), the results collected and then `torch.stack`ed. "
    "`<peer> (first call)` is a fresh pool's first call, its start-up included, timed "
    "alone; it does not compete. Every peer that takes a start method uses forkserver, "
    "with torch preloaded in the server as in prep's own.",
    "- Tensors reach multiprocessing-based workers (multiprocessing, concurrent.futures, "
    "mpire, torchdata, DataLoader) through torch's shared-memory reductions: each call "
    "copies the batch into shared memory once and sends the rows as views of it; every "
    "row result comes back in a shared-memory file of its own (the DataLoader's workers "
    "stack a chunk first). joblib's loky pickles tensors by value, so each row is copied "
    "and shipped once. Process workers get torch.set_num_threads(cores // workers); "
    "torchdata and DataLoader workers set 1 themselves.",
    "- To stay warm between batches: joblib keeps its workers inside `with Parallel(...)` "
    "(they are joblib's one reusable loky executor, shut down after each group, so each "
    "group's first call starts them); torchdata's ParallelMapper starts new workers on "
    "every reset(), so the warm one reads an endless feed that each call puts its chunks "
    "into; the DataLoader's persistent workers get their data set once, so it holds the "
    "rows as views of shared memory that each call copies its batch into (a list of "
    "text samples cannot be refilled: its warm calls read the samples the workers got "
    "at start).",
]


def first_call(name: str) -> str:
    """The name of ``name``'s first-call cell."""
    return name + FIRST


def available(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The peers of ``names`` whose packages import here, and why each other one cannot run."""
    ok: list[str] = []
    skipped: dict[str, str] = {}
    for name in names:
        reason = missing(PEERS[name].requires)
        if reason:
            skipped[name] = f"skipped: {reason} (pip install 'prep[peers]')"
        else:
            ok.append(name)
    return ok, skipped


class PeerGroup:
    """The peers of one group, each on a fresh pool of its own, all closed on exit.

    >>> import torch
    >>> from benchmarks.workloads import noop, WORKLOADS
    >>> with PeerGroup(["cf_threads"], WORKLOADS["noop"], torch.ones(4, 2), workers=2) as g:
    ...     g.calls()["cf_threads"]().shape
    torch.Size([4, 2])
    """

    def __init__(self, names: Sequence[str], workload: Workload, batch: Any, workers: int):
        ok, self.skipped = available(names)
        rows = PeerRows(workload.fn, is_samples(workload), isinstance(batch, dict))
        self._pools = {name: PEERS[name].pool(rows, workers) for name in ok}
        self._batch = batch

    def calls(self) -> dict[str, Callable[[], Any]]:
        """A zero-argument call per peer that runs here; the first one starts its pool."""
        return {
            name: functools.partial(pool.run, self._batch) for name, pool in self._pools.items()
        }

    def close(self) -> None:
        """Close every pool, even if one of them fails to (the first error is raised after)."""
        with contextlib.ExitStack() as stack:
            for pool in self._pools.values():
                stack.callback(pool.close)

    def __enter__(self) -> PeerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
