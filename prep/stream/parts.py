"""A stream's split batches on its workers, with no barrier between batches.

``map_rows`` on a pool runs one batch at a time: every worker takes ranges of
it, and the batch ends at a barrier (the workers idle while the slowest range
finishes, then the parent takes the output in and sends the next batch). A
stream of ``processes`` or ``threads`` splits its batches here instead: each
batch is cut into one part per worker, and each part is a ticket on the
stream's workers (``executors._batches``, ``executors._batch_threads``), which
take their tickets in order. With ``prefetch`` batches submitted, a worker that
finishes its part of batch k starts on a part of batch k+1 at once::

    stream's thread                                 worker w (one of N)
    ───────────────                                 ───────────────────
    submit batch k: N parts ───── ("whole", rows a:b) ──▶ rows a:b ─▶ a chunk
    submit batch k+1: N parts ─── ("whole", rows c:d) ──▶ (next, at once)
    take batch k: each part's chunk ◀── its fds ───────────┘
      merged into one output (ChunkMerge), then finished as map_rows does

Once a batch has shown the output's shape, the next ones are made here and the
workers write their rows in place (for processes, in shared memory); before
that, and where rows may differ in size or fail on their own (``pad=``,
``on_error=``), the parts come back as chunks in batch row numbers, merged by
``executors._chunks``. The batch is then finished by ``_batch.run`` as any
batch is: so it returns what serial returns, bit for bit. A part that fails
fails the batch with the lowest row's error, as serial would raise it; a worker
process that dies under ``on_error='fill'``/``'skip'`` has the batch run again
through the pool's executor of those workers, which isolates the row that killed it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.output import Output
from ..core.policy import Policy
from ..core.rows import Rows
from ..errors import StackError
from ..executors import Chunk, ChunkMerge, Executor, Job, Shapes, Ticket, Traits, first_error
from .strategy import StrategyPlan

__all__ = ["DeliveredParts", "DeliveredProcessParts", "split_taken"]


class DeliveredParts(Executor):
    """The executor ``_batch.run`` sees for a stream's split batches: the output is
    merged from the parts :meth:`take` is given. One per stream, as
    ``_whole._Delivered`` is; ``isolate()`` is the pool's executor of its workers."""

    name = "split threads"

    def __init__(
        self,
        isolate: Callable[[], Executor],
        resubmit: Callable[[Rows], Any],
        shapes: Shapes,
        key: Any,
    ) -> None:
        super().__init__(1)
        self.isolate, self.resubmit = isolate, resubmit
        self.shapes, self.key = shapes, key  # the workers' shapes, the function's key
        self.tickets: list[Ticket] = []

    def output_for(self, rows: Rows, policy: Policy) -> Output | None:
        """The batch's output, made here for the workers to write in place (in shared
        memory, for processes), shaped as the function's last batch on these workers
        was (``Shapes.guess``); None where that is not known or rows may differ in size
        or fail alone (``pad=``, ``on_error=``: their parts come back as chunks)."""
        if not policy.plain:
            return None
        return self.shapes.guess((self.key, rows.layout()), len(rows), self.traits.needs_processes)

    def take(self, tickets: list[Ticket]) -> DeliveredParts:
        self.tickets = tickets  # one stream's producer thread is its only caller
        return self

    def run(self, job: Job) -> Output | None:
        tickets, self.tickets = self.tickets, []
        errors: list[BaseException] = []
        for t in tickets:
            try:
                t.result()
            except BaseException as exc:
                errors.append(exc)
        if errors and job.policy.per_row_errors and any(t.crashed for t in tickets):
            return self.isolate().run(job)  # the row that killed a worker fails alone
        guessed = tickets[0].into
        if guessed is not None and any(isinstance(e, StackError) for e in errors):
            # rows unlike last batch's: run the batch again as the first one ran, so that
            # the error names what serial names (or it is no error: its own shape)
            self.shapes.forget((self.key, job.rows.layout()))
            return self.take(self.resubmit(job.rows).tickets).run(job)
        if guessed is not None and not errors:
            job.sink.adopt(guessed)
        chunks = ChunkMerge(job)
        for t in tickets:
            # a part that failed has its error (above) as its reply; a chunk that does not
            # fit is an error too, and a lower row's error may be another part's
            if guessed is None and isinstance(t.reply, Chunk):
                chunks.take(t.reply, errors)
            t.reply = None  # its chunk's shared memory goes once merged
        if errors:
            raise first_error(errors)
        if job.sink.output is not None and job.policy.plain:
            self.shapes.keep((self.key, job.rows.layout()), job.sink.output)
        return job.sink.output


class DeliveredProcessParts(DeliveredParts):
    """Parts built in worker processes: another interpreter than serial's."""

    name = "split processes"
    traits = Traits(needs_processes=True)


def split_taken(plan: StrategyPlan, tickets: list[Ticket], took: float) -> None:
    """A split batch's figures for the plan: its rows, what taking it took here, and
    when each part ran."""
    spans = [(x.span[0], x.span[1], len(x.rows)) for x in tickets if x.span]
    plan.split_taken(sum(len(x.rows) for x in tickets), took, spans)
