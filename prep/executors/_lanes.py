"""The parent's side of a process pool's workers, one lane each: the units a worker
holds (oldest first: it answers in order) and the row functions it has, mirrored
here (:class:`Lane`); the set of them, kept at ``workers`` live processes, a dead
or stuck one replaced with its oldest unit failed and the others resent
(:class:`Lanes`); and the row functions the workers are sent, pickled once each
(:class:`Functions`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
import time
import types
from collections import deque
from collections.abc import Callable
from typing import Any

import cloudpickle

from .._kept import keep_newest
from ..core.rows import Rows
from ..errors import ConfigError, WorkerCrashed
from . import _batch_worker, _fdpipe, _spawn
from . import _messages as m
from ._context import Context, Follower
from ._handles import Worker, how_it_ended
from ._shapes import FUNCTIONS, Known
from ._ticket import Call, Load, Part, Ticket
from ._transport import pickle_fn

__all__ = ["Functions", "Lane", "Lanes", "check_on_cpu"]


def check_on_cpu(rows: Rows) -> None:
    for c in getattr(rows, "columns", ()):
        if c.device.type != "cpu":
            raise ConfigError(
                f"executor='processes' got a tensor on {c.device}; workers never touch "
                f"CUDA, so pass CPU tensors (and device= for the result), or use "
                f"executor='threads' or 'vectorized' for a batch already on the GPU"
            )


class Lane:
    """One worker process and the tickets sent to it, oldest first."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tickets: deque[Ticket] = deque()
        # the row functions it holds, oldest first: it keeps the last KEEP, as this does
        self.keys: dict[str, None] = {}
        self.context: Context | None = None  # the caller's, as this worker last had it

    def replace(self, worker: Worker) -> list[Ticket]:
        """``worker`` in the old one's place; the tickets the old one held, oldest first."""
        self.worker.stop()
        tickets, self.tickets, self.keys = list(self.tickets), deque(), {}
        self.worker, self.context = worker, None
        return tickets

    def send(
        self, ticket: Ticket, seq: int, blob: Callable[[str], bytes], context: Context
    ) -> None:
        """``ticket`` to this lane's worker, numbered ``seq``; first the caller's
        ``context`` if the worker's differs (:mod:`._context`), and its function (its
        pickled bytes, ``blob(key)``) if the worker has not had it."""
        unit, conn = ticket.unit, self.worker.conn
        key = unit.key
        if self.context is not context:
            _fdpipe.send(conn, context)
            self.context = context
        if key not in self.keys:
            _fdpipe.send(conn, m.Function(key, blob(key)))
            keep_newest(self.keys, key, None, _batch_worker.KEEP)  # as the worker keeps them
        ticket.lane, ticket.seq = self, seq
        if isinstance(unit, Call):
            _fdpipe.send(conn, m.Call(seq, key, unit.args))
        elif isinstance(unit, Load):
            _fdpipe.send(conn, m.Load(seq, key))
        else:
            rows = ticket.wire if ticket.wire is not None else ticket.rows
            into = unit.into if isinstance(unit, Part) else None
            _fdpipe.send(conn, m.Build(seq, key, rows, unit.policy, into))
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


def travels_by_name(fn: Any) -> bool:
    """Whether cloudpickle sends ``fn`` as its module and name alone: a builtin, or a
    function the workers import (not one of ``__main__``, a lambda or a closure)."""
    if isinstance(fn, types.BuiltinFunctionType):
        return True
    if not isinstance(fn, types.FunctionType):
        return False  # a partial, a callable object: their state may change
    check = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)
    try:
        return bool(check(fn)) if check is not None else False
    except Exception:  # not sure: pickled each time, as any other
        return False


