"""loky processes (joblib's process pool), one task per chunk of rows.

The naive ``Parallel()(delayed(fn)(x[b]) for b in range(B))`` pickles the
whole storage behind every view ``x[b]``: B rows ship B batches. Here each
task gets ``x[start:stop].clone()`` (only its own rows) and returns its chunk
of the output in one piece, so every byte crosses the process boundary once
each way. loky's cloudpickle also sends lambdas and notebook functions.

The workers are this executor's own: a ``loky.ProcessPoolExecutor`` made for
it, not the one executor per interpreter that every ``joblib.Parallel`` call
reuses. So a timeout or ``close()`` here, which must kill workers (one may be
stuck in a hung row), never kills the user's own joblib work or another Pool's.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import re
import time
from typing import Any

from ..core.output import Output
from ..core.policy import ResultCheck
from ..errors import WorkerCrashed
from . import _worker
from ._base import PROCESS_THREADS, Executor, Traits, first_error, split
from ._chunks import ChunkMerge
from ._context import Follower
from ._isolation import Isolation
from ._job import Job
from ._messages import Chunk, Failure
from ._transport import ByValue


class JoblibExecutor(Executor):
    name = "joblib"
    # loky's workers take tasks, not streams: prep's do
    traits = Traits(needs_processes=True, stream_workers=("processes",))

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        self._pool: Any = None  # a loky.ProcessPoolExecutor, started on first use
        self._follower = Follower()  # the caller's directory and environment, for each task

    def run(self, job: Job) -> Output | None:
        n = len(job.rows)
        if n == 0:
            return job.sink.output
        first, errors = job.start, []
        check = getattr(job.rows, "check", None)
        if job.sink.output is None and isinstance(check, ResultCheck):
            # as threads do: the first row alone shapes the output, and every worker then
            # checks its rows against it (else each would against its own first row)
            errors = self._run_all(job, [(first, first + 1)])
            first += 1
            if job.sink.output is not None:
                check.seed(job.sink.output)
        chunks = split(first, n, self.workers * 2)  # a few per worker: fast ones take up slack
        if chunks and not errors:
            errors = self._run_all(job, chunks)
        if errors:
            raise first_error(errors)
        return job.sink.output

    def _run_all(self, job: Job, chunks: list[tuple[int, int]]) -> list[BaseException]:
        """The chunks' rows written (a worker's death isolated under fill/skip, see
        :mod:`._isolation`: loky cannot say which task's worker died, so each range in
        flight counts as held by it); the errors to raise."""
        isolation = Isolation(job)
        errors, lost = self._run_chunks(job, chunks)
        while lost:
            again = [one for held in lost for one in isolation.lost(held, "a loky worker")]
            lost = []
            for single in again:  # one at a time: a death then names its row
                row_errors, died = self._run_chunks(job, [single])
                errors += row_errors
                lost += died
        return errors

    def _run_chunks(
        self, job: Job, chunks: list[tuple[int, int]]
    ) -> tuple[list[BaseException], list[tuple[int, int]]]:
        """The chunks' rows written; the errors to raise, and (under fill/skip) the
        ranges that were in flight when a worker died."""
        # loky is imported on first use: a program (prep run) that never picks joblib
        # does not pay for it at start-up
        from loky.process_executor import TerminatedWorkerError

        pool, ctx, policy = self._started(job), self._follower.now(), job.policy
        fn = ByValue(job.fn)  # as processes sends it: a traceback names the user's file
        run = _worker.run_chunk_as_caller
        futures = {
            pool.submit(run, ctx, fn, job.rows.take(a, b), a, b, policy): (a, b) for a, b in chunks
        }
        errors: list[BaseException] = []
        # merged in row order, whatever order they finish in: the lowest chunk's first
        # row is the output's reference, as serial's first row is
        replies: dict[int, Chunk | Failure] = {}
        order = sorted(a for a, _ in chunks)
        try:
            for future in cf.as_completed(futures, timeout=job.remaining()):
                replies[futures[future][0]] = future.result()
                while order and order[0] in replies:
                    self._write(job, replies.pop(order.pop(0)), errors)
        except TerminatedWorkerError as exc:
            self.close(kill=True)  # loky's executor is broken for good once a worker died
            lost = sorted(futures[f] for f in futures if not _succeeded(f))
            for a in sorted(replies):  # those that came back behind a lost one
                self._write(job, replies[a], errors)
            if job.policy.per_row_errors:
                return errors, lost
            a, b = lost[0]
            raise WorkerCrashed(
                f"a loky worker died while rows {a}-{b - 1} and later were in flight "
                f"({_exit_text(str(exc))}); likely causes: a segfault or abort in the row "
                f"function, or the OS killed the worker for memory. New workers start "
                f"on the next call",
                exitcode=_exit_code(str(exc)),
                rows=(a, b),
            ) from exc
        except cf.TimeoutError as exc:
            self.close(kill=True)  # a worker stuck in a hung row holds its core: kill them all
            raise job.timed_out(
                "its workers were terminated; new ones start on the next call"
            ) from exc
        return errors, []

    def _started(self, job: Job) -> Any:
        """The pool, its workers up. The timeout is for the rows, not for starting the
        workers (seconds with torch): the clock restarts once they have all answered."""
        if self._pool is None:
            import loky

            self._pool = loky.ProcessPoolExecutor(
                max_workers=self.workers,
                initializer=_worker.limit_threads,
                initargs=(PROCESS_THREADS,),
            )
            self._wait_for_workers()
            job.deadline.restart()
        return self._pool

    def _wait_for_workers(self, limit: float = 60.0) -> None:
        """Return once every worker has imported torch and answered (or after ``limit``)."""
        seen: set[int] = set()
        end = time.monotonic() + limit
        while len(seen) < self.workers and time.monotonic() < end:
            # each task holds its worker briefly, so the others must take the rest
            tasks = [self._pool.submit(_worker.ready, 0.02) for _ in range(2 * self.workers)]
            seen.update(t.result(timeout=max(0.0, end - time.monotonic())) for t in tasks)

    def close(self, kill: bool = False) -> None:
        """Stop the workers: asked to exit (so that they close their setup= states), or
        killed after a timeout or a crash (a worker may be stuck in a hung row)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, kill_workers=kill)
            # a dead worker's process object stays in multiprocessing's table of children
            # (and holds one of loky's named semaphores) until the next process starts;
            # active_children() forgets the finished ones now, as starting one would
            multiprocessing.active_children()

    def _write(self, job: Job, reply: Chunk | Failure, errors: list[BaseException]) -> None:
        if isinstance(reply, Failure):
            errors.append(_worker.error_from_reply(reply))
            return
        ChunkMerge(job).take(reply, errors)
        job.sink.advance(reply.stop - reply.start)


def _succeeded(future: cf.Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _exit_code(text: str) -> int | None:
    m = re.search(r"\((-?\d+)\)", text)
    return int(m.group(1)) if m else None


def _exit_text(text: str) -> str:
    m = re.search(r"exit codes of the workers are (\{.*?\})", text)
    return f"worker exit codes {m.group(1)}" if m else text.splitlines()[0]
