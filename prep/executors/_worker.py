"""What a worker computes for its rows, and how it reports them: rows written into
the batch's output (:func:`write_rows`) or into a chunk of their own
(:func:`run_chunk`), a failure as a reply the parent rebuilds
(:func:`error_from_reply`); and what a worker process sets up for itself (its
threads, a watch on its parent). Worker processes (``_batch_worker``), threads
(``_batch_threads``) and loky's tasks (``joblib_loky``) all run these.

It imports only torch and prep, so prep's forkserver preloads it once and forks
each worker in milliseconds.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback
from typing import Any

import torch

from .._writers import running
from ..core.output import Output
from ..core.policy import RAISE, Policy, ResultCheck
from ..core.rows import Rows
from ..errors import PrepError, RemoteTraceback, RowError
from ._context import OWN, Context, follow
from ._job import Job
from ._messages import BAD_RESULT, CALL_ERROR, ERROR, Chunk, Done, Failure


def limit_threads(threads: int) -> None:
    """Cap torch's intra-op pool and the BLAS/OpenMP pools of this process."""
    for var in sorted(OWN):
        os.environ[var] = str(threads)
    torch.set_num_threads(threads)


def _watch_parent(pid: int, every: float = 0.5) -> None:
    """Exit when the main process is gone, even while the row function hangs."""

    def watch() -> None:
        # no start-time check (writer_alive's): a wall clock stepped forward would make
        # the live parent look younger than this worker, and end the worker
        while running(pid):
            time.sleep(every)
        os._exit(1)  # releases this worker's shared memory with its file descriptors

    threading.Thread(target=watch, daemon=True, name="prep-parent-watch").start()


def _error(row: int, exc: BaseException, kind: str = ERROR, live: bool = False) -> Failure:
    """The failure that reports ``exc`` (on ``row``): pickled with its traceback's text
    for another process; ``live`` (a thread of the caller's process): the exception
    itself, its own traceback intact."""
    if live:
        return Failure(kind, row, type(exc).__name__, str(exc), "", exc)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None  # the parent rebuilds the error from its name and text
    return Failure(kind, row, type(exc).__name__, str(exc), tb, blob)


def call_failure(exc: BaseException) -> Failure:
    """A call's exception as its reply's failure (and whether it had a cause of its
    own: a verdict such as a ShardError travels without the worker's traceback)."""
    had_cause = exc.__cause__ is not None or exc.__context__ is not None
    return _error(-1, exc, CALL_ERROR)._replace(had_cause=had_cause)


def call_error(reply: Failure, whole: bool = False) -> BaseException:
    """The parent's exception for :func:`call_failure`'s reply, the worker's traceback
    text its cause; ``whole=False`` leaves that out of prep's own verdict (a ShardError
    with no cause), which says all a user needs."""
    err = rebuild(reply.blob, reply.name, reply.text, reply.tb)
    if not whole and not reply.had_cause and isinstance(err, PrepError):
        err.__cause__ = None  # prep's whole verdict (a ShardError): no traceback to add
    return err


def identity(row: torch.Tensor) -> torch.Tensor:
    """A row function that does nothing: what a pool's own dispatch cost is measured with."""
    return row


def exit_now() -> None:
    """A process that does nothing: what starting one worker is timed with."""


def ready(hold: float) -> int:
    """A worker's pid, once it has imported torch (this module does), after ``hold`` s."""
    time.sleep(hold)
    return os.getpid()


def rebuild(blob: Any, name: str, text: str, tb: str) -> BaseException:
    """The worker's exception in the parent, its traceback text as ``__cause__`` (a live
    one, from a thread, as it is)."""
    if isinstance(blob, BaseException):
        return blob
    exc: BaseException
    try:
        exc = pickle.loads(blob) if blob is not None else RuntimeError(f"{name}: {text}")
    except Exception:
        exc = RuntimeError(f"{name}: {text}")
    exc.__cause__ = RemoteTraceback(tb)
    return exc


def write_rows(
    fn: Any, rows: Rows, out: Output, start: int, stop: int, live: bool = False
) -> Done | Failure:
    """Rows ``start:stop`` into ``out`` a block at a time; :class:`Done`, or the first
    failure (``live``: as :func:`_error` reports it to a thread of this process)."""
    failure = _run(Job.new(fn, rows, out), start, stop, live)
    return Done(start, stop) if failure is None else failure


def _run(job: Job, start: int, stop: int, live: bool) -> Failure | None:
    """``job``'s rows ``start:stop`` run; None, or the first failure as a reply reports it."""
    try:
        job.run_range(start, stop)
    except RowError as err:
        cause = err.__cause__ if isinstance(err.__cause__, Exception) else err
        return _error(err.row, cause, live=live)
    except Exception as exc:  # the worker's setup (not the row's fault), or a bad result
        return _error(getattr(exc, "row", start), exc, BAD_RESULT, live)
    return None


def error_from_reply(reply: Failure) -> BaseException:
    """The parent's exception for a row's failure, with ``.row`` set.

    A failing row function becomes a RowError whose cause is the worker's exception
    (its traceback text as the cause's cause); a bad result keeps its own type
    (StackError, TypeError)."""
    exc = rebuild(reply.blob, reply.name, reply.text, reply.tb)
    row = reply.row
    if reply.kind == BAD_RESULT:
        exc.row = row  # type: ignore[attr-defined]  # errors are ranked by row
        return exc
    err = RowError(row, f"row {row}: {reply.name}: {reply.text}")
    err.__cause__ = exc
    return err


def run_chunk_as_caller(context: Context, *args: Any) -> Chunk | Failure:
    """:func:`run_chunk` in the caller's directory and environment (``context``: a
    loky worker, which hears from the caller only through its tasks, gets it with each)."""
    follow(context)
    return run_chunk(*args)


def run_chunk(
    fn: Any,
    rows: Rows,
    start: int,
    stop: int,
    policy: Policy = RAISE,
    shared: bool = False,
    live: bool = False,
) -> Chunk | Failure:
    """Rows ``start:stop`` into an output of their own, returned whole as a
    :class:`Chunk` (its output None where every row failed), or the first failure.

    joblib's tasks run this, and so do ``processes`` workers where rows may differ
    in size or fail on their own (``pad=``, ``on_error=``): an output in shared
    memory (``shared``), which goes back by file descriptor, not through the pipe.
    ``live``: errors reported as :func:`_error` reports them to a thread of this process.
    """
    check = getattr(rows, "check", None)
    if isinstance(check, ResultCheck):
        rows = rows.checking(check.fresh())
    job = Job.new(fn, rows.window(start, stop), policy=policy, shared=shared)
    if (failure := _run(job, start, stop, live)) is not None:
        return failure
    failed = [
        _error(i, e.__cause__ if isinstance(e.__cause__, Exception) else e, live=live)
        for i, e in sorted(job.sink.failures.errors.items())
    ]
    return Chunk(start, stop, job.sink.output, failed)