class Functions:
    """The row functions the workers are sent, pickled once each, by key, each with its
    record (:class:`~._shapes.Known`)."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[Any, bytes, Known]] = {}
        #: the key of each function that travels by name, by its id (it is held here)
        self._named: dict[int, tuple[Any, str]] = {}

    def add(self, fn: Any) -> Known:
        """The record of ``fn``, under the key it travels by (pickled here, once: a
        stream's batches all use the function as it was when the stream began). A
        function that travels by name (a builtin, a module's function) is pickled once:
        its bytes cannot change. Any other (a closure, a function of ``__main__``) is
        pickled each time, so that the workers see its globals and captures as the
        caller has them now; the same bytes are the same record."""
        named = self._named.get(id(fn))
        if named is not None and named[0] is fn and named[1] in self._by_key:
            key = named[1]
            keep_newest(self._by_key, key, self._by_key[key], FUNCTIONS)
            return self._by_key[key][2]
        blob = pickle_fn(fn)
        key = hashlib.sha1(blob).hexdigest()
        if travels_by_name(fn):
            keep_newest(self._named, id(fn), (fn, key), FUNCTIONS)
        old = self._by_key.get(key)
        known = old[2] if old is not None else Known(key, shared=True)
        keep_newest(self._by_key, key, (fn, blob, known), FUNCTIONS)
        return known

    def blob(self, key: str) -> bytes:
        return self._by_key[key][1]

    def fn(self, key: str) -> Any:
        """The function itself (None once forgotten): for the errors about it."""
        entry = self._by_key.get(key)
        return entry[0] if entry is not None else None


class Lanes:
    """``workers`` worker processes, a :class:`Lane` each, started on first use (forked
    from this process while that is safe and ``fork`` asks for it, else from prep's
    forkserver) and kept alive: a worker that dies or passes its unit's deadline is
    replaced, its oldest unit failed and the others resent to the new one. ``lock``
    guards the lanes and their pipes (one reader at a time)."""

    def __init__(self, workers: int, threads: int, fork: bool, fns: Functions) -> None:
        self.workers, self.threads, self.fork, self.fns = workers, threads, fork, fns
        self.all: list[Lane] = []
        self.lock = threading.RLock()
        self.closed = False  # close() ran: a worker lost now is not replaced
        self._seq = itertools.count()
        self.follower = Follower()  # the caller's directory and environment

    def new_worker(self) -> Worker:
        fork = self.fork and _spawn.fork_is_safe()
        if not fork:
            _spawn.ensure_server()
        return Worker(_spawn.context(fork), self.threads)

    def ensure_started(self) -> list[Lane]:
        """Every lane, a live worker in each (call it holding :attr:`lock`)."""
        self.closed = False  # a submit after close() starts the pool afresh
        while len(self.all) < self.workers:
            self.all.append(Lane(self.new_worker()))
        for lane in self.all:
            if not lane.worker.alive():  # died while idle (killed, OOM)
                self.lost(lane)
        return self.all

    def send(self, lane: Lane, ticket: Ticket) -> None:
        """``ticket`` to the lane's worker; one that died since it was last seen alive
        (its pipe broke) is lost as any dead worker is, and the ticket goes to the new
        one in its place."""
        try:
            lane.send(ticket, next(self._seq), self.fns.blob, self.follower.now())
        except (BrokenPipeError, ConnectionResetError):
            self.lost(lane)
            lane.send(ticket, next(self._seq), self.fns.blob, self.follower.now())

    def resend(self, lane: Lane, tickets: list[Ticket]) -> None:
        for t in tickets:
            if not t.cancelled:
                self.send(lane, t)

    def lost(self, lane: Lane) -> None:
        """The lane's worker died: its current unit fails, the others go to a new one."""
        proc = lane.worker.proc
        proc.join(1)
        how = how_it_ended(proc.exitcode)
        self._fail_head(lane, lambda head: head.worker_died(proc.pid, how, proc.exitcode))

    def timed_out(self, lane: Lane) -> None:
        what_now = (
            f"its worker (pid {lane.worker.proc.pid}) was terminated; a new one takes its "
            f"place for the next batches"
        )
        self._fail_head(lane, lambda head: head.timed_out(what_now))

    def _fail_head(self, lane: Lane, error: Callable[[Ticket], BaseException]) -> None:
        """A new worker in the lane's: its oldest ticket fails with ``error(ticket)``, the
        others go to the new worker (or fail with it, once the pool is closed)."""
        if self.closed:
            for t in lane.tickets:
                t.resolve(error=error(t))
            lane.tickets.clear()
            return
        tickets = lane.replace(self.new_worker())
        if tickets:
            tickets[0].resolve(error=error(tickets[0]))
            self.resend(lane, tickets[1:])

    def abandon(self, tickets: list[Ticket]) -> None:
        """Nobody will wait for ``tickets`` (Ctrl-C in the caller): the workers that hold
        one unfinished are replaced at once (what they run is left unfinished), their
        other tickets go to the new ones."""
        with self.lock:
            for ticket in tickets:
                ticket.cancel()
            for lane in list(self.all):
                if any(t.cancelled and not t.done() for t in lane.tickets):
                    stale = lane.replace(self.new_worker())
                    for t in stale:
                        if t.cancelled:  # settled: its shared memory goes back to the ring
                            t.resolve(error=WorkerCrashed("abandoned with this batch in flight"))
                    self.resend(lane, stale)

    def idle(self) -> bool:
        """Whether no worker holds a unit (call it holding :attr:`lock`)."""
        return not any(lane.tickets for lane in self.all)

    def close(self, now: bool) -> None:
        """Stop every worker (asked first, terminated if it does not listen; ``now``:
        terminated at once, mid-unit); their tickets fail."""
        self.closed = True  # another thread's wait that sees a worker end replaces none
        polite = self.lock.acquire(timeout=1.0)
        try:
            lanes, self.all = self.all, []
            for lane in lanes if not now else ():
                with contextlib.suppress(OSError):
                    _fdpipe.send(lane.worker.conn, m.Close())
            for lane in lanes:
                if not now:
                    lane.worker.proc.join(1)
                lane.worker.stop()
                for t in lane.tickets:
                    t.resolve(error=WorkerCrashed("the pool was closed with this batch in flight"))
        finally:
            if polite:
                self.lock.release()
