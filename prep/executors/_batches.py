"""Whole batches, one per worker, several in flight: the DataLoader's shape.

A stream gives each worker whole batches instead of splitting every batch
across all of them, so that no batch ends at a barrier: a worker that finishes
its batch starts the next one at once. :meth:`submit` returns a
:class:`Ticket` (the ``concurrent.futures`` shape); results are taken in the
order the caller chooses, a ticket at a time.

    parent (the stream's producer thread)              worker k (prep's forkserver)
    ─────────────────────────────────────              ────────────────────────────
    submit: Function(key, blob) once per worker ─────▶ loads it, keeps a few
            Build(seq, key, rows, policy, into) ─────▶ queue, FIFO per worker
    pump(ticket): wait(conn + sentinel, deadline) ◀── Reply(seq, t0, t1, outcome)
                  replies resolve their tickets     (output: shared memory, its fds
                  in each worker's order                in the same message, _fdpipe)

A worker holds the tickets it was sent, oldest first; its replies come back in
that order, so each reply resolves the worker's oldest ticket, whoever waits.
A cancelled ticket's reply is read (its shared memory released) and dropped.
A worker that dies fails the batch it held (:class:`~prep.WorkerCrashed`, or
``crashed`` for the caller to run that batch row by row under
``on_error='fill'``/``'skip'``); one past its batch's deadline is killed
(:class:`~prep.BatchTimeout`). Either way its other batches go to a fresh
worker in its place, so a failure in one batch never touches another.
The deadline of a batch counts from when its worker could start it: when the
batch was sent to an idle worker, else when its worker's previous reply was read.

A stream's split batches use the same workers (``Part`` units): one part
of each batch per worker, each part a ticket of its own, so a worker that
finishes its part of batch k starts its part of batch k+1 at once.

A batch's tensors travel in shared memory taken from a small ring (:class:`_Ring`)
and given back once the batch is settled, whatever became of it: a new segment
costs the first touch of its pages in both processes (about 0.5 ms a megabyte
here), a reused one a copy. Tensors already in shared memory travel as they are.
"""

from __future__ import annotations

import itertools
import time
from multiprocessing import connection
from typing import Any, overload

from . import _fdpipe, _spawn
from ._base import PROCESS_THREADS
from ._lanes import Functions, Lane, Lanes, check_on_cpu
from ._ring import Ring
from ._shapes import Known
from ._ticket import Part, Ticket, Unit, Whole, value_of

__all__ = ["ProcessBatches", "starts_at_once"]


