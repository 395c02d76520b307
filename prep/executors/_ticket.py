"""A whole batch (or a part of one) handed to a worker: the ``concurrent.futures``
shape of a stream's batches in flight (:mod:`prep.executors._batches` for processes,
:mod:`prep.executors._batch_threads` for threads)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from ..core.output import Output
from ..core.policy import Policy
from ..core.rows import Rows
from ..errors import BatchTimeout, FunctionLoadError, PrepError, RowError, WorkerCrashed
from . import _worker
from ._messages import CALL_ERROR, LOAD_ERROR, Chunk, Done, Loaded, Outcome, Returned
from ._transport import describe_fn

__all__ = ["Ticket", "Value", "value_of"]

Value = tuple[Output | None, dict[int, BaseException]]


class Ticket:
    """One whole batch handed to a worker: :meth:`wait` for it, then :meth:`result`."""

    def __init__(self, owner: Any, rows: Rows, policy: Policy, timeout: float | None) -> None:
        self.owner = owner
        self.rows, self.policy, self.timeout = rows, policy, timeout
        self.limit = timeout  # the timeout as the caller gave it, for messages
        self.started: float | None = None  # when its worker could start it
        self.busy: float | None = None  # seconds its worker took
        # when its worker began and ended it, by time.monotonic (where not started..busy)
        self.span: tuple[float, float] | None = None
        self.transfer = 0.0  # seconds the parent took to receive it (unpickling, mapping)
        self.crashed = False  # its worker died on it (the caller may isolate its rows)
        self.cancelled = False
        self.fn: Any = None  # the row function itself, where it need not travel (threads)
        self.key = ""  # the row function's, where it travels by key (processes)
        self.lane: Any = None  # the worker that holds it (processes)
        self.seq = -1  # its number on that worker's pipe (processes)
        self.wire: Rows | None = None  # the rows as sent (in the ring's memory), if not rows
        # rows start:stop of a batch split into parts (``rows`` is that window), else None
        self.part: tuple[int, int] | None = None
        self.reply: Outcome | None = None  # its worker's outcome as it came
        self.into: Output | None = None  # the batch's output its part is written into, if any
        self.on_settled: Any = None  # called once when it is settled (gives the ring back)
        # a "call" unit (``ProcessBatches.submit_call``): the keyed function's arguments,
        # and what it works on, for errors ("the shard data/a.pt"); None for rows
        self.args: tuple[Any, ...] | None = None
        self.what = ""
        # "rows" (a whole batch), "part" (rows of a batch, replied as a chunk or written
        # into ``into``; every row of it where ``part`` is None), "call", or "load"
        self.kind = "rows"
        # the caller's autograd modes (grad, inference) when it submitted: a thread builds
        # under them, as serial would in the caller's own thread
        self.grad, self.inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        self._done = threading.Event()
        self._value: Value | None = None
        self._error: BaseException | None = None

    @classmethod
    def part_of(
        cls,
        owner: Any,
        key: Any,
        rows: Rows,
        wire: Rows,
        bounds: tuple[int, int],
        policy: Policy,
        timeout: float | None,
    ) -> Ticket:
        """Rows ``bounds`` of a batch (``wire``: its rows as sent), for a worker to build
        as a chunk of that batch under ``key``'s function."""
        start, stop = bounds
        if (start, stop) == (0, len(rows)):  # every row: the whole batch, as it is
            ticket = cls(owner, rows, policy, timeout)
            ticket.key, ticket.wire, ticket.kind = key, wire, "part"
            return ticket
        ticket = cls(owner, rows.window(start, stop), policy, timeout)
        ticket.key, ticket.part, ticket.wire = key, bounds, wire.window(start, stop)
        ticket.kind = "part"
        return ticket

    @classmethod
    def call(cls, owner: Any, key: str, args: tuple[Any, ...], what: str) -> Ticket:
        """The function under ``key`` called once on ``args`` by a worker; its value is
        what the function returned (a shard's manifest entry), its error what it raised."""
        ticket = cls(owner, None, None, None)  # type: ignore[arg-type]  # no rows to build
        ticket.key, ticket.args, ticket.what, ticket.kind = key, args, what, "call"
        return ticket

    @classmethod
    def load(cls, owner: Any, key: str, timeout: float) -> Ticket:
        """A worker loads the function under ``key`` (if it has not) and says so: ``prepare``
        has every worker hold it before a batch, so that a function the workers cannot load
        fails before any row runs."""
        ticket = cls(owner, None, None, timeout)  # type: ignore[arg-type]  # no rows
        ticket.key, ticket.what, ticket.kind = key, "loading the row function", "load"
        return ticket

    def modes(self) -> contextlib.AbstractContextManager[Any]:
        """The caller's grad and inference modes, entered (in a worker thread) where they
        are not this thread's already (entering them costs every torch op a little)."""
        if (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) == (
            self.grad,
            self.inference,
        ):
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(self.inference))
        stack.enter_context(torch.set_grad_enabled(self.grad))
        return stack

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the batch is done, after waiting up to ``timeout`` seconds for it."""
        return self.done() or self.owner.pump(self, timeout)

    def result(self) -> Value:
        """The output (None when every row failed) and the failed rows' errors; raises
        the batch's error."""
        while not self.wait(None):
            pass
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def cancel(self) -> None:
        """Nobody will take this result: its worker's reply is dropped when read."""
        self.cancelled = True

    def resolve(self, value: Value | None = None, error: BaseException | None = None) -> None:
        """Its value or error, once: a batch abandoned at its deadline stays failed."""
        if self._done.is_set():
            return
        self._value, self._error = value, error
        self._done.set()
        self.settle()

    def settle(self) -> None:
        """Nothing will read what it sent any more (answered, dead, or killed)."""
        release, self.on_settled = self.on_settled, None
        if release is not None:
            release()

    def settled(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for someone to resolve it (no pumping)."""
        return self._done.wait(timeout)

    def left(self, now: float) -> float | None:
        """Seconds before its deadline (None: no timeout, or not started)."""
        if self.timeout is None or self.started is None:
            return None
        return self.timeout - (now - self.started)

    def bounds(self) -> tuple[int, int]:
        """The rows it holds, in batch row numbers."""
        if self.part is not None:
            return self.part
        return (self.rows.offset, self.rows.offset + len(self.rows))

    def describe(self) -> str:
        """What it holds, for an error: "the batch of 64 rows", or "rows 32-63 of a batch"."""
        if self.what:
            return self.what
        if self.part is None:
            return f"the batch of {len(self.rows)} rows"
        return f"rows {self.part[0]}-{self.part[1] - 1} of a batch"

    def worker_died(self, pid: int | None, how: str, exitcode: int | None) -> WorkerCrashed:
        """The error for the batch whose worker died on it (now :attr:`crashed`)."""
        self.crashed = True
        return WorkerCrashed(
            f"worker pid {pid} died with {how} while it worked on {self.describe()}; likely "
            f"causes: a segfault or abort in the row function (or a library it calls), or "
            f"the OS killed the worker for memory (see dmesg). A new worker takes its place",
            pid=pid,
            exitcode=exitcode,
            rows=self.part or (0, len(self.rows) if self.rows is not None else 0),
        )

    def timed_out(self, what_now: str) -> BatchTimeout:
        return BatchTimeout(
            f"{self.describe()} did not finish within timeout={self.limit} s; {what_now}"
        )


def value_of(reply: Outcome, fn: Any) -> tuple[Any, BaseException | None]:
    """A worker's outcome (``_worker.run_chunk``'s, a call's, or a load error) as a value
    or an error."""
    if isinstance(reply, Returned):  # a call unit's return value, as it is
        return reply.value, None
    if isinstance(reply, (Loaded, Done)):  # the function is there; rows written in place
        return (None, {}), None
    if isinstance(reply, Chunk):
        errors: dict[int, BaseException] = {}
        for failure in reply.failed:
            err = _worker.error_from_reply(failure)
            assert isinstance(err, RowError)
            errors[err.row] = err
        return (reply.output, errors), None
    name, text, tb, blob = reply.name, reply.text, reply.tb, reply.blob
    if reply.kind == CALL_ERROR:
        err = _worker.rebuild(blob, name, text, tb)
        if not reply.had_cause and isinstance(err, PrepError):
            err.__cause__ = None  # prep's whole verdict (a ShardError): no traceback to add
        return None, err
    if reply.kind == LOAD_ERROR:
        err = FunctionLoadError(
            f"prep's worker processes could not load the row function {describe_fn(fn)} "
            f"({name}: {text}). Workers start from a fresh interpreter and never run your "
            f"main script, so what the function needs by name (its module, the modules it "
            f"imports) must be importable there: install it, or keep it on sys.path; or "
            f"use executor='threads'"
        )
        err.__cause__ = _worker.rebuild(blob, name, text, tb)
        return None, err
    return None, _worker.error_from_reply(reply)
