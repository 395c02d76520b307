"""One stream's batches, each submitted by the strategy its plan says (``strategy``).

A batch is started and finished as ``map_rows`` starts and finishes one
(``prep._batch``): the stream starts it when it submits it and finishes it when
the loop takes it, so a stream's batch returns what serial returns, bit for bit.
Between the two, the batch runs one of three ways:

    split, at once     the pool's executor runs it in the stream's thread (``map_rows``)
    split, in parts    a part per worker on the executor's own workers, several
                       batches in flight and no barrier between them (``executors.Parts``,
                       the path ``map_rows`` takes on those workers)
    whole              one worker of a flavour builds all of it (``engine.submit``)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

from .. import _batch
from .._warn import Site, pointing_at
from ..core.checks import check_fn
from ..core.options import Options
from ..core.rows import Rows, SampleRows, rows_of
from ..core.seeding import mix, takes_rng
from ..errors import WorkerCrashed
from ..executors import Executor, Known, Parts, Ticket, Whole, starts_at_once
from .delivery import Delivery
from .strategy import StrategyPlan

__all__ = ["Submitter", "Work"]


class Work:
    """What a stream runs: ``fn`` (``bound``: with its ``setup=`` state) with
    ``options`` on a pool's executors (``executors(name)``), each batch a list of
    samples or a batch of rows; ``executor`` names the one that runs split batches.
    Warnings of its batches point at ``site`` (the ``imap`` call); ``progress``: the
    stream shows a bar of batches."""

    def __init__(
        self,
        fn: Any,
        bound: Any,
        options: Options,
        samples: bool,
        executors: Callable[[str], Executor],
        executor: str,
    ) -> None:
        self.fn, self.bound, self.samples = fn, bound, samples
        self.options = options.with_(progress=False)  # the stream's bar counts batches
        self.executors, self.executor = executors, executor
        self.site = Site.here()  # the user's line that called imap
        self.progress = options.progress
        self._numbers = itertools.count()  # each batch's, in the order they are submitted
        self._rows = 0  # rows in the batches before the next one
        #: seed= with a function that draws from the global generators: no threads
        self.global_draws = options.seed is not None and not takes_rng(fn)

    def _next(self, rows: int) -> tuple[Options, tuple[int, int]]:
        """The next batch's options and place (its number, the rows before it): under
        ``seed=``, batch ``k``'s rows keyed under ``mix(seed, k)``, whoever runs them
        (``core.seeding``). The function is checked first: raised at the batch, as its
        errors are."""
        check_fn(self.fn, None, "map_rows", "batch")
        number, before = next(self._numbers), self._rows
        self._rows += rows
        seed = self.options.seed
        options = self.options if seed is None else self.options.with_(seed=mix(seed, number))
        return options, (number, before)

    def rows(self, batch: Any) -> Rows:
        return SampleRows(list(batch)) if self.samples else rows_of(batch)

    def split(self, batch: Any) -> Any:
        """The batch through the pool's executor, in this thread: ``map_rows``."""
        rows = self.rows(batch)
        options, place = self._next(len(rows))
        with pointing_at(self.site):
            return _batch.run(self.executors(self.executor), self.bound, rows, options, place)

    def start(self, rows: Rows, ex: Executor) -> _batch.Batch:
        """The batch's job, for ``ex``'s workers to run."""
        options, place = self._next(len(rows))
        return _batch.start(self.bound, rows, options, ex, place)

    def finish(self, batch: _batch.Batch, result: Any, ex: Executor) -> Any:
        """The batch's result, once ``ex``'s workers made its output."""
        with pointing_at(self.site):
            return _batch.finish(batch, result, ex)


