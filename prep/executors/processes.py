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
worker (``_shapes.Known``). Once a
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
from ._base import Executor, Traits
from ._batches import ProcessBatches
from ._job import Job
from ._parts import Parts
from ._transport import pickle_fn, shm_fits, shm_free

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

    def release(self) -> bool:
        return self.engine.release()

    # -------------------------------------------------------------- one batch

    def run(self, job: Job) -> Output | None:
        """Rows ``job.start:`` in a part per worker (fewer for light rows, more with a
        progress bar) on the engine's workers (``_parts``)."""
        n = len(job.rows)
        if job.start >= n:
            return job.sink.output
        known = self.engine.prepare(job.fn)
        if job.sink.progress is not None:
            parts = self.workers * PROGRESS_PARTS
        else:  # light rows: fewer parts, as many as pay for their messages (``Known.parts``)
            parts = known.parts(n - job.start, self.workers)
        batch = Parts(self.engine, job, parts, known)
        out = batch.result()
        if (slowest := batch.slowest()) is not None:  # what a row costs a worker
            known.timed(*slowest)
        return out
