"""``joblib.Parallel`` on loky processes, one task per chunk of rows.

The naive ``Parallel()(delayed(fn)(x[b]) for b in range(B))`` pickles the
whole storage behind every view ``x[b]``: B rows ship B batches. Here each
task gets ``x[start:stop].clone()`` (only its own rows) and returns its chunk
of the output in one piece, so every byte crosses the process boundary once
each way. joblib's cloudpickle also sends lambdas and notebook functions,
which ``processes`` cannot. With ``workers=1`` joblib runs the rows in this
process (its own rule for ``n_jobs=1``), where ``timeout`` cannot apply.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from typing import Any

import joblib
from joblib.externals.loky.process_executor import TerminatedWorkerError

from .._structure import Output
from ..errors import StackError, WorkerCrashed
from . import _worker
from ._base import Executor, Job, first_error, iter_chunks


class JoblibExecutor(Executor):
    name = "joblib"
    needs_processes = True

    def run(self, job: Job) -> Output:
        n = len(job.rows)
        if n == 0:
            return job.output  # type: ignore[return-value]
        if job.timeout is not None and self.workers > 1:
            # the timeout is for the rows, not for (re)starting loky's workers, which takes
            # seconds with torch: make sure they are up first (a few ms when they are)
            self._wait_for_workers()
            job.restart_clock()
        chunks = list(iter_chunks(n, self.workers, per_worker=2, first=job.done))
        tasks = (
            joblib.delayed(_worker.run_chunk)(job.fn, job.rows.take(a, b), a, b) for a, b in chunks
        )
        # joblib runs n_jobs=1 in this process, where it cannot time out (it warns)
        parallel = _parallel(self.workers, job.timeout if self.workers > 1 else None)
        errors: list[BaseException] = []
        done = 0
        try:
            for reply in parallel(tasks):
                done += 1
                errors.extend(self._write(job, reply))
        except TerminatedWorkerError as exc:
            a, b = chunks[done]
            raise WorkerCrashed(
                f"a joblib/loky worker died while rows {a}-{b - 1} and later were in flight "
                f"({_exit_text(str(exc))}); likely causes: a segfault or abort in the row "
                f"function, or the OS killed the worker for memory. joblib starts new workers "
                f"on the next call",
                exitcode=_exit_code(str(exc)),
                rows=(a, b),
            ) from exc
        except (TimeoutError, multiprocessing.TimeoutError) as exc:
            self.close()  # joblib leaves a worker stuck in a hung row running: kill them all
            raise job.timed_out(
                "joblib terminated its workers and starts new ones on the next call"
            ) from exc
        if errors:
            raise first_error(errors)
        return job.output  # type: ignore[return-value]

    def _wait_for_workers(self, limit: float = 60.0) -> None:
        """Return once every worker has imported torch and answered (or after ``limit``)."""
        seen: set[int] = set()
        end = time.monotonic() + limit
        while len(seen) < self.workers and time.monotonic() < end:
            # each task holds its worker briefly, so the others must take the rest
            tasks = (joblib.delayed(_worker.ready)(0.02) for _ in range(2 * self.workers))
            seen.update(_parallel(self.workers, None)(tasks))

    def close(self) -> None:
        # joblib's loky workers belong to one executor per interpreter, reused by every
        # Parallel call; stop it so close() leaves no process behind.
        from joblib.externals.loky import reusable_executor

        executor = reusable_executor._executor
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)

    def _write(self, job: Job, reply: tuple[Any, ...]) -> list[BaseException]:
        if reply[0] != "done":
            return [_worker.error_from_reply(reply)]
        _, start, spec, leaves = reply
        if job.output is None:
            job.output = Output.allocate(
                spec.unflatten([t[0] for t in leaves]), len(job.rows), row=start, pin=job.pin
            )
        out = job.output
        for buf, leaf in zip(out.buffers, leaves):
            if spec != out.spec or leaf.shape[1:] != buf.shape[1:] or leaf.dtype != buf.dtype:
                out.write(start, spec.unflatten([t[0] for t in leaves]))  # raises StackError
                raise StackError(f"rows {start}-{start + len(leaf) - 1} do not match the output")
            buf[start : start + len(leaf)].copy_(leaf)
        return []


def _parallel(workers: int, timeout: float | None) -> joblib.Parallel:
    # one configuration everywhere: joblib starts a new set of workers when it changes
    return joblib.Parallel(n_jobs=workers, backend="loky", return_as="generator", timeout=timeout)


def _exit_code(text: str) -> int | None:
    m = re.search(r"\((-?\d+)\)", text)
    return int(m.group(1)) if m else None


def _exit_text(text: str) -> str:
    m = re.search(r"exit codes of the workers are (\{.*?\})", text)
    return f"worker exit codes {m.group(1)}" if m else text.splitlines()[0]
