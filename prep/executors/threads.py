"""A persistent pool of daemon threads, each writing its rows in place.

Threads pay off when the row function releases the GIL (most torch ops on
tensors of a few thousand elements or more); a pure-Python row function runs
no faster than ``serial``. Each worker thread runs torch on ``cores // workers``
intra-op threads, as worker processes do, set once in that thread: torch's
OpenMP setting is per thread, so the caller's own setting is never touched.
(Capping it in the calling thread around each batch, as prep once did, left
the workers' OpenMP teams alive next to the caller's; libgomp then throttles
every team's spinning once it manages more threads than cores, and small torch
ops in the caller's thread ran up to 4x slower for as long as the pool lived.)
A row that hangs cannot be killed from outside its thread: on ``timeout`` the
batch raises :class:`~prep.BatchTimeout`, the stuck thread is abandoned (it is
a daemon, so it does not block interpreter exit) and fresh threads serve the
next batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from .._output import Output
from ._base import Executor, Job, iter_chunks, threads_per_worker
from ._daemons import DaemonThreads, own_intra_op_threads

Task = Callable[[], None]
#: rows run one at a time, at most, while failing rows leave the output unshaped
LONE_ROWS = 8


class ThreadExecutor(DaemonThreads[Task], Executor):
    name = "threads"

    def __init__(self, workers: int | None = None) -> None:
        Executor.__init__(self, workers)
        DaemonThreads.__init__(self, self.workers)
        self._run_lock = threading.Lock()

    def worker_threads(self) -> int | None:
        return threads_per_worker(self.workers)

    def _ensure_started(self) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            ready = []
            while len(self._threads) < self.workers:
                ready.append(threading.Event())
                t = threading.Thread(
                    target=_serve,
                    args=(self._tasks, threads_per_worker(self.workers), ready[-1]),
                    daemon=True,
                    name=f"prep-thread-{len(self._threads)}",
                )
                t.start()
                self._threads.append(t)
            # each new thread lowers torch's process-wide default for a moment while it
            # takes its own share of threads: none may still be at it once a batch returns
            for event in ready:
                event.wait()

    def run(self, job: Job) -> Output | None:
        with self._run_lock:  # one batch at a time
            return self._run(job)

    def _run(self, job: Job) -> Output | None:
        n = len(job.rows)
        if n == 0:
            return job.sink.output
        first = job.start
        self._ensure_started()
        # one worker runs the first row: its result fixes the output. Under fill/skip a
        # failed row fixes nothing, so the next runs alone too (a few at most): else the
        # threads would race to fix it, and serial's reference is the lowest good row
        for _ in range(LONE_ROWS if job.policy.per_row_errors else 1):
            if job.sink.output is not None or first >= n:
                break
            self._run_chunks(job, [(first, first + 1)])
            first += 1
        chunks = list(iter_chunks(n, self.workers, first=first))
        if not chunks:
            return job.sink.output
        return self._run_chunks(job, chunks)

    def _run_chunks(self, job: Job, chunks: list[tuple[int, int]]) -> Output | None:
        done: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()
        stop = threading.Event()

        def task(start: int, end: int) -> Task:
            def run() -> None:
                try:
                    job.run_range(start, end, stop.is_set)
                    done.put((start, None))
                except BaseException as exc:  # reported to the caller, never lost
                    stop.set()
                    done.put((start, exc))

            return run

        for start, end in chunks:
            self._tasks.put(task(start, end))
        errors: list[tuple[int, BaseException]] = []
        try:
            for _ in chunks:
                left = job.remaining()
                try:
                    start, exc = done.get(timeout=None if left is None else max(left, 0))
                except queue.Empty:
                    self._abandon()
                    raise job.timed_out(
                        "threads cannot be killed, so the stuck ones were abandoned and new "
                        "ones started"
                    ) from None
                if exc is not None:
                    errors.append((start, exc))
        finally:
            stop.set()
        if errors:
            raise min(errors, key=lambda e: e[0])[1]
        return job.sink.output

    def _abandon(self) -> None:
        """Leave the current threads to finish (or hang) on their own; serve from new ones."""
        old = self._tasks
        with self._lock:
            self._tasks = queue.SimpleQueue()
            self._threads = []
        for _ in range(self.workers):
            old.put(None)  # idle old threads exit at once, busy ones after their row


def _serve(tasks: queue.SimpleQueue[Task | None], intra: int, ready: threading.Event) -> None:
    try:
        own_intra_op_threads(intra)
    finally:
        ready.set()
    while (task := tasks.get()) is not None:
        task()
        del task  # the task holds its batch's output: keep nothing alive between batches
