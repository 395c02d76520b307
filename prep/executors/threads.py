"""A persistent pool of daemon threads, each writing its rows in place.

Threads pay off when the row function releases the GIL (most torch ops on
tensors of a few thousand elements or more); a pure-Python row function runs
no faster than ``serial``. While a batch runs, torch's intra-op threads are
capped at ``cores // workers`` (and restored after), as in worker processes.
A row that hangs cannot be killed from outside its thread: on ``timeout`` the
batch raises :class:`~prep.BatchTimeout`, the stuck thread is abandoned (it is
a daemon, so it does not block interpreter exit) and fresh threads serve the
next batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from .._structure import Output
from ..errors import BatchTimeout
from ._base import Executor, Job, iter_chunks, threads_per_worker

Task = Callable[[], None]


class ThreadExecutor(Executor):
    name = "threads"

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()

    def _ensure_started(self) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self.workers:
                t = threading.Thread(
                    target=_serve,
                    args=(self._tasks,),
                    daemon=True,
                    name=f"prep-thread-{len(self._threads)}",
                )
                t.start()
                self._threads.append(t)

    def run(self, job: Job) -> Output:
        with self._run_lock:  # one batch at a time (and one save/restore of torch's threads)
            return self._run_capped(job)

    def _run_capped(self, job: Job) -> Output:
        # workers x intra-op threads <= cores, as in worker processes: two threads that
        # each fan a matmul out to every core only fight over them
        intra = torch.get_num_threads()
        torch.set_num_threads(min(intra, threads_per_worker(self.workers)))
        try:
            return self._run(job)
        finally:
            torch.set_num_threads(intra)

    def _run(self, job: Job) -> Output:
        n = len(job.rows)
        if n == 0:
            return job.output  # type: ignore[return-value]
        first = job.done
        if job.output is None:  # the first row fixes the output's shape
            job.store(0, job.compute(0))
            first = 1
        chunks = list(iter_chunks(n, self.workers, first=first))
        if not chunks:
            return job.output  # type: ignore[return-value]
        self._ensure_started()
        return self._run_chunks(job, chunks)

    def _run_chunks(self, job: Job, chunks: list[tuple[int, int]]) -> Output:
        n = len(job.rows)
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
                    raise BatchTimeout(
                        f"the batch of {n} rows did not finish within timeout={job.timeout} s; "
                        f"threads cannot be killed, so the stuck ones were abandoned and new "
                        f"ones started"
                    ) from None
                if exc is not None:
                    errors.append((start, exc))
        finally:
            stop.set()
        if errors:
            raise min(errors, key=lambda e: e[0])[1]
        return job.output  # type: ignore[return-value]

    def _abandon(self) -> None:
        """Leave the current threads to finish (or hang) on their own; serve from new ones."""
        old = self._tasks
        with self._lock:
            self._tasks = queue.SimpleQueue()
            self._threads = []
        for _ in range(self.workers):
            old.put(None)  # idle old threads exit at once, busy ones after their row

    def close(self) -> None:
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._tasks.put(None)
        for t in threads:
            t.join(timeout=5)


def _serve(tasks: queue.SimpleQueue[Task | None]) -> None:
    while (task := tasks.get()) is not None:
        task()
