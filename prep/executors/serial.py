"""The reference executor: one row after another in the calling thread."""

from __future__ import annotations

from ..core.output import Output
from ._base import Executor, Traits
from ._job import Job


class SerialExecutor(Executor):
    """Every other executor must match this one bit for bit.

    ``timeout`` is checked between blocks of rows: a row that never returns
    cannot be interrupted in the calling thread.
    """

    name = "serial"
    traits = Traits(in_caller=True)

    def __init__(self, workers: int | None = 1) -> None:
        super().__init__(workers)

    def run(self, job: Job) -> Output | None:
        job.run_range(job.start, len(job.rows))
        return job.sink.output  # None if every row failed (or there are none)
