"""A unit of work handed to a worker, and its ticket: the ``concurrent.futures`` shape
of the batches, parts and shards in flight (:mod:`prep.executors._batches` for processes,
:mod:`prep.executors._batch_threads` for threads)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.output import Output
from ..core.policy import Policy
from ..core.rows import Rows
from ..errors import BatchTimeout, FunctionLoadError, RowError, WorkerCrashed
from . import _worker
from ._messages import CALL_ERROR, LOAD_ERROR, Chunk, Done, Loaded, Outcome, Returned
from ._transport import describe_fn

__all__ = [
    "Call",
    "Load",
    "Part",
    "Ticket",
    "Unit",
    "Value",
    "Whole",
    "abandon",
    "value_of",
    "wait_any",
]

Value = tuple[Output | None, dict[int, BaseException]]


@dataclass(frozen=True)
class Whole:
    """A whole batch for one worker to build with the function it knows as ``key``; its
    value is the output and the failed rows' errors (a stream's whole strategy)."""

    key: Any
    rows: Rows
    policy: Policy
    timeout: float | None


@dataclass(frozen=True)
class Part:
    """Rows ``bounds`` of a batch (batch row numbers; ``rows``: the batch's), replied as
    a chunk or written into ``into`` (the batch's output); ``timeout``: what is left of
    the batch's, ``limit``: the batch's as the caller gave it (for messages)."""

    key: Any
    rows: Rows
    policy: Policy
    timeout: float | None
    bounds: tuple[int, int]
    into: Output | None = None
    limit: float | None = None


@dataclass(frozen=True)
class Call:
    """The function known as ``key`` called once on ``args`` by a worker, which does all of
    the unit's work (``prep run``'s shard); ``what`` names it for errors ("the shard
    data/a.pt"). Its value is what the function returned, its error what it raised."""

    key: Any
    args: tuple[Any, ...]
    what: str
    timeout: float | None = None


@dataclass(frozen=True)
class Load:
    """A worker loads the function known as ``key`` (if it has not) and says so, so that a
    function the workers cannot load fails before any row runs."""

    key: Any
    timeout: float | None
    what: str = "loading the row function"


#: what an engine takes: ``submit(unit) -> Ticket``
Unit = Whole | Part | Call | Load
#: an engine's wait: until the ticket is done or the seconds have passed (True if done);
#: given no ticket, until any of its units is done
Pump = Callable[["Ticket | None", "float | None"], bool]


class Ticket:
    """One unit handed to a worker (the ``concurrent.futures`` future of it): :meth:`wait`
    for it, then :meth:`result`. ``pump`` and ``drop`` are its engine's: how to wait for
    it, and what to do with units nobody will wait for."""

    def __init__(self, unit: Unit, pump: Pump, drop: Callable[[list[Ticket]], None]) -> None:
        self.unit = unit
        self.rows: Rows | None = None  # the rows it builds (a part's window), if any
        if isinstance(unit, Whole):
            self.rows = unit.rows
        elif isinstance(unit, Part):
            start, stop = unit.bounds
            whole = (start, stop) == (0, len(unit.rows))
            self.rows = unit.rows if whole else unit.rows.window(start, stop)
        self._pump, self._drop = pump, drop
        self.started: float | None = None  # when its worker could start it
        self.busy: float | None = None  # seconds its worker took
        # when its worker began and ended it, by time.monotonic (where not started..busy)
        self.span: tuple[float, float] | None = None
        self.transfer = 0.0  # seconds the parent took to receive it (unpickling, mapping)
        self.crashed = False  # its worker died on it (the caller may isolate its rows)
        self.cancelled = False
        self.lane: Any = None  # the worker that holds it (processes)
        self.seq = -1  # its number on that worker's pipe (processes)
        self.wire: Rows | None = None  # its rows as sent (in the ring's memory), if not rows
        self.reply: Outcome | None = None  # its worker's outcome as it came
        self.on_settled: Any = None  # called once when it is settled (gives the ring back)
        # the caller's autograd modes (grad, inference) when it submitted: a thread builds
        # under them, as serial would in the caller's own thread
        self.grad, self.inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        self._done = threading.Event()
        self._value: Value | None = None
        self._error: BaseException | None = None

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
        """Whether the unit is done, after waiting up to ``timeout`` seconds for it."""
        return self.done() or self._pump(self, timeout)

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
        if self.unit.timeout is None or self.started is None:
            return None
        return self.unit.timeout - (now - self.started)

    def bounds(self) -> tuple[int, int]:
        """The rows it holds, in batch row numbers."""
        if isinstance(self.unit, Part):
            return self.unit.bounds
        return (0, len(self.rows or ()))

    def describe(self) -> str:
        """What it holds, for an error: "the batch of 64 rows", or "rows 32-63 of a batch"."""
        unit = self.unit
        if isinstance(unit, (Call, Load)):
            return unit.what
        start, stop = self.bounds()
        if isinstance(unit, Whole) or (start, stop) == (0, len(unit.rows)):
            return f"the batch of {stop - start} rows"
        return f"rows {start}-{stop - 1} of a batch"

    def worker_died(self, pid: int | None, how: str, exitcode: int | None) -> WorkerCrashed:
        """The error for the batch whose worker died on it (now :attr:`crashed`)."""
        self.crashed = True
        return WorkerCrashed(
            f"worker pid {pid} died with {how} while it worked on {self.describe()}; likely "
            f"causes: a segfault or abort in the row function (or a library it calls), or "
            f"the OS killed the worker for memory (see dmesg). A new worker takes its place",
            pid=pid,
            exitcode=exitcode,
            rows=self.bounds(),
        )

    def timed_out(self, what_now: str) -> BatchTimeout:
        unit = self.unit
        limit = unit.limit if isinstance(unit, Part) and unit.limit is not None else unit.timeout
        return BatchTimeout(
            f"{self.describe()} did not finish within timeout={limit} s; {what_now}"
        )


def abandon(tickets: list[Ticket]) -> None:
    """Nobody will wait for ``tickets`` (Ctrl-C in the caller): each is cancelled, and its
    engine frees the workers that hold one unfinished."""
    if tickets:
        tickets[0]._drop(tickets)


def wait_any(tickets: list[Ticket], timeout: float | None) -> None:
    """Wait up to ``timeout`` seconds for any of ``tickets`` (of one engine) to be done."""
    if tickets:
        tickets[0]._pump(None, timeout)


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
    if reply.kind == CALL_ERROR:
        return None, _worker.call_error(reply)
    if reply.kind != LOAD_ERROR:
        return None, _worker.error_from_reply(reply)
    err = FunctionLoadError(
        f"prep's worker processes could not load the row function {describe_fn(fn)} "
        f"({reply.name}: {reply.text}). Workers start from a fresh interpreter and never run "
        f"your main script, so what the function needs by name (its module, the modules it "
        f"imports) must be importable there: install it, or keep it on sys.path; or "
        f"use executor='threads'"
    )
    err.__cause__ = _worker.rebuild(reply.blob, reply.name, reply.text, reply.tb)
    return None, err
