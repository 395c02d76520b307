"""``joblib.Parallel`` on loky processes, one task per chunk of rows.

The naive ``Parallel()(delayed(fn)(x[b]) for b in range(B))`` pickles the
whole storage behind every view ``x[b]``: B rows ship B batches. Here each
task gets ``x[start:stop].clone()`` (only its own rows) and returns its chunk
of the output in one piece, so every byte crosses the process boundary once
each way. joblib's cloudpickle also sends lambdas and notebook functions,
which ``processes`` cannot.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from typing import Any

import joblib
from joblib.externals.loky.process_executor import TerminatedWorkerError

from .._structure import Output
from ..errors import BatchTimeout, RowError, StackError, WorkerCrashed
from . import _worker
from ._base import Executor, Job, iter_chunks


class JoblibExecutor(Executor):
    name = "joblib"

    def run(self, job: Job) -> Output:
        n = len(job.rows)
        if n == 0:
            return job.output  # type: ignore[return-value]
        if job.timeout is not None and not self._warm():
            # the timeout is for the rows, not for starting workers (seconds with torch)
            joblib.Parallel(n_jobs=self.workers, backend="loky")(
                joblib.delayed(os.getpid)() for _ in range(self.workers)
            )
            job.restart_clock()
        chunks = list(iter_chunks(n, self.workers, per_worker=2, first=job.done))
        tasks = (
            joblib.delayed(_worker.run_chunk)(job.fn, job.rows.take(a, b), a, b) for a, b in chunks
        )
        parallel = joblib.Parallel(
            n_jobs=self.workers, backend="loky", return_as="generator", timeout=job.timeout
        )
        errors: list[BaseException] = []
        done = 0
        try:
            for reply in parallel(tasks):
                done += 1
                errors.extend(self._write(job, reply))
        except TerminatedWorkerError as exc:
            a, b = chunks[done]
            raise WorkerCrashed(
                f"a joblib/loky worker died while rows {a}-{n - 1} were in flight "
                f"({_exit_text(str(exc))}); likely causes: a segfault or abort in the row "
                f"function, or the OS killed the worker for memory. joblib starts new workers "
                f"on the next call",
                exitcode=_exit_code(str(exc)),
                rows=(a, b),
            ) from exc
        except (TimeoutError, multiprocessing.TimeoutError) as exc:
            raise BatchTimeout(
                f"the batch of {n} rows did not finish within "
                f"timeout={job.timeout} s; joblib terminated its workers and "
                f"starts new ones on the next call"
            ) from exc
        if errors:
            raise min(errors, key=lambda e: getattr(e, "row", n))
        return job.output  # type: ignore[return-value]

    def _warm(self) -> bool:
        from joblib.externals.loky import reusable_executor

        executor = reusable_executor._executor
        processes = getattr(executor, "_processes", None) or {}
        return sum(p.is_alive() for p in processes.values()) >= self.workers

    def close(self) -> None:
        # joblib's loky workers belong to one executor per interpreter, reused by every
        # Parallel call; stop it so close() leaves no process behind.
        from joblib.externals.loky import reusable_executor

        executor = reusable_executor._executor
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)

    def _write(self, job: Job, reply: tuple[Any, ...]) -> list[BaseException]:
        if reply[0] != "done":
            tag, row, name, text, tb, blob = reply
            exc = _worker.rebuild(blob, name, text, tb)
            if tag == "bad-result":
                return [exc]
            err = RowError(row, f"row {row}: {name}: {text}")
            err.__cause__ = exc
            return [err]
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


def _exit_code(text: str) -> int | None:
    m = re.search(r"\((-?\d+)\)", text)
    return int(m.group(1)) if m else None


def _exit_text(text: str) -> str:
    m = re.search(r"exit codes of the workers are (\{.*?\})", text)
    return f"worker exit codes {m.group(1)}" if m else text.splitlines()[0]
