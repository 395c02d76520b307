"""Whole batches, one per worker, several in flight: the DataLoader's shape.

A stream gives each worker whole batches instead of splitting every batch
across all of them, so that no batch ends at a barrier: a worker that finishes
its batch starts the next one at once. :meth:`submit` returns a
:class:`Ticket` (the ``concurrent.futures`` shape); results are taken in the
order the caller chooses, a ticket at a time.

    parent (the stream's producer thread)              worker k (prep's forkserver)
    ─────────────────────────────────────              ────────────────────────────
    submit: ("fn", key, blob) once per worker ───────▶ loads it, keeps a few
            ("whole", seq, key, rows, policy) ───────▶ queue, FIFO per worker
    pump(ticket): wait(conn + sentinel, deadline) ◀── ("whole", seq, t0, t1, reply)
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

A stream's split batches use the same workers (:meth:`submit_parts`): one part
of each batch per worker, each part a ticket of its own, so a worker that
finishes its part of batch k starts its part of batch k+1 at once.

A batch's tensors travel in shared memory taken from a small ring (:class:`_Ring`)
and given back once the batch is settled, whatever became of it: a new segment
costs the first touch of its pages in both processes (about 0.5 ms a megabyte
here), a reused one a copy. Tensors already in shared memory travel as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from .._output import Output
from .._policy import Policy
from .._rows import Rows
from ..errors import ConfigError, WorkerCrashed
from . import _batch_worker, _fdpipe, _spawn
from ._base import threads_per_worker
from ._handles import Worker
from ._ring import Ring
from ._ticket import Ticket, value_of
from ._transport import pickle_fn

__all__ = ["ProcessBatches"]


def _check_on_cpu(rows: Rows) -> None:
    for c in getattr(rows, "columns", ()):
        if c.device.type != "cpu":
            raise ConfigError(
                f"executor='processes' got a tensor on {c.device}; workers never touch "
                f"CUDA, so pass CPU tensors (and device= for the result), or use "
                f"executor='threads' or 'vectorized' for a batch already on the GPU"
            )


class _Lane:
    """One worker process and the tickets sent to it, oldest first."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tickets: deque[Ticket] = deque()
        # the row functions it holds, oldest first: it keeps the last KEEP, as this does
        self.keys: dict[str, None] = {}

    def replace(self, worker: Worker) -> list[Ticket]:
        """``worker`` in the old one's place; the tickets the old one held, oldest first."""
        self.worker.stop()
        tickets, self.tickets, self.keys = list(self.tickets), deque(), {}
        self.worker = worker
        return tickets

    def send(self, ticket: Ticket, seq: int, blob: Callable[[str], bytes]) -> None:
        """``ticket`` to this lane's worker, numbered ``seq``, its function first (its
        pickled bytes, ``blob(key)``) if the worker has not had it."""
        key, conn = ticket.key, self.worker.conn
        if key not in self.keys:
            _fdpipe.send(conn, ("fn", key, blob(key)))
            self.keys[key] = None
            while len(self.keys) > _batch_worker.KEEP:  # the worker forgets its oldest
                del self.keys[next(iter(self.keys))]
        ticket.lane, ticket.seq = self, seq
        if ticket.kind == "call":
            _fdpipe.send(conn, ("call", seq, key, ticket.args))
        elif ticket.kind == "load":
            _fdpipe.send(conn, ("load", seq, key))
        else:
            rows = ticket.wire if ticket.wire is not None else ticket.rows
            _fdpipe.send(conn, ("whole", seq, key, rows, ticket.policy, ticket.into))
        if not self.tickets:
            ticket.started = time.monotonic()
        self.tickets.append(ticket)

    def answered(self, seq: int) -> Ticket:
        """The ticket whose reply numbered ``seq`` came: its oldest (its worker answers in
        order); the next one's worker starts it now."""
        ticket = self.tickets.popleft()
        assert ticket.seq == seq, "a worker answers its batches in order"
        if self.tickets:
            self.tickets[0].started = time.monotonic()
        return ticket

    def load(self) -> tuple[int, float]:
        """How busy it is: the batches in hand, then when its current one began (the
        earlier, the likelier it is free first)."""
        return (len(self.tickets), (self.tickets[0].started or 0.0) if self.tickets else 0.0)

    @staticmethod
    def freest(lanes: list[_Lane]) -> _Lane:
        """The lane likely to be free first (:meth:`load`)."""
        return min(lanes, key=_Lane.load)


