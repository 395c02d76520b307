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
the plain loop does, with no dispatch and no lock between them (so rows must be
predicted ``ROWS_MARGIN`` faster to be chosen); rows win when
there are too few shards for the workers (one shard, or three on two workers
where torch's own threads already use both cores), or when worker processes
cannot be had (a CUDA device, inside a daemon process).

:func:`measure` takes the figures on the first shard, in this process: its load,
and a few of its rows with one worker's share of torch's threads and with all
of them (the rows' first calls are not counted: they pay one-time loads), with
serial, the function's batched twin and vmap; a whole-shard worker runs the
fastest form whose values equal serial's.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._choose import choose
from ..core.trust import same
from ..executors import available_cores, threads_per_worker

__all__ = [
    "PARALLEL",
    "ROWS_MARGIN",
    "ROW_POOL_EFFICIENCY",
    "Forms",
    "ShardFigures",
    "ShardPlan",
    "decide",
    "shards_per_call",
    "measure",
]

#: what ``--parallel`` accepts
PARALLEL = ("auto", "shards", "rows")
#: rows spread out must be predicted this much faster than whole shards to be chosen: a
#: shard's rows in this process pay what whole shards do not (auto's calibration and
#: trials, the row executor's dispatch, a load that overlaps the compute only in part)
ROWS_MARGIN = 1.2
#: the share of W cores a row-level process pool turns into speed on one shard (its
#: dispatch, the rows' transport and the merge cost the rest; bench_core measures it)
ROW_POOL_EFFICIENCY = 0.8
#: a whole-shard worker is sent shards that many at once whose work is predicted to
#: take about this long: a small shard's round trip (its task sent, its entry back, the
#: driver's wake) is paid once for the call, not once a shard
CALL_SECONDS = 0.02
#: ... but never so many that a worker has fewer than this many calls to take in turn,
#: so that the workers still finish together
CALLS_PER_WORKER = 4
#: seconds of serial rows measured per thread setting (about)
_BUDGET = 0.03
_WARM_ROWS = 2
#: a batched form this many times slower than serial on its first rows is dropped there
_SLOWER = 2.0


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
    pool_start: float = 0.0  # starting a row-level process pool (0: it is up; inf: none)
    form: str = "serial"  # what the shard workers run each shard's rows with


@dataclass(frozen=True)
class ShardPlan:
    """Whole shards on workers (``"shards"``) or rows spread out (``"rows"``), and why."""

    mode: str
    workers: int
    threads: int  # torch's intra-op threads in each worker process
    form: str  # the executor a whole-shard worker runs its rows with
    predicted: dict[str, float]  # seconds for the run's shards, each way
    reason: str
    details: tuple[str, ...] = ()  # what was measured, for --explain
    per_call: int = 1  # shards sent to a worker at once

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
    if f.workers > 1 and f.shards > 1 and choose(predicted, "shards", ROWS_MARGIN).name == "shards":
        per_call = shards_per_call(f.rows * f.one_thread_row + io, f.shards, f.workers)
        sent = f", {per_call} a call" if per_call > 1 else ""
        reason = (
            f"{f.shards} shard(s) on {f.workers} worker processes, a whole shard each{sent}, "
            f"rows {f.form}, {threads} thread(s) each, are predicted to take {shards:.2f} s "
            f"against {rows:.2f} s one shard at a time with its rows spread out"
        )
        return ShardPlan("shards", f.workers, threads, f.form, predicted, reason, (), per_call)
    if f.workers <= 1:
        why = "one worker process would run a shard no faster than this process"
    elif f.shards <= 1 or f.shards < f.workers:
        why = f"{f.shards} shard(s) cannot keep {f.workers} worker processes busy"
    else:
        why = "torch's own threads (or a row pool) run a shard's rows as fast"
    reason = (
        f"{f.shards} shard(s) one at a time, rows spread out, are predicted to take "
        f"{rows:.2f} s against {shards:.2f} s a whole shard per worker: {why}"
    )
    return ShardPlan("rows", f.workers, threads, f.form, predicted, reason)


def shards_per_call(seconds: float, shards: int, workers: int) -> int:
    """How many shards of ``seconds`` each a worker is sent at once (:data:`CALL_SECONDS`,
    :data:`CALLS_PER_WORKER`); 1 for a shard that takes a call's time on its own."""
    fits = math.ceil(CALL_SECONDS / max(seconds, 1e-9))
    return max(1, min(fits, shards // (CALLS_PER_WORKER * workers)))


@dataclass
class Forms:
    """Seconds a row took with each in-process form of the function (serial, its batched
    twin, vmap) on one worker's share of torch's threads and with all of them; the forms
    that could not run, or gave other values than serial, with the reason."""

    one: dict[str, float]
    every: dict[str, float]
    dropped: dict[str, str]

    def best_one(self) -> str:
        """The form a worker process with one worker's threads runs fastest."""
        return min(self.one, key=self.one.__getitem__)

    def lines(self, threads: int) -> tuple[str, ...]:
        """What was measured, a line a form, for ``--explain``."""
        found = [
            f"  {name}: {self.one[name] * 1e6:,.1f} us/row on {threads} thread(s), "
            f"{self.every[name] * 1e6:,.1f} us/row on {torch.get_num_threads()}"
            for name in self.one
        ]
        found += [f"  {name}: not used ({why})" for name, why in self.dropped.items()]
        return ("measured on the first shard:", *found)


def measure(
    run: Callable[[str, int], Any], rows: int, workers: int, names: tuple[str, ...]
) -> Forms:
    """How long each form in ``names`` takes a row: ``run(name, k)`` computes the first
    ``k`` rows with executor ``name`` and returns the result. Serial first, and as many
    rows as fit ``_BUDGET`` seconds (a warm-up call first: one-time loads, a cold
    thread pool); every other form on the same rows, kept only where its values equal
    serial's (:func:`prep.core.trust.same`). torch's thread count is put back as it was."""
    before = torch.get_num_threads()
    one_thread = threads_per_worker(workers)
    forms = Forms({}, {}, {})
    # rows that fail under on_error fill/skip are the run's to report, not these
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            torch.set_num_threads(one_thread)
            run("serial", min(rows, _WARM_ROWS))
            t = time.perf_counter()
            run("serial", min(rows, _WARM_ROWS))
            guess = (time.perf_counter() - t) / min(rows, _WARM_ROWS)
            k = max(min(rows, 3), min(rows, int(_BUDGET / max(guess, 1e-7))))
            reference = None
            for name in names:
                try:
                    if name != "serial" and _slower(run, name, rows, k, one_thread, forms):
                        continue
                    for threads, table in ((one_thread, forms.one), (before, forms.every)):
                        torch.set_num_threads(threads)
                        run(name, min(rows, _WARM_ROWS))  # warm at this setting: a cold pool
                        t = time.perf_counter()
                        result = run(name, k)
                        table[name] = (time.perf_counter() - t) / k
                except Exception as exc:  # this form cannot run on these rows
                    forms.one.pop(name, None)
                    forms.every.pop(name, None)
                    forms.dropped[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
                    continue
                if reference is None:
                    reference = result
                elif not same(result, reference):
                    forms.one.pop(name)
                    forms.every.pop(name)
                    forms.dropped[name] = "its values differ from serial's on the measured rows"
        finally:
            torch.set_num_threads(before)
    return forms


def _slower(
    run: Callable[[str, int], Any], name: str, rows: int, k: int, threads: int, forms: Forms
) -> bool:
    """Whether form ``name`` takes longer on a couple of rows than ``_SLOWER`` times what
    serial takes on all ``k`` measured rows: a batched call costs at least as much on
    more rows, so it is dropped without being timed on them (vmap of a heavy row can
    cost several times the row, and the measuring is the run's time). Judged on the
    whole call, not per row: a batched form's fixed cost per call is spread over many
    rows in a shard. Raises what the form raises."""
    torch.set_num_threads(threads)
    n = min(rows, _WARM_ROWS)
    run(name, n)  # its first call: tracing, a cold thread pool
    t = time.perf_counter()
    run(name, n)
    took = time.perf_counter() - t
    if took <= _SLOWER * forms.one["serial"] * k:
        return False
    forms.dropped[name] = (
        f"{took * 1e3:,.1f} ms on {n} rows, over {_SLOWER:g}x serial's on {k}: not measured further"
    )
    return True
