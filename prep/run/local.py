"""Shards on this machine: whole shards on worker processes, or one shard at a time with
its rows spread out (:mod:`prep.run.plan` says which, and why).

    ShardBackend (whole shards)                    worker k (forked from this process)
    ───────────────────────────                    ───────────────────────────────────
    submit: a Call unit ─────────────────────────▶ run_shards_on_worker(tasks):
            (per_call tasks: paths, the recipe)     each: load ─▶ rows (serial) ─▶ save
    collector thread: wait_any ◀──────────────────── each one's manifest entry or error
            ─▶ the driver's done queue, a shard at a time

    Small shards go several a call (:func:`prep.run.plan.shards_per_call`), so that
    their round trips are one a call; a call whose worker died is sent again one shard
    a call (:class:`~prep.run.driver.Alone`), so that only the shard that kills a worker
    fails.

    RowBackend (rows spread out): ``jobs`` threads of this process; a shard's load and
    save overlap another's compute, but only one shard computes at a time (a lock), so
    no two shards' rows fight over the GIL or torch's threads; one :class:`prep.Pool`.

The shard workers are forked from this process while it has no other thread, so they
start in milliseconds holding what it imported (the row function, its modules): no
second ``import torch``, and nothing the function sees differs from what this process
sees. Where forking is not safe (other threads run, CUDA is up) they come from prep's
forkserver, started in the background while the first shard is measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import queue
import threading
import time
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from ..core.rows import rows_of
from ..errors import ConfigError
from ..executors import (
    Call,
    Failure,
    ProcessBatches,
    Ticket,
    available_cores,
    call_error,
    fork_is_safe,
    in_worker_process,
    server_running,
    start_costs,
    threads_per_worker,
    traits_of,
    wait_any,
    warm_up,
)
from ..pool import SHARED, Pool
from ..registry import AUTO
from .config import RunConfig
from .driver import Alone
from .plan import Forms, ShardFigures, ShardPlan, decide, measure
from .shards import load_shard
from .task import (
    IN_WORKER,
    ShardTask,
    each,
    halt_workers,
    run_shard,
    run_shards_on_worker,
    shard_batch,
    slice_rows,
    worker_form,
)
from .temps import Temps

__all__ = [
    "LOCAL_JOBS",
    "RowBackend",
    "ShardBackend",
    "check_parallel",
    "local_backend",
    "plan_run",
]

#: shards in flight one at a time with rows spread out: two, so that one shard's reading,
#: writing and fsync overlap the other's compute
LOCAL_JOBS = 2
#: seconds prep's forkserver is taken to need to start when it has not been measured
_SERVER_GUESS = 2.0
#: a shard of at most this many bytes is read twice to time its load
_SMALL_FILE = 1 << 20


class RowBackend:
    """``jobs`` shards at once in daemon threads; their rows one shard at a time."""

    def __init__(self, config: RunConfig, jobs: int) -> None:
        self.slots, self.per_call = jobs, 1
        self._pool = Pool(config.executor, config.workers, config.device, setup=config.setup_fn())
        self._compute = threading.Lock()
        self._cancel = threading.Event()
        self._temps = Temps()
        self._threads: list[threading.Thread] = []

    def submit(self, tasks: list[ShardTask], done: queue.SimpleQueue[Any]) -> None:
        (task,) = tasks  # one a call (per_call)

        def work() -> None:
            try:
                outcome: Any = run_shard(task, self._pool, self._cancel, self._temps, self._compute)
            except BaseException as exc:  # reported by the driver, never lost in a thread
                outcome = exc
            done.put((task, outcome))

        # daemon: a thread stuck in a long row loop must not keep an interrupted run alive
        t = threading.Thread(target=work, name=f"prep-shard:{task.source.rel}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def abandon(self, grace: float = 5.0) -> None:
        """Stop at the next step; remove temporary files; stop process workers mid-row."""
        self._cancel.set()
        self._temps.abandon()  # from here on no temp file is created or renamed into place
        self._pool.close()
        deadline = time.monotonic() + grace
        for t in self._threads:
            # a Ctrl-C inside start() can leave one not started: nothing to wait for
            with contextlib.suppress(RuntimeError):
                t.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        for t in self._threads:
            t.join()
        self._pool.close()


class ShardBackend:
    """Whole shards on the worker processes of ``pool``, ``jobs`` in flight, sent
    ``per_call`` at once."""

    def __init__(
        self, pool: ProcessBatches, jobs: int, form: str = "serial", per_call: int = 1
    ) -> None:
        self.slots, self.per_call = jobs, per_call
        halt_workers(False)  # a new run: its workers start every shard they are sent
        self._pool = pool
        self._form = form  # the executor each worker runs a shard's rows with
        self._key = pool.prepare(run_shards_on_worker).key
        self._lock = threading.Lock()
        self._flying: dict[Ticket, tuple[list[ShardTask], queue.SimpleQueue[Any]]] = {}
        self._stop = threading.Event()
        self._work = threading.Event()  # set while shards are in flight
        self._collector: threading.Thread | None = None

    def submit(self, tasks: list[ShardTask], done: queue.SimpleQueue[Any]) -> None:
        config = dataclasses.replace(tasks[0].config, executor=self._form)
        sent = [dataclasses.replace(t, config=config) for t in tasks]
        what = f"the shard {tasks[0].source.path}" + (
            f" and {len(tasks) - 1} more" if len(tasks) > 1 else ""
        )
        ticket = self._pool.submit(Call(self._key, (sent,), what))
        with self._lock:
            self._flying[ticket] = (tasks, done)
            self._work.set()
        if self._collector is None:  # started after the workers were forked, never before
            self._collector = threading.Thread(
                target=self._collect, name="prep-shard-collector", daemon=True
            )
            self._collector.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._flying:
                    self._work.clear()
            if not self._work.wait(0.1):  # nothing in flight: no reply to wait for
                continue
            with self._lock:
                flying = list(self._flying)
            wait_any(flying, 0.1)
            with self._lock:
                pairs = [(t, self._flying.pop(t)) for t in list(self._flying) if t.done()]
            for ticket, (tasks, done) in pairs:
                for task, outcome in zip(tasks, _outcomes(ticket, len(tasks))):
                    done.put((task, outcome))

    def abandon(self) -> None:
        """Terminate the workers mid-shard; their temporary files are the driver's to
        remove (their writers are gone)."""
        self._stop.set()
        self._work.set()  # the collector wakes to see it
        self._pool.close(now=True)
        self._join()

    def close(self) -> None:
        self._stop.set()
        self._work.set()  # the collector wakes to see it, not at its next look
        self._join()
        self._pool.close()

    def _join(self) -> None:
        if self._collector is not None:
            with contextlib.suppress(RuntimeError):
                self._collector.join(5)


def _outcomes(ticket: Ticket, n: int) -> list[Any]:
    """Each of a call's ``n`` shards' entry or error; where the call failed as a whole
    (its worker died on one of them), the error for one shard alone, or :class:`Alone`
    for each of several: the driver sends them again one a call, so that only the shard
    that kills its worker fails."""
    try:  # a shard's error with the worker's traceback, for its manifest line
        return [call_error(o, whole=True) if isinstance(o, Failure) else o for o in ticket.result()]
    except BaseException as exc:
        return [exc] if n == 1 else [Alone(exc)] * n


def local_backend(
    config: RunConfig, todo: Sequence[ShardTask], jobs: int | None, parallel: str
) -> tuple[RowBackend | ShardBackend, ShardPlan]:
    """The backend for ``todo`` and the plan it follows (``parallel``: auto, shards, rows)."""
    workers = config.workers or available_cores()
    if parallel == "rows" or _rows_only(config, workers, len(todo), parallel) is not None:
        return RowBackend(config, jobs or LOCAL_JOBS), plan_run(config, todo, parallel)
    # the workers first, forked while this process has no other thread; the figures after
    safe = fork_is_safe()
    pool = ProcessBatches(workers, fork=True)  # forked now where that is safe
    start = 0.0
    if not safe:
        warm_up()  # the forkserver starts in the background while the first shard loads
        start = start_costs().server or _SERVER_GUESS
    plan = plan_run(config, todo, parallel, start)
    if plan.mode == "shards":
        per_call = plan.per_call if jobs is None else max(1, min(plan.per_call, jobs // workers))
        return ShardBackend(pool, jobs or 2 * workers * per_call, plan.form, per_call), plan
    pool.close()
    return RowBackend(config, jobs or LOCAL_JOBS), plan


def plan_run(
    config: RunConfig, todo: Sequence[ShardTask], parallel: str, start: float | None = None
) -> ShardPlan:
    """Whole shards or rows for ``todo``, and why (``start``: seconds the shard workers
    still need to start; by default, none if they can be forked now). Starts nothing."""
    workers = config.workers or available_cores()
    threads = threads_per_worker(workers)
    why = _rows_only(config, workers, len(todo), parallel)
    if parallel == "rows" or why is not None:
        reason = f"one shard at a time, its rows spread by --executor {config.executor} "
        reason += f"({why or '--parallel rows'})"
        return ShardPlan("rows", workers, threads, config.executor, {}, reason)
    if parallel == "shards":
        form = worker_form(config.executor)
        why = f"whole shards on {workers} worker processes, rows {form}, {threads} thread(s) each"
        return ShardPlan("shards", workers, threads, form, {}, f"{why} (--parallel shards)")
    if start is None:
        start = 0.0 if fork_is_safe() else (start_costs().server or _SERVER_GUESS)
    measured = first_shard_figures(todo[0], config, workers, len(todo), start)
    if measured is None:
        return ShardPlan(
            "shards",
            workers,
            threads,
            worker_form(config.executor),
            {},
            f"{len(todo)} shards on {workers} worker processes (the first shard could not be "
            f"measured: its own run reports why)",
        )
    figures, forms = measured
    return dataclasses.replace(decide(figures), details=forms.lines(threads))


def check_parallel(config: RunConfig, parallel: str) -> None:
    """A ConfigError if ``parallel="shards"`` cannot be had with ``config`` here."""
    if parallel != "shards":
        return
    why = _rows_only(config, config.workers or available_cores(), 2, parallel)
    if why is not None:
        raise ConfigError(
            f"--parallel shards cannot run here: {why}; pass --parallel rows (or auto)"
        )


def _rows_only(config: RunConfig, workers: int, shards: int, parallel: str) -> str | None:
    """Why shards cannot (or, under auto, need not) go whole to worker processes here."""
    if config.device is not None and config.device != "cpu":
        return f"--device {config.device}: worker processes never touch a GPU"
    if config.executor not in (*IN_WORKER, AUTO):
        return f"--executor {config.executor} spreads each shard's rows"
    if in_worker_process():
        return "this is a daemon process (a DataLoader worker), which cannot have children"
    if parallel == "auto" and workers <= 1:
        return "--workers 1: one worker process would run a shard no faster than this one"
    if parallel == "auto" and shards < 2:
        return f"{shards} shard cannot keep {workers} worker processes busy"
    return None


def first_shard_figures(
    task: ShardTask, config: RunConfig, workers: int, shards: int, shard_start: float
) -> tuple[ShardFigures, Forms] | None:
    """:class:`ShardFigures` from the first shard, read and computed on here (a few rows),
    with what each form measured; None if it cannot be (its own run will say why)."""
    try:
        load = math.inf
        for _ in range(1 if task.source.path.stat().st_size > _SMALL_FILE else 2):
            t = time.perf_counter()  # a small shard's first read pays one-time costs (the
            tensors = load_shard(task.source.path, trust_pickle=config.trust_pickle)
            load = min(load, time.perf_counter() - t)  # unpickler's), what its calls weigh
        batch, n = shard_batch(tensors, config.columns, task.source.path)
        if n == 0:
            return None
        fn = config.bound_fn()
        setup = config.setup_fn()
        if setup is not None:
            fn = functools.partial(fn, state=setup())
        # the rows' options, but only the output: a row failing under fill/skip is filled
        # or left out as in the run, and the forms are compared on what they computed
        options = config.row_options().with_(
            device=None, return_lengths=False, return_valid=False, return_errors=False
        )

        def run(executor: str, k: int) -> Any:
            return SHARED.pool(executor, 1).run(
                fn, rows_of(each(batch, itemgetter(slice(k)))), options
            )

        # under auto, the forms a worker may run that cost nothing to try (no compile)
        tried = tuple(n for n in IN_WORKER if not traits_of(n).compiles)
        names = tried if config.executor == AUTO else (config.executor,)
        forms = measure(run, min(n, max(3, slice_rows(batch, n))), workers, names)
    except Exception:
        return None
    if not forms.one:
        return None
    # the rows' alternative to whole shards on workers: a row-level process pool, where the
    # executor may be one (it starts prep's forkserver, unless it is up)
    server = 0.0 if server_running() else (start_costs().server or _SERVER_GUESS)
    form = forms.best_one()
    figures = ShardFigures(
        shards=shards,
        rows=n,
        workers=workers,
        one_thread_row=forms.one[form],
        all_threads_row=min(forms.every.values()),
        load=load,
        shard_start=shard_start,
        pool_start=server if config.executor == "auto" else math.inf,
        form=form,
    )
    return figures, forms
