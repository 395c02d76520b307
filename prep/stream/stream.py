"""A stream of batches, the next ones prepared while the caller uses this one.

``Pool.imap`` hands :class:`Stream` a ``call`` that runs one batch (the pool's
``map_rows`` with its options) and the user's iterable of batches::

    producer thread "prep-imap"                       consumer (the training loop)
    ───────────────────────────                       ────────────────────────────
    take a slot (at most prefetch) ◀──── slot freed ── next(stream) takes result k
    batch = next(batches)   (a DataLoader's work)          │
    result = call(batch)    (one pool batch)               ▼
    results.put(result) ──── queue.Queue(prefetch) ──▶ train_step(result k)

One producer thread, not several: ``submit`` hands a batch over and returns a
handle (the ``concurrent.futures`` shape), so batches that run elsewhere (whole
batches, or a batch split into parts on worker processes) are several in flight
at once, while a batch run in the pool itself (a pool holds a lock; a process
pool's pipes carry one conversation) runs in this thread, one at a time. What
overlaps is the preprocessing of batches k+1..k+prefetch, pulling them from
``batches`` included, with the consumer's own work on batch k (a training step,
mostly GPU kernels and torch ops that release the GIL). Memory stays bounded: a
slot is taken before a batch is pulled and given back when the consumer takes
its result, so at most ``prefetch`` results wait or are being made, besides the
one the consumer holds: ``prefetch + 1`` outputs alive.

An error, raised by ``call`` or by ``batches``, reaches the consumer in its
place in the order, after the results before it, with its own type and
traceback; nothing after it is started. Stopping early (``break``,
:meth:`Stream.close`, the stream being garbage-collected, Ctrl-C while waiting
for a batch) sets a stop event that the producer checks before each pull and
while it waits: a batch already running finishes (it cannot be interrupted
safely), then the thread ends and is joined. The thread never holds a
reference to the Stream, so dropping the Stream is what closes it.

``prefetch=0`` runs each batch in the consumer's thread when it is asked for:
no thread and no overlap, for debugging and profiling.

>>> import torch, prep
>>> batches = (torch.full((2, 3), float(k)) for k in range(3))
>>> with prep.Pool("threads", workers=2) as pool:
...     with Stream(lambda b: pool.map_rows(torch.neg, b), batches, prefetch=2) as stream:
...         [out[0, 0].item() for out in stream]
[-0.0, -1.0, -2.0]
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from .._progress import CountBar
from .._warn import warn
from ..errors import ConfigError
from . import stats as figures_of  # its clock, read where it is timed
from .delivery import Delivery
from .link import END, ERROR, POLL, RESULT, Item, Link, TorchState
from .position import Position
from .stats import BatchFigures, Meter, StreamStats, rows_in

__all__ = ["JOIN_TIMEOUT", "THREAD_NAME", "Stream", "check_prefetch", "close_open"]

THREAD_NAME = "prep-imap"
#: seconds :meth:`Stream.close` waits for a batch in flight to finish
JOIN_TIMEOUT = 30.0


#: the streams whose thread may still run, which :func:`close_open` ends at exit
_OPEN: weakref.WeakSet[Stream] = weakref.WeakSet()


def close_open(timeout: float = JOIN_TIMEOUT) -> None:
    """Close every open stream, waiting ``timeout`` seconds for all of them together.

    ``prep.pool`` runs this at exit, before the interpreter finalizes. A stream's
    thread is a daemon, and once finalizing has begun CPython ends a daemon thread
    that takes the GIL back with ``pthread_exit``; where that happens inside torch
    (which releases the GIL around an op or a tensor's free, in C++ frames that may
    not unwind), the unwinding calls ``std::terminate``: "terminate called without
    an active exception", SIGABRT, after a script that had finished (pytorch#38228,
    pybind11#2215). Joined here, no stream's thread is inside torch by then."""
    streams = list(_OPEN)
    for stream in streams:  # all stop first, so their batches in flight end together
        stream._link.stop.set()
    end = time.monotonic() + timeout
    for stream in streams:
        stream.close(max(0.0, end - time.monotonic()))


