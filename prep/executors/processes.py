"""``executor="processes"``: one batch cut into a part per worker (fewer for light rows),
on the same worker processes that run a stream's batches and ``prep run``'s shards
(``_batches``).

    parent                                              worker k (prep's forkserver)
    ──────                                              ────────────────────────────
    fn, cloudpickled (once per function) ── "fn" ─────▶ loads it, keeps a few
    the batch's tensors ─ shared memory (the ring) ─┐
    rows a:b of the batch, a part per worker ───────┴─▶ fn(row i) for i in a:b
       (as many parts as carry 0.5 ms each)
    Ticket.result() for each part  ◀── "done" (written into the shared output) or a
                                       chunk of its own (ragged rows, fill/skip), merged

``map_rows`` is a stream of one batch: it submits the batch's parts and waits for
their tickets, on the workers a stream keeps several batches in flight on. Each
part costs the caller a message out, one back and a merge (0.2-0.3 ms here), so
once a function's rows have been timed in a worker, a batch is cut into no more
parts than carry ``PART_WORK`` (0.5 ms) of work each: light rows go whole to one
worker (``_shapes.RowCosts``). Once a
function and row layout has shown its output's shape, the next batch's output is
made here in shared memory and each worker writes its rows in place; before that,
and where rows may differ in size or fail on their own (``pad=``, ``on_error=``),
parts come back as chunks (in the message itself when small) and are merged
(``_chunks``).

Failures become errors, never hangs: a worker that dies fails its part
(:class:`~prep.WorkerCrashed`) and a fresh one takes its place; under
``on_error='fill'``/``'skip'`` its rows run again, each alone, on the same workers
(``_isolation``), so the row that killed it fails alone. A part past the batch's
deadline has its worker killed (:class:`~prep.BatchTimeout`); Ctrl-C in the caller
replaces the workers that still hold its parts. A row that raises only costs the
batch (:class:`~prep.RowError`, the lowest row's, as serial raises it).
Workers are forked from prep's own forkserver (``_spawn``), which preloads torch,
so they start in milliseconds, never inherit a CUDA context and never import or
run the user's main script; each exits by itself when the parent disappears. The
row function travels with cloudpickle: by name when the workers can import it, by
value when they cannot (``__main__`` of a script, a notebook, ``python -c`` or
stdin; lambdas, closures, local functions).
"""

from __future__ import annotations

from ..core.output import Output
from ..errors import (
    StackError,
    WorkerCrashed,
)
from ._base import Executor, Traits, copy_rows, split
from ._batches import ProcessBatches
from ._chunks import gather
from ._fdpipe import INLINE
from ._handles import how_it_ended
from ._isolation import Isolation
from ._job import Job
from ._ticket import Ticket
from ._transport import check_shm, pickle_fn, shm_fits, shm_free

__all__ = ["ProcessExecutor", "pickle_fn", "shm_fits", "shm_free"]

#: parts per worker of a batch with a progress bar (else at most one: the fewest messages)
PROGRESS_PARTS = 4


class ProcessExecutor(Executor):
    name = "processes"
    traits = Traits(needs_processes=True, stream_workers=("processes",))

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        #: the workers: this executor's batches, and a stream's (``Executor.engine``)
        self.engine = ProcessBatches(self.workers)

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        self.engine.close()

    def release(self) -> bool:
        return self.engine.release()

    # -------------------------------------------------------------- one batch

    def run(self, job: Job) -> Output | None:
        n = len(job.rows)
        if job.start >= n:
            return job.sink.output
        key = self.engine.prepare(job.fn)
        given = job.sink.output
        shape_key = (key, job.rows.layout())
        into = None
        # rows of one shape, none failing alone, an output too large to travel inside a
        # message: written in place, in shared memory
        if job.policy.plain and given is None:
            into = self.engine.shapes.guess(shape_key, n, shared=True)
        elif (
            job.policy.plain and given is not None and min(b.nbytes for b in given.buffers) > INLINE
        ):
            into = given
            if not all(b.is_shared() and b.is_contiguous() for b in given.buffers):
                check_shm(given.nbytes, "the output")
                into = given.like(shared=True)  # staging: copied into out= at the end
        try:
            self._parts(job, key, into)
        except StackError:
            if into is None or given is not None:
                raise
            # rows unlike last batch's: run the batch again as the first one ran, so
            # that the error names what serial names (or it is no error: its own shape)
            self.engine.shapes.forget(shape_key)
            self._parts(job, key, None)
            into = None
        out = job.sink.output
        if out is None:
            return None  # every row failed (on_error='fill'/'skip'): none gave a shape
        if job.policy.plain and given is None:
            self.engine.shapes.keep(shape_key, out)
        if given is not None and into is not None and into is not given:
            job.sink.output = copy_rows(given, into, job.start)
        return job.sink.output

    def _parts(self, job: Job, key: str, into: Output | None) -> None:
        """Rows ``job.start:`` in a part per worker (fewer for light rows, more with a
        progress bar), each written into ``into`` or merged into ``job.sink`` as it
        comes back; under fill/skip the rows of a part whose worker died run again
        (:mod:`._isolation`)."""
        n, costs = len(job.rows), self.engine.costs
        if job.sink.progress is not None:
            parts = self.workers * PROGRESS_PARTS
        else:  # light rows: fewer parts, as many as pay for their messages (``RowCosts``)
            parts = costs.parts(key, n - job.start, self.workers)
        bounds = split(job.start, n, parts)
        isolation = Isolation(job)

        def crashed(ticket: Ticket, exc: WorkerCrashed) -> list[Ticket] | None:
            if not (ticket.crashed and job.policy.per_row_errors):
                return None
            held, who = ticket.bounds(), f"worker pid {exc.pid}"
            return self._submit(
                job, key, isolation.lost(held, who, how_it_ended(exc.exitcode)), into
            )

        tickets = self._submit(job, key, bounds, into)
        gather(job, list(tickets), into, self.engine.abandon, crashed)
        timed = [(t.busy, t.bounds()) for t in tickets if t.busy is not None]
        if timed:  # what a row costs: the slowest part per row, its worker's busy time
            busy, (start, stop) = max(timed, key=lambda x: x[0] / max(1, x[1][1] - x[1][0]))
            costs.keep(key, busy, stop - start)

    def _submit(
        self, job: Job, key: str, bounds: list[tuple[int, int]], into: Output | None
    ) -> list[Ticket]:
        tickets = self.engine.submit_parts(key, job.rows, job.policy, job.remaining(), bounds, into)
        for ticket in tickets:
            ticket.limit = job.timeout  # the batch's, as the caller gave it
        return tickets
