"""How ``prep run`` runs its shards on one machine: whole shards on worker processes, or
one shard at a time with its rows spread out; decided per run, from measurement.

    shards: a worker process takes a whole shard: loads it, runs its rows (serially,
            on its share of the cores), saves it. W workers, several shards in flight,
            no barrier and no tensor between processes: the DataLoader's shape.
    rows:   this process takes one shard at a time and spreads its rows over the row
            executor (--executor); the next shard loads while this one computes.

The decision is :func:`decide`'s, from a :class:`ShardFigures` alone (the tests give it
figures of their own): the time each way would take for the shards still to do,
counting each start-up once for the run. Whole shards win whenever there are
enough of them to keep every worker busy, since each worker then runs rows as
the plain loop does, with no dispatch and no lock between them; rows win when
there are too few shards for the workers (one shard, or three on two workers
where torch's own threads already use both cores), or when worker processes
cannot be had (a CUDA device, inside a daemon process).

:func:`measure` takes the figures on the first shard, in this process: its load,
and a few of its rows with one worker's share of torch's threads and with all
of them (the rows' first calls are not counted: they pay one-time loads).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..executors import available_cores, threads_per_worker

__all__ = ["PARALLEL", "ROW_POOL_EFFICIENCY", "ShardFigures", "ShardPlan", "decide", "measure"]

#: what ``--parallel`` accepts
PARALLEL = ("auto", "shards", "rows")
#: the share of W cores a row-level process pool turns into speed on one shard (its
#: dispatch, the rows' transport and the merge cost the rest; bench_core measures it)
ROW_POOL_EFFICIENCY = 0.8
#: seconds of rows measured at most per thread setting
_BUDGET = 0.05
_WARM_ROWS = 2


@dataclass(frozen=True)
class ShardFigures:
    """What :func:`decide` weighs: the run's size, and seconds measured here."""

    shards: int  # shards still to do
    rows: int  # rows in a shard (the first one's)
    workers: int  # worker processes for whole shards
    one_thread_row: float  # a row on one worker's share of the threads
    all_threads_row: float  # a row with this process's threads (all cores)
    load: float  # loading a shard (saving one is counted the same)
    shard_start: float = 0.0  # starting the shard workers (0: they are up)
    pool_start: float = 0.0  # starting a row-level process pool (0: it is up)


@dataclass(frozen=True)
class ShardPlan:
    """Whole shards on workers (``"shards"``) or rows spread out (``"rows"``), and why."""

    mode: str
    workers: int
    threads: int  # torch's intra-op threads in each worker process
    predicted: dict[str, float]  # seconds for the run's shards, each way
    reason: str

    def sentence(self) -> str:
        """One sentence: what the run does, and why."""
        return f"{self.mode}: {self.reason}"


def decide(f: ShardFigures, cores: int | None = None) -> ShardPlan:
    """Whole shards or rows, whichever is predicted to finish the run first."""
    threads = max(1, (cores or available_cores()) // f.workers)
    io = 2 * f.load  # a shard's load and its save
    rounds = math.ceil(f.shards / f.workers)
    shards = f.shard_start + rounds * (f.rows * f.one_thread_row + io)
    here = f.shards * max(f.rows * f.all_threads_row, io)  # the next shard loads meanwhile
    pooled = f.rows * f.one_thread_row / (f.workers * ROW_POOL_EFFICIENCY)
    pool = f.pool_start + f.shards * max(pooled, io)
    rows = min(here, pool)
    predicted = {"shards": shards, "rows": rows}
    if f.workers > 1 and shards < rows:
        reason = (
            f"{f.shards} shard(s) on {f.workers} worker processes, a whole shard each, "
            f"{threads} thread(s) each, are predicted to take {shards:.2f} s against "
            f"{rows:.2f} s one shard at a time with its rows spread out"
        )
        return ShardPlan("shards", f.workers, threads, predicted, reason)
    if f.workers <= 1:
        why = "one worker process would run a shard no faster than this process"
    elif f.shards < f.workers:
        why = f"{f.shards} shard(s) cannot keep {f.workers} worker processes busy"
    else:
        why = "torch's own threads (or a row pool) run a shard's rows as fast"
    reason = (
        f"{f.shards} shard(s) one at a time, rows spread out, are predicted to take "
        f"{rows:.2f} s against {shards:.2f} s a whole shard per worker: {why}"
    )
    return ShardPlan("rows", f.workers, threads, predicted, reason)


def measure(
    fn: Callable[..., Any], call: Callable[[Callable[..., Any], int], Any], rows: int, workers: int
) -> tuple[float, float]:
    """Seconds a row takes on one worker's share of torch's threads, and with all of
    them: ``call(fn, i)`` runs row ``i``. A few rows each, the first ones not counted.
    torch's thread count is put back as it was."""
    before = torch.get_num_threads()
    try:
        one = _per_row(fn, call, rows, threads_per_worker(workers), 0)
        every = _per_row(fn, call, rows, before, 1)
    finally:
        torch.set_num_threads(before)
    return one, every


def _per_row(
    fn: Callable[..., Any], call: Callable[[Callable[..., Any], int], Any], rows: int,
    threads: int, phase: int,
) -> float:  # fmt: skip
    torch.set_num_threads(threads)
    i = phase * _WARM_ROWS
    for _ in range(_WARM_ROWS):  # one-time loads, a cold thread pool
        call(fn, i % rows)
        i += 1
    start, n = time.perf_counter(), 0
    while n < rows and (n < 3 or time.perf_counter() - start < _BUDGET):
        call(fn, i % rows)
        i, n = i + 1, n + 1
    return (time.perf_counter() - start) / n