class Submitter:
    """``submit(batch)`` for :class:`~prep.stream.stream.Stream`: by the plan, a batch run
    at once or in parts (split), or whole, as a :class:`Delivery`. ``parts``: the
    flavour whose workers take split batches in parts (the executor's own; None: split
    batches run through the pool's executor)."""

    def __init__(self, plan: StrategyPlan, work: Work, parts: str | None) -> None:
        self.plan, self.work, self.parts = plan, work, parts
        self._known: dict[str, Known] = {}  # the function's record on each flavour's workers

    def _record(self, flavour: str, engine: Any) -> Known:
        known = self._known.get(flavour)
        if known is None:
            known = self._known[flavour] = engine.prepare(self.work.bound)
        return known

    def __call__(self, batch: Any) -> Delivery:
        ready = True
        if self.plan.measuring():
            try:  # every flavour asked, so that all of them start at once
                engines = [self.work.executors(f).engine for f in self.plan.flavours]
                ready = all([starts_at_once(engine) for engine in engines])
            except BaseException as exc:  # raised in its place in the order, as split's are
                return Delivery.failed(exc)
        strategy = self.plan.next(ready)
        if strategy == "split" and not self.parts:
            ran = Delivery.ran(self.work.split, batch)
            if ran.ran_for is not None and self.plan.timed:  # ran, and did not fail
                n = len(batch) if self.work.samples else len(rows_of(batch))
                self.plan.split_ran(n, ran.ran_for)
            return ran
        try:
            rows = self.work.rows(batch)
            if strategy == "split":
                assert self.parts is not None, "split batches in parts name their workers"
                return self._in_parts(self.work.executors(self.parts), rows)
            return self._whole(self.plan.flavour, rows)
        except BaseException as exc:  # raised in its place in the order, as split's are
            return Delivery.failed(exc)

    def _in_parts(self, ex: Executor, rows: Rows) -> Delivery:
        """A part per worker on ``ex``'s workers, finished when the loop takes it."""
        batch = self.work.start(rows, ex)
        engine = ex.engine
        parts = Parts(engine, batch.job, engine.workers, self._record(ex.name, engine))
        finish = lambda tickets: self.work.finish(batch, parts.result(), ex)  # noqa: E731
        return Delivery(parts.tickets, finish, functools.partial(_split_taken, self.plan))

    def _whole(self, flavour: str, rows: Rows) -> Delivery:
        """All of the batch on one worker of ``flavour``; a worker that died on it under
        fill/skip has the batch run again through ``flavour``'s executor, which runs the
        rows it held alone, so that the row that killed it fails alone."""
        ex = self.work.executors(flavour)
        batch = self.work.start(rows, ex)
        job = batch.job
        sent = rows if job.rows.seeds is None else rows.seeding(job.rows.seeds)
        key = self._record(flavour, ex.engine).key
        ticket = ex.engine.submit(Whole(key, sent, job.policy, job.timeout))

        def finish(tickets: list[Ticket]) -> Any:
            try:
                output, errors = ticket.result()
            except WorkerCrashed:
                if not (ticket.crashed and job.policy.per_row_errors):
                    raise
                output = ex.run(job)
            else:
                for row, error in errors.items():
                    job.sink.failures.add(row, error)
                job.sink.output = output
            return self.work.finish(batch, output, ex)

        return Delivery([ticket], finish, functools.partial(_whole_taken, self.plan, flavour))


def _whole_taken(plan: StrategyPlan, flavour: str, tickets: list[Ticket], took: float) -> None:
    """A whole batch's figures for the plan: its rows, its worker's busy time, what
    taking it took here, and when it ran (a thread's own clock where no span came)."""
    (ticket,) = tickets
    span = ticket.span
    if span is None and ticket.started is not None and ticket.busy:
        span = (ticket.started, ticket.started + ticket.busy)
    plan.whole_taken(len(ticket.rows or ()), ticket.busy, took, flavour, span)


def _split_taken(plan: StrategyPlan, tickets: list[Ticket], took: float) -> None:
    """A split batch's figures for the plan: its rows, what taking it took here, and
    when each part ran."""
    spans = [(x.span[0], x.span[1], len(x.rows or ())) for x in tickets if x.span]
    plan.split_taken(sum(len(x.rows or ()) for x in tickets), took, spans)
