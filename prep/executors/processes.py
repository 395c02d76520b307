"""Persistent worker processes that write rows straight into shared memory.

    parent                                           worker k (forked by prep's forkserver)
    ──────                                           ──────────────────────────────────────
    fn, cloudpickled (once per change) ───── "fn" ──▶ loads it ── "loaded" / "error" ─▶ parent
    batch columns ─copy once─▶ shared arena ┐
    output buffers (shared) ────────────────┴─"batch" (fds, once)──▶ maps the same pages
    row ranges (a few per worker) ───────── "run" (start, stop) ──▶ fn(row i) ─▶ out[i].copy_()
    wait(conns + process sentinels, deadline) ◀── "done" / "error" ──┘

Only indices and short messages cross the pipes; the tensors are shared by
file descriptor (torch's ``file_descriptor`` strategy: the /dev/shm entry is
unlinked at once, so a crash cannot leak it). Input buffers are reused across
batches of the same shapes, so a warm pool does not even re-send them.

Failures become errors, never hangs: a dead worker is seen through its
sentinel (:class:`~prep.WorkerCrashed`), a deadline through ``wait``'s timeout
(:class:`~prep.BatchTimeout`), Ctrl-C in the parent (workers ignore SIGINT).
After any of these the pool kills its workers and starts fresh ones on the next
call; a row that raises only costs the batch (:class:`~prep.RowError`).
Workers are forked from prep's own forkserver (``_spawn``), which preloads
torch, so they start in milliseconds, never inherit a CUDA context and never
import or run the user's main script; each exits by itself when the parent
disappears. The row function travels with cloudpickle: by name when the
workers can import it, by value when they cannot (``__main__`` of a script,
a notebook, ``python -c`` or stdin; lambdas, closures, local functions).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

import torch

from .._output import Output
from .._rows import TensorRows
from ..errors import (
    BatchTimeout,
    ConfigError,
    FunctionLoadError,
    StackError,
    WorkerCrashed,
)
from . import _spawn, _worker
from ._arena import Arena
from ._base import Executor, Job, copy_rows, threads_per_worker
from ._dispatch import Dispatch
from ._handles import LOAD_TIMEOUT, Worker, load_everywhere
from ._transport import check_shm, pickle_fn, shm_fits, shm_free

__all__ = ["LOAD_TIMEOUT", "ProcessExecutor", "pickle_fn", "shm_fits", "shm_free"]

#: (function, layout) pairs whose output shape a pool remembers
SHAPES = 16


class Shapes:
    """The output shape of each (function, row layout) a pool ran last: a batch's
    output is allocated before any row runs, sparing the round trip that runs row 0
    alone to learn it."""

    def __init__(self) -> None:
        self._last: dict[Any, Output] = {}  # key -> a 0-row output shaped like its last

    def guess(self, job: Job, key: Any) -> bool:
        """Allocate ``job``'s output as last batch's of ``key`` was; False if none is known."""
        like = self._last.get(key)
        if like is None:
            return False
        row_bytes = sum(math.prod(b.shape[1:]) * b.element_size()
                        for b in like.buffers)  # fmt: skip
        check_shm(len(job.rows) * row_bytes, "the output")
        job.sink.output = like.like(len(job.rows), shared=True)
        return True

    def keep(self, key: Any, out: Output) -> None:
        self._last[key] = out.like(0)
        while len(self._last) > SHAPES:
            del self._last[next(iter(self._last))]


class ProcessExecutor(Executor):
    name = "processes"
    needs_processes = True

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        self._workers: list[Worker] = []
        self._arena = Arena()
        self._lock = threading.Lock()  # one batch at a time: the pipes carry one conversation
        self._dispatch: float | None = None
        self._shapes = Shapes()

    # -------------------------------------------------------------- lifecycle

    def _ensure_started(self) -> None:
        if any(not w.proc.is_alive() for w in self._workers):
            self._reset()  # one died while idle (killed, OOM): start all afresh
        if len(self._workers) < self.workers:
            _spawn.ensure_server()  # measures the server's start and a worker's, once
            ctx = _spawn.context()
            threads = threads_per_worker(self.workers)
            while len(self._workers) < self.workers:
                self._workers.append(Worker(ctx, threads))

    @property
    def started(self) -> bool:
        """Whether the workers are up (started, not necessarily ready)."""
        return len(self._workers) == self.workers and all(w.proc.is_alive() for w in self._workers)

    def start_cost(self) -> float | None:
        """Seconds starting this pool would take now, from what was measured here:
        0 when it runs, the workers' start when prep's forkserver is up, None when
        the server has not been measured yet (see :func:`_spawn.warm_up`)."""
        if self.started:
            return 0.0
        costs = _spawn.start_costs()
        if not _spawn.server_running() or costs.worker is None:
            return None
        return costs.worker * self.workers

    def warm_up(self) -> bool:
        return _spawn.warm_up()

    def warm_up_cost(self) -> float | None:
        return _spawn.start_costs().server

    def start_failure(self) -> str | None:
        return _spawn.start_costs().failed

    def unsuitable(self, job: Job, nbytes: int) -> str | None:
        if job.rows.device.type != "cpu":
            return "the batch is on a GPU"
        try:
            pickle_fn(job.fn)
        except ConfigError:
            return "the function cannot be pickled"
        if not shm_fits(nbytes):
            return (
                f"the batch and its result need {nbytes / 2**20:.0f} MB of shared memory, "
                f"/dev/shm has {(shm_free() or 0) / 2**20:.0f} MB free"
            )
        return None

    def worker_threads(self) -> int | None:
        return threads_per_worker(self.workers)

    def prepare(self, fn: Any, timeout: float | None = None) -> float:
        """Start the workers if needed and have every one load ``fn``; the seconds that
        took. Raises :class:`~prep.errors.FunctionLoadError` if a worker cannot load
        it, :class:`~prep.errors.ExecutorUnavailable` if the workers cannot start."""
        blob = pickle_fn(fn)
        with self._lock:
            t = time.perf_counter()
            self._load(fn, blob, timeout)
            return time.perf_counter() - t

    def dispatch_cost(self) -> float:
        """Seconds a warm batch costs this pool beyond its rows (measured once, on a
        no-op row function; the faster of two tries, as the first may wait for
        workers still starting)."""
        if self._dispatch is None:
            probe = TensorRows((torch.zeros(self.workers * 2, 1),))
            best = math.inf
            for _ in range(2):
                t = time.perf_counter()
                self.run(Job.new(_worker.identity, probe))
                best = min(best, time.perf_counter() - t)
            self._dispatch = best
        return self._dispatch

    def _reset(self) -> None:
        """Kill every worker; the next call starts fresh ones."""
        workers, self._workers = self._workers, []
        self._arena.clear()
        self._dispatch = None
        for w in workers:
            w.stop()

    def close(self) -> None:
        # a batch running in another thread owns the pipes (prep run closes its pools on
        # Ctrl-C): then the workers are terminated without a word, and that batch fails
        polite = self._lock.acquire(timeout=1.0)
        try:
            if polite:
                for w in self._workers:  # ask first; _reset terminates whoever does not listen
                    with contextlib.suppress(OSError):
                        w.conn.send(("close",))
                for w in self._workers:
                    w.proc.join(2)
            self._reset()
        finally:
            if polite:
                self._lock.release()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty until the first batch)."""
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    # -------------------------------------------------------------- the function

    def _load(self, fn: Any, blob: bytes, timeout: float | None) -> None:
        self._ensure_started()
        try:
            load_everywhere(self._workers, fn, blob, timeout, stuck=self._reset)
        except FunctionLoadError:
            if any(not w.proc.is_alive() for w in self._workers):
                self._reset()
            raise

    def _replace(self, dead: Worker, fn: Any) -> Worker:
        """A new worker in a dead one's slot, holding the function it held."""
        dead.stop()
        fresh = Worker(_spawn.context(), threads_per_worker(self.workers))
        self._workers[self._workers.index(dead)] = fresh
        if dead.fn_blob is not None:
            load_everywhere([fresh], fn, dead.fn_blob, LOAD_TIMEOUT, stuck=self._reset)
        return fresh

    # -------------------------------------------------------------- one batch

    def run(self, job: Job) -> Output | None:
        with self._lock:
            return self._run(job)

    def _run(self, job: Job) -> Output | None:
        n = len(job.rows)
        if n == 0:
            return job.sink.output
        blob = pickle_fn(job.fn)
        self._load(job.fn, blob, job.remaining())
        shell, keys, columns = self._arena.share(job.rows)
        given = job.sink.output
        in_place = job.policy.plain  # else chunks come back, merged here (_dispatch)
        if (
            in_place
            and given is not None
            and not all(b.is_shared() and b.is_contiguous() for b in given.buffers)
        ):
            check_shm(given.nbytes, "the output")
            job.sink.output = given.like(shared=True)  # staging; copied into out= at the end
        shape_key = (blob, job.rows.layout())
        guessed = in_place and given is None and self._shapes.guess(job, shape_key)
        try:
            replace = lambda dead: self._replace(dead, job.fn)  # noqa: E731
            try:
                Dispatch(self._workers, job, replace).run(shell, keys, columns)
            except Exception as exc:
                if not guessed or not isinstance(exc, StackError):
                    raise
                # a result unlike last batch's: run the batch as the first one ran, so
                # that row 0 fixes the output and the error names what serial names
                job.sink.output = None
                Dispatch(self._workers, job, replace).run(shell, keys, columns)
        except BaseException as exc:
            # crashed, timed out or interrupted with rows in flight: the workers' state is
            # unknown, so start afresh. A row error waited for the others: keep the pool.
            if isinstance(exc, (WorkerCrashed, BatchTimeout, OSError)) or any(
                w.held for w in self._workers
            ):
                self._reset()
            if given is not None:
                job.sink.output = given
            raise
        out = job.sink.output
        if out is None:
            return None  # every row failed (on_error='fill'/'skip'): none gave a shape
        if in_place and given is None:
            self._shapes.keep(shape_key, out)
        if given is not None and out is not given:  # rows before start were written in place
            job.sink.output = copy_rows(given, out, job.start)
        return job.sink.output
