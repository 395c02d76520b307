"""``executor="threads"``: one batch cut into parts on a queue that daemon threads take
them from, the same threads a stream's batches run on (``_batch_threads``).

Threads pay off when the row function releases the GIL (most torch ops on
tensors of a few thousand elements or more); a pure-Python row function runs
no faster than ``serial``. Each worker thread runs torch on ``cores // workers``
intra-op threads (worker processes on one: ``_base.PROCESS_THREADS`` says why), set
once in that thread: torch's OpenMP setting is per thread, so the caller's own
setting is never touched.
(Capping it in the calling thread around each batch, as prep once did, left
the workers' OpenMP teams alive next to the caller's; libgomp then throttles
every team's spinning once it manages more threads than cores, and small torch
ops in the caller's thread ran up to 4x slower for as long as the pool lived.)

A batch goes out in a few parts per worker (one queue, so a fast thread takes
up the slack), the path every batch cut across workers takes (``_parts``):
written in place once the function has shown its output's shape, else in
chunks merged in order.
Under ``seed=`` nothing seeds the process's global generators here (the caller's
other threads draw from them too): a row function with ``rng`` gets a generator
seeded for the row; any other runs watched, and a draw stops the batch with a
ConfigError (``shares_generators``; ``core.seeding`` says how).
A row that hangs cannot be killed from outside its thread: on ``timeout`` the
batch raises :class:`~prep.BatchTimeout`, the stuck thread is abandoned (it is
a daemon, so it does not block interpreter exit) and a fresh thread takes its
place.
"""

from __future__ import annotations

from ..core.output import Output
from ._base import Executor, Traits
from ._batch_threads import ThreadBatches
from ._job import Job
from ._parts import Parts

#: parts per worker of a batch: one queue, so a thread that is done first takes more;
#: each part costs a hand-over between threads (2 a worker was 10% faster than 4 on 64
#: rows of 128x128 matmuls, and than the executor before it)
PARTS = 2


class ThreadExecutor(Executor):
    name = "threads"
    traits = Traits(stream_workers=("threads",), shares_generators=True)

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        #: the threads: this executor's batches, and a stream's (``Executor.engine``)
        self.engine = ThreadBatches(self.workers)

    def run(self, job: Job) -> Output | None:
        if job.start >= len(job.rows):
            return job.sink.output
        return Parts(self.engine, job, self.workers * PARTS).result()
