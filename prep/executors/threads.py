"""``executor="threads"``: one batch cut into parts on a queue that daemon threads take
them from, the same threads a stream's batches run on (``_batch_threads``).

Threads pay off when the row function releases the GIL (most torch ops on
tensors of a few thousand elements or more); a pure-Python row function runs
no faster than ``serial``. Each worker thread runs torch on ``cores // workers``
intra-op threads, as worker processes do, set once in that thread: torch's
OpenMP setting is per thread, so the caller's own setting is never touched.
(Capping it in the calling thread around each batch, as prep once did, left
the workers' OpenMP teams alive next to the caller's; libgomp then throttles
every team's spinning once it manages more threads than cores, and small torch
ops in the caller's thread ran up to 4x slower for as long as the pool lived.)

The first row runs alone and shapes the output; the rest go out in a few parts
per worker (one queue, so a fast thread takes up the slack), each written in
place. Where rows may differ in size or fail on their own (``pad=``,
``on_error=``), parts are chunks of their own, merged in order (``_chunks``).
A row that hangs cannot be killed from outside its thread: on ``timeout`` the
batch raises :class:`~prep.BatchTimeout`, the stuck thread is abandoned (it is
a daemon, so it does not block interpreter exit) and a fresh thread takes its
place.
"""

from __future__ import annotations

from ..core.output import Output
from ._base import Executor, Traits, split
from ._batch_threads import ThreadBatches
from ._chunks import gather
from ._job import Job
from ._ticket import Ticket

#: parts per worker of a batch: one queue, so a thread that is done first takes more;
#: each part costs a hand-over between threads (2 a worker was 10% faster than 4 on 64
#: rows of 128x128 matmuls, and than the executor before it)
PARTS = 2


class ThreadExecutor(Executor):
    name = "threads"
    traits = Traits(stream_workers=("threads",))

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        #: the threads: this executor's batches, and a stream's (``Executor.engine``)
        self.engine = ThreadBatches(self.workers)

    def close(self) -> None:
        self.engine.close()

    def run(self, job: Job) -> Output | None:
        n, first = len(job.rows), job.start
        if first >= n:
            return job.sink.output
        if job.policy.plain and job.sink.output is None:
            self._parts(job, [(first, first + 1)], None)  # its result shapes the output
            first += 1
        into = job.sink.output if job.policy.plain else None
        if first < n:
            self._parts(job, split(first, n, self.workers * PARTS), into)
        return job.sink.output

    def _parts(self, job: Job, bounds: list[tuple[int, int]], into: Output | None) -> None:
        """Rows ``bounds`` on the threads, written into ``into`` or merged into ``job.sink``
        in order as they come back; the lowest row's error raised once all are back."""
        tickets = self.engine.submit_parts(
            job.fn, job.rows, job.policy, job.remaining(), bounds, into
        )
        for ticket in tickets:
            ticket.limit = job.timeout  # the batch's, as the caller gave it
        gather(job, tickets, into, _cancel)


def _cancel(tickets: list[Ticket]) -> None:
    for ticket in tickets:  # those not started are dropped; one that runs finishes alone
        ticket.cancel()
