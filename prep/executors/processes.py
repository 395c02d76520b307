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
import itertools
import math
import os
import signal
import threading
import time
from collections import deque
from multiprocessing import connection
from typing import Any

import torch

from .._structure import Output, SampleRows, TensorRows, flatten
from ..errors import (
    BatchTimeout,
    ConfigError,
    ExecutorUnavailable,
    FunctionLoadError,
    RemoteTraceback,
    WorkerCrashed,
)
from . import _spawn, _worker
from ._transport import check_shm, describe_fn, pickle_fn, shm_fits, shm_free

__all__ = ["LOAD_TIMEOUT", "ProcessExecutor", "pickle_fn", "shm_fits", "shm_free"]
from ._base import Executor, Job, first_error, iter_chunks, threads_per_worker

#: seconds a worker may take to load the row function (importing its modules)
LOAD_TIMEOUT = 120.0


class _Worker:
    def __init__(self, ctx: Any, threads: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker.main, args=(child, os.getpid(), threads), daemon=True, name="prep-worker"
        )
        try:
            self.proc.start()
        except (OSError, EOFError, RuntimeError) as exc:
            raise ExecutorUnavailable(
                f"executor='processes' could not start a worker process "
                f"({type(exc).__name__}: {exc}); use executor='threads' or 'joblib'"
            ) from exc
        finally:
            child.close()
        self.fn_blob: bytes | None = None
        self.keys: set[int] = set()
        self.held: tuple[int, int] | None = None  # the row range it is working on

    def stop(self, grace: float = 1.0) -> None:
        """Terminate (SIGTERM, then SIGKILL) and reap; no orphans, no zombies."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(grace)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def how_it_died(self) -> str:
        self.proc.join(1)
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"signal {signal.Signals(-code).name}"
        return f"exit code {code}"


class ProcessExecutor(Executor):
    name = "processes"
    needs_processes = True

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        self._workers: list[_Worker] = []
        # (key, shared column buffer, owned): only buffers prep made are reused for the
        # next batch; a tensor the caller passed already shared is theirs, never written
        self._arena: list[tuple[int, torch.Tensor, bool]] = []
        self._lock = threading.Lock()  # one batch at a time: the pipes carry one conversation
        self._keys = itertools.count()
        self._dispatch: float | None = None

    # -------------------------------------------------------------- lifecycle

    def _ensure_started(self) -> None:
        if any(not w.proc.is_alive() for w in self._workers):
            self._reset()  # one died while idle (killed, OOM): start all afresh
        if len(self._workers) < self.workers:
            _spawn.ensure_server()  # measures the server's start and a worker's, once
            ctx = _spawn.context()
            threads = threads_per_worker(self.workers)
            while len(self._workers) < self.workers:
                self._workers.append(_Worker(ctx, threads))

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

    def load(self, fn: Any, timeout: float | None = None) -> float:
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
                self.run(Job(_worker.identity, probe))
                best = min(best, time.perf_counter() - t)
            self._dispatch = best
        return self._dispatch

    def _reset(self) -> None:
        """Kill every worker; the next call starts fresh ones."""
        workers, self._workers = self._workers, []
        self._arena = []
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
        """Every worker holds ``fn`` (sent to those that do not); all replies read."""
        self._ensure_started()
        waiting = {}
        for w in self._workers:
            if w.fn_blob != blob:
                w.fn_blob = None
                w.conn.send(("fn", blob))
                waiting[w.conn] = w
        limit = LOAD_TIMEOUT if timeout is None else max(0.0, timeout)
        end = time.monotonic() + limit
        failure: tuple[str, BaseException | None] | None = None
        while waiting:
            sentinels = {w.proc.sentinel: w for w in waiting.values()}
            ready = connection.wait([*waiting, *sentinels], max(0.0, end - time.monotonic()))
            if not ready:
                self._reset()
                raise FunctionLoadError(
                    f"executor='processes' workers did not load the row function "
                    f"{describe_fn(fn)} within {limit:.1f} s (does importing what it needs "
                    f"hang?); check that its modules import quickly in a fresh interpreter, "
                    f"or use executor='threads'"
                )
            for r in ready:
                w = waiting.get(r) or sentinels.get(r)  # type: ignore[call-overload]
                if w is None or waiting.pop(w.conn, None) is None:
                    continue  # its pipe and its sentinel were both ready: handled once
                why = _load_reply(w, blob)  # read every reply, the first failure kept
                failure = failure or why
        if failure is not None:
            if any(not w.proc.is_alive() for w in self._workers):
                self._reset()
            reason, cause = failure
            raise FunctionLoadError(
                f"executor='processes' could not load the row function {describe_fn(fn)} in "
                f"its worker processes ({reason}). Workers start from a fresh interpreter "
                f"and never run your main script, so what the function needs by name (its "
                f"module, the modules it imports) must be importable there: install it, or "
                f"keep it on sys.path; or use executor='threads'"
            ) from cause

    # -------------------------------------------------------------- one batch

    def run(self, job: Job) -> Output:
        with self._lock:
            return self._run(job)

    def _run(self, job: Job) -> Output:
        n = len(job.rows)
        if n == 0:
            return job.output  # type: ignore[return-value]
        blob = pickle_fn(job.fn)
        self._load(job.fn, blob, job.remaining())
        shell, keys, columns = self._share_columns(job.rows)
        given = job.output
        if given is not None and not all(
            b.is_shared() and b.is_contiguous() for b in given.buffers
        ):
            check_shm(sum(b.numel() * b.element_size() for b in given.buffers), "the output")
            job.output = given.like(shared=True)  # staging; copied into out= at the end
        try:
            self._send_batch(job, shell, keys, columns)
        except BaseException as exc:
            # crashed, timed out or interrupted with rows in flight: the workers' state is
            # unknown, so start afresh. A row error waited for the others: keep the pool.
            if isinstance(exc, (WorkerCrashed, BatchTimeout, OSError)) or any(
                w.held for w in self._workers
            ):
                self._reset()
            if given is not None:
                job.output = given
            raise
        if given is not None and job.output is not given:
            for dst, src in zip(given.buffers, job.output.buffers):
                dst[job.done :].copy_(src[job.done :])  # rows before were written in place
            job.output = given
        return job.output  # type: ignore[return-value]

    def _share_columns(self, rows: Any) -> tuple[Any, list[int], dict[int, torch.Tensor]]:
        """Put the batch's columns in shared memory, reusing last batch's buffers."""
        if isinstance(rows, SampleRows):
            return rows.shell(), [], {}
        assert isinstance(rows, TensorRows)
        for c in rows.columns:
            if c.device.type != "cpu":
                raise ConfigError(
                    f"executor='processes' got a tensor on {c.device}; workers never touch "
                    f"CUDA, so pass CPU tensors (and device= for the result), or use "
                    f"executor='threads' or 'vectorized' for a batch already on the GPU"
                )
        needed = sum(c.numel() * c.element_size() for c in rows.columns if not c.is_shared())
        check_shm(needed, "the batch")
        arena, keys, columns = [], [], {}
        for j, c in enumerate(rows.columns):
            if c.is_shared() and c.is_contiguous() and c.storage_offset() == 0:
                key, buf, owned = next(self._keys), c, False  # already shared (a DataLoader's)
            elif j < len(self._arena) and self._arena[j][2] and _same_layout(self._arena[j][1], c):
                key, buf, owned = self._arena[j]
                buf.copy_(c)
            else:
                key, owned = next(self._keys), True
                buf = torch.empty(c.shape, dtype=c.dtype).share_memory_()
                buf.copy_(c)
            arena.append((key, buf, owned))
            keys.append(key)
            columns[key] = buf
        self._arena = arena
        return rows.shell(), keys, columns

    def _send_batch(
        self, job: Job, shell: Any, keys: list[int], columns: dict[int, torch.Tensor]
    ) -> None:
        n = len(job.rows)
        for w in self._workers:
            w.held = None
            new = {k: columns[k] for k in keys if k not in w.keys}
            w.conn.send(("batch", shell, keys, new, job.output))
            w.keys = set(keys)
        pending: deque[tuple[int, int]] = deque()
        if job.output is None:  # a worker runs row 0 first; its result fixes the output
            self._send(self._workers[0], job, 0, 1, probe=True)
            self._collect(job, stop_on_error=True)
            for w in self._workers:
                w.conn.send(("output", job.output))
            pending.extend(iter_chunks(n, self.workers, first=1))
        else:
            pending.extend(iter_chunks(n, self.workers, first=job.done))
        errors: list[BaseException] = []
        while True:
            for w in self._workers:
                if pending and w.held is None and not errors:
                    self._send(w, job, *pending.popleft())
            if not any(w.held for w in self._workers):
                break  # all done, or stopped after an error with nothing left in flight
            errors.extend(self._collect(job))
        if errors:
            raise first_error(errors)

    def _send(self, w: _Worker, job: Job, start: int, stop: int, probe: bool = False) -> None:
        w.held = (start, stop)
        w.conn.send(("run", start, stop, job.rows.chunk(start, stop), probe))

    def _collect(self, job: Job, stop_on_error: bool = False) -> list[BaseException]:
        """Wait for the next replies; returns row errors, raises on crash or timeout."""
        busy = [w for w in self._workers if w.held]
        by_conn = {w.conn: w for w in busy}
        by_sentinel = {w.proc.sentinel: w for w in self._workers}
        left = job.remaining()
        ready = connection.wait(
            [*by_conn, *by_sentinel], timeout=None if left is None else max(left, 0)
        )
        if not ready:
            held = ", ".join(
                f"{w.held[0]}-{w.held[1] - 1} (pid {w.proc.pid})" for w in busy if w.held
            )
            raise job.timed_out(
                f"workers still busy with rows {held} were terminated and will be replaced"
            )
        errors = []
        for r in ready:
            w = by_conn.get(r)  # type: ignore[arg-type]
            if w is None:
                continue
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                self._crashed(by_sentinel[w.proc.sentinel])
            errors.extend(self._handle(job, w, msg))
        for r in ready:
            if r in by_sentinel:
                self._crashed(by_sentinel[r])  # type: ignore[index]
        if errors and stop_on_error:
            raise errors[0]
        return errors

    def _handle(self, job: Job, w: _Worker, msg: tuple[Any, ...]) -> list[BaseException]:
        tag = msg[0]
        if tag == "done":
            w.held = None
            return []
        if tag == "probe":
            w.held = None
            leaves = flatten(msg[2])[1]
            check_shm(
                len(job.rows) * sum(t.numel() * t.element_size() for t in leaves), "the output"
            )
            job.store(msg[1], msg[2], shared=True)
            return []
        row = msg[1]
        if w.held is not None and not (w.held[0] <= row < w.held[1]):
            return []
        w.held = None
        return [_worker.error_from_reply(msg)]

    def _crashed(self, w: _Worker) -> None:
        how = w.how_it_died()
        rows = f"while it held rows {w.held[0]}-{w.held[1] - 1}" if w.held else "while idle"
        raise WorkerCrashed(
            f"worker pid {w.proc.pid} died with {how} {rows}; likely causes: a segfault or "
            f"abort in the row function (or a library it calls), or the OS killed the worker "
            f"for memory (see dmesg). The pool starts new workers on the next call",
            pid=w.proc.pid,
            exitcode=w.proc.exitcode,
            rows=w.held,
        )


def _load_reply(w: _Worker, blob: bytes) -> tuple[str, BaseException | None] | None:
    """None if the worker loaded the function, else why not (and its traceback)."""
    try:
        msg = w.conn.recv() if w.conn.poll() else None
    except (EOFError, OSError):
        msg = None
    if msg is None:
        return f"the worker died with {w.how_it_died()} while loading it", None
    if msg[0] == "loaded":
        w.fn_blob = blob
        return None
    _, _, name, text, tb, _ = msg
    return f"{name}: {text}", RemoteTraceback(tb)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