#: row functions the parent keeps pickled, the latest used (a worker keeps fewer, and is
#: sent one again when it needs it: a stream's function must not go while it runs)
FUNCTIONS = 64


class _Functions:
    """The row functions the workers are sent, pickled once each, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[Any, bytes]] = {}

    def add(self, fn: Any) -> str:
        """The key under which ``fn`` travels (pickled here, once: a stream's batches
        all use the function as it was when the stream began)."""
        blob = pickle_fn(fn)
        key = hashlib.sha1(blob).hexdigest()
        self._by_key[key] = (fn, blob)
        self._by_key[key] = self._by_key.pop(key)  # the newest last
        while len(self._by_key) > FUNCTIONS:
            del self._by_key[next(iter(self._by_key))]
        return key

    def blob(self, key: str) -> bytes:
        return self._by_key[key][1]

    def fn(self, key: str) -> Any:
        """The function itself (None once forgotten): for the errors about it."""
        return self._by_key.get(key, (None, b""))[0]


class ProcessBatches:
    """Worker processes that each build whole batches (see the module docstring)."""

    name = "processes"

    def __init__(self, workers: int, *, fork: bool = False) -> None:
        """``workers`` processes, each with the cores shared out as torch's intra-op
        threads. ``fork``: start them by forking this process while that is
        safe (:func:`_spawn.fork_is_safe`), so that they hold what it has imported and
        start in milliseconds; else, and for any worker started later when it is not,
        from prep's forkserver."""
        self.workers = workers
        self.threads = threads_per_worker(workers)
        self._fork = fork
        self._closed = False  # close() ran: a worker lost now is not replaced
        self._lanes: list[_Lane] = []
        self._lock = threading.RLock()  # the lanes and their pipes: one reader at a time
        self._seq = itertools.count()
        self._fns = _Functions()
        self._ring = Ring(keep=4 * workers)

    # ------------------------------------------------------------ lifecycle

    def _new_worker(self) -> Worker:
        if self._fork and _spawn.fork_is_safe():
            ctx = _spawn.fork_context()
        else:
            _spawn.ensure_server()
            ctx = _spawn.context()
        return Worker(ctx, self.threads)

    def start(self) -> None:
        """Start every worker now (else the first submit does)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        self._closed = False  # a submit after close() starts the pool afresh
        if len(self._lanes) < self.workers:
            while len(self._lanes) < self.workers:
                self._lanes.append(_Lane(self._new_worker()))
        for lane in self._lanes:
            if not lane.worker.proc.is_alive():  # died while idle (killed, OOM)
                self._lost(lane)

    @property
    def pids(self) -> list[int]:
        return [lane.worker.proc.pid for lane in self._lanes if lane.worker.proc.pid]

    @property
    def started(self) -> bool:
        """Whether every worker is up (started, not necessarily ready)."""
        lanes = self._lanes
        return len(lanes) == self.workers and all(x.worker.proc.is_alive() for x in lanes)

    def close(self, now: bool = False) -> None:
        """Stop every worker (asked first, terminated if it does not listen; ``now``:
        terminated at once, mid-unit); their tickets fail. It is safe to call this
        several times."""
        self._closed = True  # another thread's wait that sees a worker end replaces none
        polite = self._lock.acquire(timeout=1.0)
        try:
            lanes, self._lanes = self._lanes, []
            for lane in lanes if not now else ():
                with contextlib.suppress(OSError):
                    _fdpipe.send(lane.worker.conn, ("close",))
            for lane in lanes:
                if not now:
                    lane.worker.proc.join(1)
                lane.worker.stop()
                for t in lane.tickets:
                    t.resolve(error=WorkerCrashed("the pool was closed with this batch in flight"))
            self._ring.clear()
        finally:
            if polite:
                self._lock.release()

    def ready(self) -> bool:
        """Whether workers start without waiting for prep's forkserver (it imports torch,
        once per interpreter: seconds); if not, it is started in the background."""
        if self._lanes or (_spawn.server_running() and _spawn.start_costs().worker is not None):
            return True
        _spawn.warm_up()
        return False

    # ------------------------------------------------------------ submitting

    def prepare(self, fn: Any) -> str:
        """The key under which ``fn`` travels (:meth:`_Functions.add`)."""
        with self._lock:
            return self._fns.add(fn)

    def submit(self, key: str, rows: Rows, policy: Policy, timeout: float | None) -> Ticket:
        """Send the batch to the worker likely to be free first (:meth:`_Lane.freest`)."""
        _check_on_cpu(rows)
        ticket = Ticket(self, rows, policy, timeout)
        ticket.key = key  # resent with it after a crash
        ticket.wire, loan = self._ring.loan(rows, 1)
        ticket.on_settled = loan and loan.settled
        with self._lock:
            self._ensure_started()
            self._read_ready()
            self._send(_Lane.freest(self._lanes), ticket)
        return ticket

    def submit_parts(
        self,
        key: str,
        rows: Rows,
        policy: Policy,
        timeout: float | None,
        bounds: list[tuple[int, int]],
        into: Output | None = None,
    ) -> list[Ticket]:
        """Rows ``bounds`` of the batch (ranges in batch row numbers, ``split``'s), a ticket
        each, dealt to the workers in turn, the first to the freest: a worker takes its
        tickets in order, so one that finishes its part of this batch starts its part of
        the next at once, no barrier. Each replies with its rows as a chunk of the batch
        (``Ticket.reply``, in batch row numbers), or, given ``into`` (the batch's output,
        shared), writes them there and replies "done". The tensors travel once, in one
        loan from the ring; each part has the batch's ``timeout``."""
        _check_on_cpu(rows)
        wire, loan = self._ring.loan(rows, len(bounds))
        tickets = [Ticket.part_of(self, key, rows, wire, b, policy, timeout) for b in bounds]
        for ticket in tickets:
            ticket.into, ticket.on_settled = into, loan and loan.settled
        with self._lock:
            self._ensure_started()
            self._read_ready()
            # parts dealt in turn, the first to the freest: every worker has one part of
            # each batch, so none runs out of work while another holds two of them
            lanes = sorted(self._lanes, key=_Lane.load)
            for lane, ticket in zip(itertools.cycle(lanes), tickets):
                self._send(lane, ticket)
        return tickets

    def load(self, key: str, timeout: float) -> list[Ticket]:
        """Every worker loads the function under ``key`` (:meth:`prepare`): a ticket each,
        done once it holds it (its error: why it could not load it)."""
        with self._lock:
            self._ensure_started()
            tickets = []
            for lane in self._lanes:
                ticket = Ticket.load(self, key, timeout)
                self._send(lane, ticket)
                tickets.append(ticket)
        return tickets

    def abandon(self, tickets: list[Ticket]) -> None:
        """Nobody will wait for ``tickets`` (Ctrl-C in the caller): the workers that hold
        one unfinished are replaced at once (what they run is left unfinished), their
        other tickets go to the new ones."""
        with self._lock:
            for ticket in tickets:
                ticket.cancel()
            for lane in list(self._lanes):
                if any(t.cancelled and not t.done() for t in lane.tickets):
                    stale = lane.replace(self._new_worker())
                    for t in stale:
                        if t.cancelled:  # settled: its shared memory goes back to the ring
                            t.resolve(error=WorkerCrashed("abandoned with this batch in flight"))
                    self._resend(lane, stale)

    def submit_call(self, key: str, args: tuple[Any, ...], what: str) -> Ticket:
        """The function under ``key`` (:meth:`prepare`) called on ``args`` by the worker
        likely to be free first: a unit whose worker does all of its work (``prep run``
        sends a shard's task, and the worker loads, computes and saves it). Its value is
        what the function returned; ``what`` names the unit in errors."""
        ticket = Ticket.call(self, key, args, what)
        with self._lock:
            self._ensure_started()
            self._read_ready()
            self._send(_Lane.freest(self._lanes), ticket)
        return ticket

    def _read_ready(self) -> None:
        """Read the replies already waiting on every worker's pipe (never waits), so that
        a batch done but not yet asked for does not count as work in hand."""
        for lane in list(self._lanes):
            while lane.tickets and lane.worker.conn.poll():
                if not self._read_one(lane):
                    break

    def _read_one(self, lane: _Lane) -> bool:
        """Read one reply from the lane's worker; False if the worker is lost instead."""
        t = time.perf_counter()
        try:
            msg = _fdpipe.recv(lane.worker.conn)
        except (EOFError, OSError, RuntimeError):  # RuntimeError: fds cut short
            self._lost(lane)
            return False
        self._receive(lane, msg, time.perf_counter() - t)
        return True

    def _send(self, lane: _Lane, ticket: Ticket) -> None:
        lane.send(ticket, next(self._seq), self._fns.blob)

    # ------------------------------------------------------------ waiting

    def pump(self, ticket: Ticket, timeout: float | None) -> bool:
        """Read replies until ``ticket`` is done or ``timeout`` seconds have passed."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not ticket.done():
                lane: _Lane = ticket.lane
                now = time.monotonic()
                head = lane.tickets[0] if lane.tickets else None
                left = head.left(now) if head is not None else None
                if left is not None and left <= 0:
                    self._timed_out(lane)
                    continue
                waits = [x for x in (left, None if end is None else end - now) if x is not None]
                wait = max(0.0, min(waits)) if waits else None
                w = lane.worker
                # a reply already there (the common case once batches are in flight) needs
                # no selector: poll() is one system call
                ready = (
                    [w.conn] if w.conn.poll() else connection.wait([w.conn, w.proc.sentinel], wait)
                )
                if w.conn in ready:
                    self._read_one(lane)
                elif ready:
                    self._lost(lane)
                elif end is not None and time.monotonic() >= end:
                    return False
            return True

    def pump_any(self, timeout: float | None) -> None:
        """Read the replies of every worker that has one, waiting up to ``timeout``
        seconds for the first: for a caller with units on several workers (``prep
        run``'s shards), who takes each as it lands, whichever worker it is on. The
        wait itself holds no lock, so units can be submitted meanwhile."""
        with self._lock:
            busy = {lane.worker.conn: lane for lane in self._lanes if lane.tickets}
            ends = {lane.worker.proc.sentinel: lane for lane in busy.values()}
        if not busy:
            return
        try:
            ready = connection.wait([*busy, *ends], timeout)
        except (OSError, ValueError):  # a lane replaced meanwhile: its pipe is closed
            return
        with self._lock:
            # replies first: a worker that answered and then died has its answer read
            for end in sorted(ready, key=lambda r: r in ends):
                lane = busy.get(end) or ends[end]
                if lane not in self._lanes or lane.worker.proc.sentinel not in ends:
                    continue  # replaced (and its tickets dealt with) since the snapshot
                if end in ends:
                    if not lane.worker.conn.poll():
                        self._lost(lane)
                    continue
                while lane.tickets and lane.worker.conn.poll():
                    if not self._read_one(lane):
                        break

    def _receive(self, lane: _Lane, msg: tuple[Any, ...], transfer: float) -> None:
        _, seq, t0, t1, reply = msg
        ticket = lane.answered(seq)
        if ticket.cancelled:
            ticket.settle()
            return  # read, so its shared memory is released; nobody wants it
        ticket.busy, ticket.transfer = (t1 - t0 if t1 else None), transfer
        ticket.span = (t0, t1) if t1 else None
        ticket.reply = reply
        value, error = value_of(reply, self._fns.fn(ticket.key))
        ticket.resolve(value, error)

    def _resend(self, lane: _Lane, tickets: list[Ticket]) -> None:
        for t in tickets:
            if not t.cancelled:
                self._send(lane, t)

    def _lost(self, lane: _Lane) -> None:
        """The lane's worker died: its current batch fails, the others go to a new one."""
        w = lane.worker
        how = w.how_it_died()
        self._fail_head(lane, lambda head: head.worker_died(w.proc.pid, how, w.proc.exitcode))

    def _timed_out(self, lane: _Lane) -> None:
        what_now = (
            f"its worker (pid {lane.worker.proc.pid}) was terminated; a new one takes its "
            f"place for the next batches"
        )
        self._fail_head(lane, lambda head: head.timed_out(what_now))

    def _fail_head(self, lane: _Lane, error: Callable[[Ticket], BaseException]) -> None:
        """A new worker in the lane's: its oldest ticket fails with ``error(ticket)``, the
        others go to the new worker (or fail with it, once the pool is closed)."""
        if self._closed:
            for t in lane.tickets:
                t.resolve(error=error(t))
            lane.tickets.clear()
            return
        tickets = lane.replace(self._new_worker())
        if tickets:
            tickets[0].resolve(error=error(tickets[0]))
            self._resend(lane, tickets[1:])

    def __repr__(self) -> str:
        return f"<ProcessBatches workers={self.workers}>"
