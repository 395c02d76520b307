"""One stream's batches, each submitted by the strategy its plan says (``_strategy``).

``split`` runs the batch at once through the pool (``map_rows``), in the
stream's thread; ``whole`` hands it to a worker of the pool's whole-batch
workers (``executors._batches``) and returns a ticket. Once a whole batch is
done, the stream's thread finishes it as ``map_rows`` finishes its output
(padding trimmed, failed rows skipped, lengths, the device) through
``_batch.run``, with :class:`_Delivered` as the executor: so a whole batch
returns what serial returns for it, bit for bit.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ..core.output import Output
from ..core.policy import Policy
from ..core.rows import Rows, SampleRows, rows_of
from ..errors import WorkerCrashed
from ..executors import Executor, Job, Ticket, Traits, split
from ..registry import executor_class
from .delivery import Delivery
from .parts import DeliveredParts, DeliveredProcessParts, split_taken
from .strategy import StrategyPlan

__all__ = ["Submitter"]


class _Delivered(Executor):
    """The executor ``_batch.run`` sees for a stream's whole batches: the output of the
    ticket :meth:`take` is given. One per stream, so that the checks ``_batch.run``
    makes once per executor and function (serial is the reference) run once. A batch
    whose worker died under ``on_error='fill'``/``'skip'`` runs again through
    ``isolate()``: the pool's executor of those workers, which runs such rows one by
    one so that the row that killed a worker fails alone."""

    name = "whole threads"

    def __init__(self, isolate: Callable[[], Executor]) -> None:
        super().__init__(1)
        self.isolate = isolate
        self.ticket: Ticket | None = None

    def take(self, ticket: Ticket) -> _Delivered:
        self.ticket = ticket  # one stream's producer thread is its only caller
        return self

    def run(self, job: Job) -> Output | None:
        assert self.ticket is not None, "take(ticket) comes before run"
        try:
            output, errors = self.ticket.result()
        except WorkerCrashed:
            if self.ticket.crashed and job.policy.per_row_errors:
                return self.isolate().run(job)
            raise
        for row, error in errors.items():
            job.sink.failures.add(row, error)
        job.sink.output = output
        self.ticket = None
        return output


class _DeliveredProcesses(_Delivered):
    """Whole batches built in worker processes: another interpreter than serial's."""

    name = "whole processes"
    traits = Traits(needs_processes=True)


def _whole_taken(plan: StrategyPlan, flavour: str, tickets: list[Ticket], took: float) -> None:
    """A whole batch's figures for the plan: its rows, its worker's busy time, what
    taking it took here, and when it ran (a thread's own clock where no span came)."""
    (ticket,) = tickets
    span = ticket.span
    if span is None and ticket.started is not None and ticket.busy:
        span = (ticket.started, ticket.started + ticket.busy)
    plan.whole_taken(len(ticket.rows), ticket.busy, took, flavour, span)


class _Sender:
    """One flavour's whole-batch workers for a stream: the key its function travels by,
    and the executor that delivers their batches."""

    def __init__(self, workers: Any, fn: Any, isolate: Callable[[str], Executor]) -> None:
        self.workers = workers
        self.key = workers.prepare(fn)
        other = executor_class(workers.name).traits.needs_processes  # another interpreter's rows
        kind = _DeliveredProcesses if other else _Delivered
        self.delivered = kind(functools.partial(isolate, workers.name))


class Submitter:
    """``submit(batch)`` for :class:`~prep.stream.stream.Stream`: by the plan, a batch run at
    once (split) or a :class:`Delivery` (whole).

    ``split(batch)`` is the pool's ``map_rows``/``map_samples`` with the stream's
    options; ``finish(executor, rows)`` is ``_batch.run`` through that executor
    with the same options (whose ``policy`` is given); ``workers(flavour)`` gives the
    pool's workers of that flavour (None when the plan never asks for them),
    ``isolate(name)`` the pool's executor of that name (a crashed batch runs again
    through the executor of the workers it crashed on)."""

    def __init__(
        self,
        plan: StrategyPlan,
        samples: bool,
        split: Callable[[Any], Any],
        finish: Callable[[Executor, Rows], Any],
        fn: Any,
        policy: Policy,
        workers: Callable[[str], Any] | None,
        isolate: Callable[[str], Executor],
        timeout: float | None,
        parts: str | None = None,
    ) -> None:
        self.plan, self.samples = plan, samples
        self.split, self._finish, self.isolate = split, finish, isolate
        self.pick, self.timeout, self.fn = workers, timeout, fn
        self.policy = policy
        self.senders: dict[str, _Sender] = {}  # by flavour, made on first use
        # split batches go in parts to the stream's workers of this flavour (no barrier),
        # not through the pool's map_rows: a stream of executor='processes' or 'threads'
        self.parts = parts
        self.delivered_parts: DeliveredParts | None = None

    def __call__(self, batch: Any) -> Delivery:
        ready = True
        if self.plan.measuring():
            try:  # every flavour asked, so that all of them start at once
                ready = all([self._sender(f).workers.ready() for f in self.plan.flavours])
            except BaseException as exc:  # raised in its place in the order, as split's are
                return Delivery.failed(exc)
        strategy = self.plan.next(ready)
        if strategy == "split" and not self.parts:
            t = time.perf_counter()
            ran = Delivery.ran(self.split, batch)
            if ran.error is None and self.plan.timed:
                n = len(batch) if self.samples else len(rows_of(batch))
                self.plan.split_ran(n, time.perf_counter() - t)
            return ran
        flavour = self.plan.flavour
        try:
            rows = SampleRows(list(batch)) if self.samples else rows_of(batch)
            if strategy == "split":  # in a part per worker on the stream's workers
                return self._submit_parts(rows)
            sender = self._sender(flavour)
            ticket = sender.workers.submit(sender.key, rows, self.policy, self.timeout)
        except BaseException as exc:  # raised in its place in the order, as split's are
            return Delivery.failed(exc)
        finish = lambda tickets: self._finish(sender.delivered.take(ticket), rows)  # noqa: E731
        return Delivery([ticket], finish, functools.partial(_whole_taken, self.plan, flavour))

    def _submit_parts(self, rows: Rows, guess: bool = True) -> Delivery:
        assert self.parts is not None, "a stream that splits in parts names their workers"
        sender = self._sender(self.parts)
        if self.delivered_parts is None:
            resubmit = functools.partial(self._submit_parts, guess=False)
            other = executor_class(self.parts).traits.needs_processes
            kind = DeliveredProcessParts if other else DeliveredParts
            isolate = functools.partial(self.isolate, self.parts)
            self.delivered_parts = kind(isolate, resubmit, sender.workers.shapes, sender.key)
        delivered = self.delivered_parts
        workers = sender.workers
        into = delivered.output_for(rows, self.policy) if guess else None
        bounds = split(0, len(rows), workers.workers)
        tickets = workers.submit_parts(sender.key, rows, self.policy, self.timeout, bounds, into)
        finish = lambda tickets: self._finish(delivered.take(tickets), rows)  # noqa: E731
        return Delivery(tickets, finish, functools.partial(split_taken, self.plan))

    def _sender(self, flavour: str) -> _Sender:
        sender = self.senders.get(flavour)
        if sender is None:
            assert self.pick is not None, "a plan with whole batches has workers to pick"
            sender = self.senders[flavour] = _Sender(self.pick(flavour), self.fn, self.isolate)
        return sender