def check_prefetch(prefetch: Any) -> int:
    """``prefetch`` as an int >= 0; a ConfigError naming it and the fix otherwise."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ConfigError(
            f"prefetch={prefetch!r} is not a whole number of batches; pass prefetch >= 1 "
            f"(e.g. prefetch=2) to prepare that many batches ahead while you use the "
            f"current one, or prefetch=0 to run each batch in your loop's thread"
        )
    return prefetch


class _Source(NamedTuple):
    """The batches the producer pulls, and the position that reads their source's
    state as each is pulled."""

    batches: Iterator[Any]
    position: Position


class _Pending(NamedTuple):
    """A batch submitted: its delivery, its seconds in the source, the source's state
    as it was pulled."""

    ticket: Delivery
    pulled: float = 0.0
    source: Any = None


def _produce(
    submit: Callable[[Any], Delivery],
    source: _Source,
    link: Link,
    state: TorchState,
    workers: int | None,
) -> None:
    """The producer thread's life: every batch until they end, one fails or the consumer
    stops; an error goes to the consumer, which raises it in its place. ``workers``:
    what a result's figures count busy time over (None: no figures)."""
    try:
        with state.applied():
            _run_batches(submit, source, link, workers)
    except BaseException as exc:
        link.put(Item(ERROR, exc))


def _run_batches(
    submit: Callable[[Any], Delivery], source: _Source, link: Link, workers: int | None
) -> None:
    """Keep up to a slot's worth of batches submitted; hand their results over in order.

    Each turn does the first of: deliver the oldest batch if it is done; pull and
    submit one more if a slot is free; wait a little, for a slot if the consumer
    has results to take (it frees one when it takes one: a worker must not idle
    then, while this thread waits for the oldest batch), else for the oldest. So a
    batch run in this thread (:meth:`Delivery.ran`) is delivered before the next one is
    pulled, and batches run elsewhere keep every slot busy."""
    pending: deque[_Pending] = deque()
    ended = False
    try:
        while not link.stop.is_set():
            if pending and pending[0].ticket.wait(0):  # done (a reply already there is read)
                if not _deliver(pending.popleft(), link, workers):
                    return
            elif not ended and (link.slots.acquire(blocking=False) if pending else link.reserve()):
                pulling = figures_of.clock()
                try:
                    batch = next(source.batches)
                    state = source.position.pulled()  # the source's, as it gave this batch
                except StopIteration:
                    ended = True
                    link.slots.release()  # taken for a batch that never came
                    continue
                except BaseException as exc:  # the batches' own error, in its place
                    ended = True
                    pending.append(_Pending(Delivery.failed(exc)))
                    continue
                if link.stop.is_set():  # stopped while the batch was pulled: do not start it
                    return
                pulled = figures_of.clock() - pulling
                pending.append(_Pending(submit(batch), pulled, state))
                del batch  # the ticket holds what it needs: memory stays bounded by slots
            elif pending and not link.results.empty():
                if link.slots.acquire(timeout=POLL):
                    link.slots.release()  # the next turn takes it, after delivering
            elif pending:
                pending[0].ticket.wait(POLL)
            else:
                if ended:
                    link.put(Item(END, None))
                return  # ended, or stopped while waiting for a slot
    finally:
        for waiting in pending:  # stopped with batches in flight: nobody takes them
            waiting.ticket.cancel()


def _deliver(batch: _Pending, link: Link, workers: int | None) -> bool:
    """The batch's result (or its error, which ends the stream) to the consumer, with its
    source's state and its figures (none where ``workers`` is None): its rows, its
    seconds in the source and its pool seconds (none for a stand-in of a Delivery's
    shape)."""
    ticket = batch.ticket
    try:
        result = ticket.result()
    except BaseException as exc:
        link.put(Item(ERROR, exc))
        return False
    if workers is None:
        return link.put(Item(RESULT, result, None, batch.source))
    busy = ticket.busy(workers) if isinstance(ticket, Delivery) else 0.0
    figures = BatchFigures(rows_in(result), batch.pulled, busy)
    return link.put(Item(RESULT, result, figures, batch.source))


def _surfaced(exc: BaseException) -> BaseException:
    """The error to raise in the consumer: a StopIteration from ``call`` would end the
    consumer's loop silently, as if the batches had run out (PEP 479)."""
    if isinstance(exc, StopIteration):
        err = RuntimeError("the batch function raised StopIteration")
        err.__cause__ = exc
        return err
    return exc


