"""Whole batches on threads: each thread builds one batch at a time, serially.

The thread flavour of :mod:`._batches`: no transport (the output is made where
it is used), so it pays where the row function releases the GIL (image
decoding, most torch ops) and its batches are too short for the split
strategy's barrier. Pure-Python rows gain nothing over ``serial`` here.

A thread cannot be killed: on a batch's deadline the ticket fails with
:class:`~prep.BatchTimeout`, and a fresh thread takes the stuck one's place
(the stuck one retires when its row returns, if it ever does).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, overload

from .._kept import keep_newest
from ._base import threads_per_worker
from ._daemons import own_intra_op_threads
from ._job import Job
from ._messages import Outcome
from ._shapes import FUNCTIONS, Known
from ._ticket import Part, Ticket, Unit, Whole, value_of
from ._worker import run_chunk, write_rows

__all__ = ["ThreadBatches"]

#: seconds between a waiting caller's looks at the deadline of a batch not yet started
POLL = 0.1


class _Thread(threading.Thread):
    def __init__(self, tasks: queue.SimpleQueue[Ticket | None], intra: int, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.tasks, self.intra = tasks, intra
        self.retired = False  # replaced after a timeout: stop after the current batch
        self.current: Ticket | None = None
        self.ready = threading.Event()  # set once it has taken its share of threads

    def run(self) -> None:
        try:
            own_intra_op_threads(self.intra)
        finally:
            self.ready.set()
        while not self.retired and (ticket := self.tasks.get()) is not None:
            if not ticket.cancelled:
                self.current = ticket
                _build(ticket)
                self.current = None
            del ticket  # hold no batch between batches


def _build(ticket: Ticket) -> None:
    """The unit's rows, serially, in this thread, under the caller's grad and inference
    modes; its value or error into the ticket. A whole batch's value is its output and
    failed rows; a part replies as a worker process replies (``Ticket.reply``): its rows
    as a chunk of the batch, or written into the batch's output (``into``)."""
    started = ticket.started = time.monotonic()
    unit, rows = ticket.unit, ticket.rows
    assert isinstance(unit, (Whole, Part)) and rows is not None, "threads build rows"
    with ticket.modes():
        if isinstance(unit, Whole):
            job = Job.new(unit.key, rows, timeout=unit.timeout, policy=unit.policy)
            try:
                job.run_range(0, len(rows))
            except BaseException as exc:  # raised where the stream takes the result
                ticket.resolve(error=exc)
                return
            ticket.busy = time.monotonic() - started
            ticket.resolve((job.sink.output, dict(job.sink.failures.errors)))
            return
        reply: Outcome
        if unit.into is not None:
            reply = write_rows(unit.key, rows, unit.into, *unit.bounds, live=True)
        else:
            reply = run_chunk(unit.key, rows, *unit.bounds, policy=unit.policy, live=True)
    ended = time.monotonic()
    ticket.busy, ticket.span, ticket.reply = ended - started, (started, ended), reply
    ticket.resolve(*value_of(reply, unit.key))


class ThreadBatches:
    """Threads that each build whole batches or parts of batches, taken from one queue
    in order: ``submit(unit) -> Ticket``. Each is a daemon, so a stuck one never
    blocks interpreter exit."""

    name = "threads"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._tasks: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()  # None: stop
        self._threads: list[_Thread] = []
        self._lock = threading.Lock()
        self._names = (f"prep-thread-{i}" for i in itertools.count(1))
        #: each function's record (``_shapes.Known``), by its id (the function held here)
        self._known: dict[int, tuple[Any, Known]] = {}

    def _ensure_started(self) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive() and not t.retired]
            intra, missing = threads_per_worker(self.workers), self.workers - len(self._threads)
            new = [_Thread(self._tasks, intra, next(self._names)) for _ in range(missing)]
            for t in new:
                t.start()
            self._threads += new
        # each new thread lowers torch's process-wide default for a moment while it takes
        # its own share of threads: none may still be at it once a batch returns
        for t in new:
            t.ready.wait()

    def prepare(self, fn: Any) -> Known:
        """The record of ``fn`` here; threads share the function itself (its key)."""
        held = self._known.get(id(fn))
        if held is not None and held[0] is fn:
            return held[1]
        known = Known(fn, shared=False)
        keep_newest(self._known, id(fn), (fn, known), FUNCTIONS)
        return known

    @overload
    def submit(self, units: Unit) -> Ticket: ...
    @overload
    def submit(self, units: list[Unit]) -> list[Ticket]: ...

    def submit(self, units: Unit | list[Unit]) -> Ticket | list[Ticket]:
        """A ticket for each unit (a ``Whole`` batch or a ``Part``), on the one queue: a
        thread that finishes one takes the next at once, of this batch or the next (no
        barrier). A part is built as a worker process builds one."""
        listed: list[Unit] = units if isinstance(units, list) else [units]
        if not all(isinstance(unit, (Whole, Part)) for unit in listed):
            raise TypeError("threads build rows: submit Whole or Part units")
        tickets = [Ticket(unit, self._pump, self._abandon) for unit in listed]
        self._ensure_started()
        for ticket in tickets:
            self._tasks.put(ticket)
        return tickets if isinstance(units, list) else tickets[0]

    def close(self) -> None:
        """Ask every thread to stop once its batch is done; wait a little for each."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._tasks.put(None)
        for t in threads:
            t.join(timeout=5)

    def _abandon(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:  # those not started are dropped; one that runs finishes alone
            ticket.cancel()

    def _pump(self, ticket: Ticket | None, timeout: float | None) -> bool:
        assert ticket is not None, "a thread's ticket is waited for itself"
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            left = ticket.left(now)
            if left is not None and left <= 0 and not ticket.done():
                self._give_up(ticket)
                return True
            waits = [x for x in (left, None if end is None else end - now) if x is not None]
            if ticket.unit.timeout is not None and left is None:
                waits.append(POLL)  # not started yet: look again at its deadline soon
            if ticket.settled(max(0.0, min(waits)) if waits else None):
                return True
            if end is not None and time.monotonic() >= end:
                return False

    def _give_up(self, ticket: Ticket) -> None:
        """The batch is past its deadline: its thread retires, a fresh one serves."""
        with self._lock:
            for t in self._threads:
                if t.current is ticket:
                    t.retired = True
        ticket.cancel()
        ticket.resolve(
            error=ticket.timed_out(
                "threads cannot be killed, so the stuck one was abandoned and a new one started"
            )
        )
        self._ensure_started()

    def __repr__(self) -> str:
        return f"<ThreadBatches workers={self.workers}>"
