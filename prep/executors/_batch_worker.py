"""The loop a whole-batch worker runs, in the child process (see ``_batches``).

It builds whole batches, one after another, in the order they arrive: each
:class:`~._messages.Build` names the row function by a key (its cloudpickled bytes
come once per worker, in a :class:`~._messages.Function`, just before the first
batch that needs them), and carries the batch's rows. A :class:`~._messages.Call`
is the same, but the keyed function is called once with the message's arguments
and its return value is the reply: ``prep run`` sends a
shard that way (the worker loads, computes and writes it; no tensor travels).
The output is allocated in shared memory and goes back by file
descriptor in the reply itself (``_fdpipe``); the failed rows of ``on_error='fill'``/``'skip'``
come back as error replies beside it. Like ``_worker``, it imports only torch
and prep, so prep's forkserver preloads it.
"""

from __future__ import annotations

import pickle
import random
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from .._kept import keep_newest
from . import _fdpipe
from ._context import Context, follow
from ._messages import (
    BAD_RESULT,
    LOAD_ERROR,
    Build,
    Call,
    Chunk,
    Close,
    Done,
    Failure,
    Function,
    Load,
    Loaded,
    Outcome,
    Reply,
    Returned,
)
from ._worker import _error, _watch_parent, call_failure, limit_threads, run_chunk, write_rows

#: row functions a worker keeps loaded, by key (streams that alternate stay warm)
KEEP = 4


#: the output bytes of the last batch of each row function (by key): whether the next
#: one's output is worth a shared-memory segment
_last_bytes: dict[str, int] = {}


def run_whole(fn: Any, msg: Build) -> Chunk | Done | Failure:
    """The outcome of a :class:`Build`: :func:`_worker.run_chunk`'s over its rows, or,
    where the parent made the batch's output (``into``, shared), :func:`_worker.write_rows`'."""
    rows = msg.rows
    start = rows.offset  # a part of a batch is a window of its rows (batch row numbers)
    if msg.into is not None:
        return write_rows(fn, rows, msg.into, start, start + len(rows))
    # equal rows: the output is made in shared memory, written once. Ragged rows grow
    # their output a few times a batch, and each shared growth costs a new segment:
    # they grow in private memory, and _fdpipe copies the final one into shared memory.
    # An output as small as the last one was travels in the message: no segment at all
    small = _last_bytes.get(msg.key, _fdpipe.INLINE + 1) <= _fdpipe.INLINE
    shared = msg.policy.padding is None and not small
    chunk = run_chunk(fn, rows, start, start + len(rows), policy=msg.policy, shared=shared)
    if isinstance(chunk, Chunk) and chunk.output is not None:
        _last_bytes[msg.key] = max(b.nbytes for b in chunk.output.buffers)
    return chunk


def run_call(fn: Any, msg: Call) -> Returned | Failure:
    """The outcome of a :class:`Call`: the function's value, or a failure with its
    exception (and whether it had a cause of its own: a verdict such as a ShardError
    travels without the worker's traceback)."""
    try:
        return Returned(fn(*msg.args))
    except BaseException as exc:  # SystemExit, KeyboardInterrupt in the function too
        return call_failure(exc)


class Seeds:
    """This worker's generators started from its own ``seed``: torch's default CPU
    generator and Python's ``random`` at once, numpy's global one as soon as numpy is
    imported here (at start, or by the first row function that imports it)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        torch.random.default_generator.manual_seed(seed)  # not torch.manual_seed: no CUDA
        random.seed(seed)
        self.numpy = False
        self.seed_numpy()

    def seed_numpy(self) -> None:
        np = sys.modules.get("numpy")
        if np is not None and not self.numpy:
            np.random.seed(self.seed % 2**32)  # numpy's legacy seeds are 32-bit
            self.numpy = True


def main(conn: Connection, main_pid: int, threads: int, seed: int) -> None:
    """Serve whole batches until the parent says ``close`` or goes away; ``seed`` is
    this worker's own (``_handles.worker_seed``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # a forked worker inherits the parent's handlers (prep run's SIGTERM raises): a
    # terminate() must end the worker, not become an exception in the unit it runs
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    limit_threads(threads)
    _watch_parent(main_pid)
    seeds = Seeds(seed)
    fns: dict[str, Any] = {}  # key -> the function, or the error that loading it raised
    while True:
        try:
            msg = _fdpipe.recv(conn)
        except (EOFError, OSError):
            return
        if isinstance(msg, Close):
            return
        if isinstance(msg, Context):  # the caller's directory and environment, as they are now
            follow(msg)
            continue
        if isinstance(msg, Function):
            try:
                fn = pickle.loads(msg.blob)
            except BaseException as exc:  # SystemExit from a module it imports, too
                fn = exc
            keep_newest(fns, msg.key, fn, KEEP)
            seeds.seed_numpy()  # the function's module may have imported it
            continue
        fn, started = fns.get(msg.key), time.monotonic()
        outcome: Outcome
        if fn is None or isinstance(fn, BaseException):
            why = fn if fn is not None else LookupError(f"no function {msg.key!r} was sent")
            outcome, started = _error(-1, why, LOAD_ERROR), 0.0  # no work: not timed
        elif isinstance(msg, Load):  # is the function there?
            outcome, started = Loaded(), 0.0
        else:
            outcome = run_call(fn, msg) if isinstance(msg, Call) else run_whole(fn, msg)
        reply = Reply(msg.seq, started, time.monotonic() if started else 0.0, outcome)
        try:
            _fdpipe.send(conn, reply)
        except Exception as exc:  # e.g. an output that cannot be pickled
            _fdpipe.send(conn, Reply(msg.seq, 0.0, 0.0, _error(-1, exc, BAD_RESULT)))
        del reply, outcome, fn, msg  # the output's shared memory goes once the parent has it