class Stream(Iterator[Any]):
    """The results of ``call(batch)`` for each batch of ``batches``, in order, up to
    ``prefetch`` of them prepared ahead in a background thread while the caller uses the
    current one. An iterator; :meth:`close` (or leaving a ``with`` block, or dropping
    it) stops the work. The producer thread takes the grad and inference mode and
    the CUDA device and stream current where the Stream is made. :meth:`stats` says
    what it measured and what bounds the loop, :meth:`state_dict` where it is
    (``position``: counted from a resumed state; None: from ``batches``' start);
    ``workers`` is how many workers its batches share; ``measure=False`` keeps no
    figures (to measure what they cost); ``bar``: a bar of the batches taken, with the
    share of its time the loop waited; ``strategy``: says how its batches run.
    """

    def __init__(
        self,
        call: Callable[[Any], Any],
        batches: Iterable[Any],
        prefetch: int = 2,
        submit: Callable[[Any], Delivery] | None = None,
        *,
        workers: int = 1,
        measure: bool = True,
        position: Position | None = None,
        bar: CountBar | None = None,
        strategy: Callable[[], str] | None = None,
    ) -> None:
        self.prefetch = check_prefetch(prefetch)
        self._bar = bar
        #: a line on how this stream runs its batches (its strategy plan's), for explain()
        self.strategy = strategy
        self._call = call
        self._batches = iter(batches)
        self._position = position or Position(batches, self._batches)
        self._closed = False
        self._link = Link(self.prefetch)  # unused at prefetch=0
        self._thread: threading.Thread | None = None
        self._meter = Meter(self.prefetch, workers) if measure else None
        if self.prefetch:
            submit = submit or functools.partial(Delivery.ran, call)
            counted = workers if measure else None
            source = _Source(self._batches, self._position)
            args = (submit, source, self._link, TorchState.here(), counted)
            self._thread = threading.Thread(
                target=_produce, args=args, name=THREAD_NAME, daemon=True
            )
            self._thread.start()
            _OPEN.add(self)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        if self._thread is None:
            return self._run_here()
        meter = self._meter
        if meter is not None:
            asked, ready = meter.asked(), self._link.results.qsize()
        try:
            kind, value, figures, source = self._link.take(self._thread)
        except BaseException:  # Ctrl-C while waiting: stop the work, then let it through
            self.close()
            raise
        if kind == RESULT:
            self._position.handed(source)
            if meter is not None and figures is not None:
                meter.took(asked, ready, figures)
            self._count(value)
            return value
        self.close()  # the producer has ended; nothing follows
        if kind == END:
            raise StopIteration
        error, value = _surfaced(value), None
        try:
            raise error
        finally:
            del error  # no cycle through this frame: the error's traceback holds the batch

    def _run_here(self) -> Any:
        """``prefetch=0``: pull and run the next batch in the caller's thread."""
        asked = self._meter.asked() if self._meter is not None else 0.0
        try:
            batch = next(self._batches)
            source = self._position.pulled()
        except BaseException:  # StopIteration (the end) or the batches' own error
            self._closed = True
            raise
        pulled = figures_of.clock()
        try:
            result = self._call(batch)
        except BaseException as exc:
            self._closed = True
            raise _surfaced(exc)  # noqa: B904 (the error itself, or its RuntimeError)
        self._position.handed(source)
        if self._meter is not None:
            ran = figures_of.clock() - pulled
            self._meter.took(asked, 0, BatchFigures(rows_in(result), pulled - asked, ran))
        self._count(result)
        return result

    def _count(self, result: Any) -> None:
        """One more batch on the bar, with the share of the stream's time the loop waited."""
        if self._bar is None:
            return
        meter, note = self._meter, None
        if meter is not None and (elapsed := meter.last_taken - meter.start) > 0:
            note = f"waited {meter.wait / elapsed:.0%}"
        self._bar.advance(rows_in(result), note)

    def stats(self) -> StreamStats:
        """What the stream measured so far, and (its ``str()``) what bounds the loop.

        >>> import torch, prep
        >>> with prep.Pool("threads", workers=2) as pool:
        ...     stream = pool.imap(torch.neg, [torch.ones(4, 2)] * 3)
        ...     _ = list(stream)
        >>> stream.stats().batches, stream.stats().rows
        (3, 12)
        """
        if self._meter is None:
            return Meter(self.prefetch, 1).stats()
        return self._meter.stats()

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: ``{"batches": n}`` handed to it so far, and for a source
        with its own ``state_dict()`` (a ``StatefulDataLoader``), ``"source"``: that
        state as the source gave the last of them, not as it is now, read ahead.
        ``Pool.imap(..., state=...)`` resumes from it (:mod:`prep.stream.position`)."""
        return self._position.state_dict()

    def close(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Stop preparing batches: none is pulled any more, a batch already running
        finishes and the thread ends; wait up to ``timeout`` seconds for it (a warning
        if it is still running then: it ends by itself once its batch is done).
        It is safe to call this several times."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        _OPEN.discard(self)
        self._link.stop.set()
        if thread is not threading.current_thread():  # the collector may run anywhere
            thread.join(timeout)
            if thread.is_alive():
                warn(
                    f"the {THREAD_NAME} thread's batch did not finish within {timeout} s "
                    f"of close(); it stops once that batch is done (a batch cannot be "
                    f"interrupted safely; a pool's timeout= bounds it)"
                )
        self._link.drain()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<prep.Stream prefetch={self.prefetch} delivered={self._position.batches} {state}>"
