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

import queue
import threading
import time
from typing import Any

from ..core.output import Output
from ..core.policy import Policy
from ..core.rows import Rows
from ._base import threads_per_worker
from ._daemons import DaemonThreads, own_intra_op_threads
from ._job import Job
from ._messages import Chunk, Done, Failure
from ._shapes import Shapes
from ._ticket import Ticket, value_of
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
    """The whole batch, serially, in this thread; its value or error into the ticket."""
    ticket.started = time.monotonic()
    if ticket.kind == "part":
        _build_part(ticket)
        return
    job = Job.new(ticket.fn, ticket.rows, timeout=ticket.timeout, policy=ticket.policy)
    try:
        with ticket.modes():  # the caller's grad and inference modes
            job.run_range(0, len(ticket.rows))
    except BaseException as exc:  # raised where the stream takes the result
        ticket.resolve(error=exc)
        return
    ticket.busy = time.monotonic() - ticket.started
    ticket.resolve((job.sink.output, dict(job.sink.failures.errors)))


def _build_part(ticket: Ticket) -> None:
    """A part of a batch, replied as a worker process replies (``Ticket.reply``): its
    rows as a chunk of the batch, or written into the batch's output (``into``)."""
    assert ticket.started is not None
    start, stop = ticket.bounds()
    with ticket.modes():  # the caller's grad and inference modes
        reply: Done | Chunk | Failure
        if ticket.into is not None:
            reply = write_rows(ticket.fn, ticket.rows, ticket.into, start, stop, live=True)
        else:
            policy = ticket.policy
            reply = run_chunk(ticket.fn, ticket.rows, start, stop, policy=policy, live=True)
    ended = time.monotonic()
    ticket.busy, ticket.span, ticket.reply = ended - ticket.started, (ticket.started, ended), reply
    ticket.resolve(*value_of(reply, ticket.fn))


class ThreadBatches(DaemonThreads[Ticket]):
    """Threads that each build whole batches, taken from one queue in order."""

    name = "threads"
    other_processes = False

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._made = 0
        self.shapes = Shapes()  # each function's last output shape (``_shapes``)

    def _ensure_started(self) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive() and not t.retired]
            new = []
            while len(self._threads) < self.workers:
                self._made += 1
                t = _Thread(
                    self._tasks, threads_per_worker(self.workers), f"prep-thread-{self._made}"
                )
                t.start()
                self._threads.append(t)
                new.append(t)
        # each new thread lowers torch's process-wide default for a moment while it takes
        # its own share of threads: none may still be at it once a batch returns
        for t in new:
            t.ready.wait()

    def ready(self) -> bool:
        return True  # threads start at once

    def prepare(self, fn: Any) -> Any:
        return fn  # threads share the function itself

    def submit(self, key: Any, rows: Rows, policy: Policy, timeout: float | None) -> Ticket:
        ticket = Ticket(self, rows, policy, timeout)
        ticket.fn = key
        self._ensure_started()
        self._tasks.put(ticket)
        return ticket

    def submit_parts(
        self,
        key: Any,
        rows: Rows,
        policy: Policy,
        timeout: float | None,
        bounds: list[tuple[int, int]],
        into: Output | None = None,
    ) -> list[Ticket]:
        """Rows ``bounds`` of the batch, a ticket each, on the one queue: a thread that
        finishes its part takes the next one at once, of this batch or the next (no
        barrier). Each is built as a worker process builds a part
        (``ProcessBatches.submit_parts``)."""
        tickets = [Ticket.part_of(self, key, rows, rows, b, policy, timeout) for b in bounds]
        self._ensure_started()
        for ticket in tickets:
            ticket.fn, ticket.into = key, into
            self._tasks.put(ticket)
        return tickets

    def abandon(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:  # those not started are dropped; one that runs finishes alone
            ticket.cancel()

    def pump(self, ticket: Ticket, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            left = ticket.left(now)
            if left is not None and left <= 0 and not ticket.done():
                self._abandon(ticket)
                return True
            waits = [x for x in (left, None if end is None else end - now) if x is not None]
            if ticket.timeout is not None and left is None:
                waits.append(POLL)  # not started yet: look again at its deadline soon
            if ticket.settled(max(0.0, min(waits)) if waits else None):
                return True
            if end is not None and time.monotonic() >= end:
                return False

    def _abandon(self, ticket: Ticket) -> None:
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