class ProcessBatches:
    """Worker processes that each build whole batches, parts of batches or whole units
    (see the module docstring): ``submit(unit) -> Ticket``."""

    name = "processes"

    def __init__(self, workers: int, *, fork: bool = False) -> None:
        """``workers`` processes, each on one torch thread (``PROCESS_THREADS``); ``fork``:
        forked from here now, while that is safe (:func:`_spawn.fork_is_safe`: a
        process with no other thread), else started on first use from prep's
        forkserver."""
        self.workers = workers
        self._fns = Functions()
        self._lanes = Lanes(workers, PROCESS_THREADS, fork, self._fns)
        self._ring = Ring(keep=4 * workers)
        if fork and _spawn.fork_is_safe():
            with self._lanes.lock:
                self._lanes.ensure_started()

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids (none before the first unit, or after close)."""
        lanes = self._lanes.all
        return [pid for x in lanes if (pid := x.worker.proc.pid) and x.worker.proc.is_alive()]

    def prepare(self, fn: Any) -> Known:
        """The record of ``fn`` here: the key its units name it by, what was learned of it
        (``_shapes.Known``)."""
        with self._lanes.lock:
            return self._fns.add(fn)

    @overload
    def submit(self, units: Unit) -> Ticket: ...
    @overload
    def submit(self, units: list[Unit]) -> list[Ticket]: ...

    def submit(self, units: Unit | list[Unit]) -> Ticket | list[Ticket]:
        """A ticket for the unit, or for each of a list of them, dealt to the workers in
        turn, the freest first (:meth:`Lane.load`): a worker then has one part of a batch,
        one load each, and a unit alone goes to the worker likely to be free first. The
        parts of one batch (``Part`` units sharing ``rows``) send its tensors once, in
        one loan from the ring."""
        listed: list[Unit] = units if isinstance(units, list) else [units]
        tickets = [Ticket(unit, self._pump, self._lanes.abandon) for unit in listed]
        rows = [t.unit.rows for t in tickets if isinstance(t.unit, (Whole, Part))]
        if rows:
            assert all(r is rows[0] for r in rows), "the rows units of one submit are one batch's"
            check_on_cpu(rows[0])
            wire, loan = self._ring.loan(rows[0], len(rows))
            for ticket in tickets:
                ticket.wire = wire if ticket.rows is rows[0] else wire.window(*ticket.bounds())
                ticket.on_settled = loan and loan.settled
        with self._lanes.lock:
            lanes = self._lanes.ensure_started()
            self._read_ready(lanes)  # a unit done is no work in hand
            order = sorted(lanes, key=Lane.load)
            for lane, ticket in zip(itertools.cycle(order), tickets):
                self._lanes.send(lane, ticket)
        return tickets if isinstance(units, list) else tickets[0]

    def release(self) -> bool:
        """:meth:`close` if workers are up and none holds a unit; True if it did."""
        with self._lanes.lock:
            if idle := bool(self._lanes.all) and self._lanes.idle():
                self.close()
        return idle

    def close(self, now: bool = False) -> None:
        """Stop every worker (:meth:`Lanes.close`); safe to call several times."""
        self._lanes.close(now)
        self._ring.clear()

    # ------------------------------------------------------------ waiting

    def _read_ready(self, lanes: list[Lane]) -> None:
        """Read the replies waiting from ``lanes`` (never waits)."""
        for lane in lanes:
            while lane.tickets and lane.worker.conn.poll():
                if not self._read_one(lane):
                    break

    def _read_one(self, lane: Lane) -> bool:
        """Read one reply from the lane's worker and resolve its ticket with it (how long
        the worker took, and this process to receive it); False if the worker is lost
        instead."""
        t = time.perf_counter()
        try:
            msg = _fdpipe.recv(lane.worker.conn)
        except (EOFError, OSError, RuntimeError):  # RuntimeError: fds cut short
            self._lanes.lost(lane)
            return False
        ticket = lane.answered(msg.seq)
        ticket.transfer = time.perf_counter() - t
        if ticket.cancelled:  # read, so its shared memory is released; nobody wants it
            ticket.settle()
            return True
        t0, t1, ticket.reply = msg.started, msg.ended, msg.outcome
        ticket.busy, ticket.span = (t1 - t0, (t0, t1)) if t1 else (None, None)
        ticket.resolve(*value_of(msg.outcome, self._fns.fn(ticket.unit.key)))
        return True

    def _pump(self, ticket: Ticket | None, timeout: float | None) -> bool:
        """Read replies until ``ticket`` is done or ``timeout`` seconds have passed (no
        ticket: every worker's, until one is done, :meth:`_pump_any`)."""
        if ticket is None:
            self._pump_any(timeout)
            return True
        end = None if timeout is None else time.monotonic() + timeout
        with self._lanes.lock:
            while not ticket.done():
                lane: Lane = ticket.lane
                now = time.monotonic()
                head = lane.tickets[0] if lane.tickets else None
                left = head.left(now) if head is not None else None
                if left is not None and left <= 0:
                    self._lanes.timed_out(lane)
                    continue
                waits = [x for x in (left, None if end is None else end - now) if x is not None]
                wait = max(0.0, min(waits)) if waits else None
                came = lane.worker.wait(wait)
                if came == "reply":
                    self._read_one(lane)
                elif came == "ended":
                    self._lanes.lost(lane)
                elif end is not None and time.monotonic() >= end:
                    return False
            return True

    def _pump_any(self, timeout: float | None) -> None:
        """Read every worker's replies, waiting up to ``timeout`` s for the first (``prep
        run`` takes each shard as it lands); the wait holds no lock."""
        with self._lanes.lock:
            busy = {lane.worker.conn: lane for lane in self._lanes.all if lane.tickets}
            ends = {lane.worker.proc.sentinel: lane for lane in busy.values()}
        if not busy:
            return
        try:
            ready = connection.wait([*busy, *ends], timeout)
        except (OSError, ValueError):  # a lane replaced meanwhile: its pipe is closed
            return
        with self._lanes.lock:
            # replies first: a worker that answered and then died has its answer read
            for end in sorted(ready, key=lambda r: r in ends):
                lane = busy.get(end) or ends[end]
                if lane not in self._lanes.all or lane.worker.proc.sentinel not in ends:
                    continue  # replaced (and its tickets dealt with) since the snapshot
                if end not in ends:
                    self._read_ready([lane])
                elif not lane.worker.conn.poll():
                    self._lanes.lost(lane)

    def __repr__(self) -> str:
        return f"<ProcessBatches workers={self.workers}>"


def starts_at_once(engine: Any) -> bool:
    """Whether ``engine``'s workers take a unit without waiting: threads do, worker
    processes once up or once prep's forkserver is (which this starts otherwise)."""
    if not isinstance(engine, ProcessBatches) or engine.pids:
        return True
    if _spawn.server_running() and _spawn.start_costs().worker is not None:
        return True
    _spawn.warm_up()
    return False
