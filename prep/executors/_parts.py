"""A batch's parts: the one path of every batch cut across an engine's workers.

``map_rows`` on ``threads`` or ``processes`` and a stream's split batches all take
it; a change to how a batch is cut, guessed, merged or isolated is made here::

    Parts(engine, job, parts)                            the engine's workers
    ─────────────────────────                            ────────────────────
    cut rows start:n into ``parts`` ranges
    guess the output (the function's last shape) ─┐
    submit a range each ─────────────────────────┴─────▶ rows a:b: written in place
                                                          (into the guess), or a chunk
    result(): the tickets in row order ◀─────────────────┘
      chunks merged (``_chunks``); a dead worker's rows run again alone under
      fill/skip (``_isolation``); rows unlike the guess (a StackError): the batch
      again, unguessed, once; the shape kept for the next batch

The guess and the retry are why a batch's second run costs no copy: once a
function and row layout has shown its output's shape, the next batch's output is
made before any row runs (in shared memory for worker processes) and the workers
write their rows there.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..core.output import Output
from ..errors import StackError, WorkerCrashed
from ._base import copy_rows, first_error, split
from ._chunks import ChunkMerge
from ._fdpipe import INLINE
from ._handles import how_it_ended
from ._isolation import Isolation
from ._job import Job
from ._messages import Chunk
from ._shapes import Known
from ._ticket import Part, Ticket, Unit, abandon
from ._transport import check_shm

__all__ = ["Engine", "Parts"]


class Engine(Protocol):
    """What :class:`Parts` uses of an engine (``ThreadBatches``, ``ProcessBatches``)."""

    def prepare(self, fn: Any) -> Known: ...

    def submit(self, units: list[Unit]) -> list[Ticket]: ...


class Parts:
    """Rows ``job.start:`` of one batch, submitted in ``parts`` ranges on ``engine``;
    :meth:`result` waits for them and fills ``job.sink``."""

    def __init__(self, engine: Engine, job: Job, parts: int, known: Known | None = None) -> None:
        self.engine, self.job = engine, job
        self.known = engine.prepare(job.fn) if known is None else known
        self.given = job.sink.output  # out=, or a part of auto's that shaped the output
        self.bounds = split(job.start, len(job.rows), parts)
        self.into = self._into()
        self.tickets = self._submit(self.bounds)
        self._isolation = Isolation(job)

    def _into(self) -> Output | None:
        """Where the workers write in place: the guessed output or the given one (for
        worker processes: in shared memory, staged where it is not); None for chunks
        (rows that may differ in size or fail alone, an unknown shape, or an output
        small enough to come back inside the messages)."""
        job, other = self.job, self.known.shared
        if not job.policy.plain:
            return None
        given = self.given
        if given is None:
            return self.known.guess(job.rows.layout(), len(job.rows))
        if not other:
            return given
        if min(b.nbytes for b in given.buffers) <= INLINE:
            return None
        if all(b.is_shared() and b.is_contiguous() for b in given.buffers):
            return given
        check_shm(given.nbytes, "the output")
        return given.like(shared=True)  # staging: copied into out= at the end

    def _submit(self, bounds: list[tuple[int, int]]) -> list[Ticket]:
        job, key, left = self.job, self.known.key, self.job.remaining()
        return self.engine.submit(
            [Part(key, job.rows, job.policy, left, b, self.into, job.timeout) for b in bounds]
        )

    def _gather(self) -> None:
        """Wait for the parts, in row order: each merged into ``job.sink`` (or, given
        ``into``, already written there), the progress bar advanced; once every part is
        back, the lowest row's error raised (serial's first). Under fill/skip the rows of
        a part whose worker died run again, each alone (``_isolation``). The parts still
        out are abandoned on Ctrl-C while waiting."""
        job, into, pending = self.job, self.into, list(self.tickets)
        merge = ChunkMerge(job) if into is None else None
        errors: list[BaseException] = []
        try:
            while pending:
                ticket = pending.pop(0)
                try:
                    ticket.result()
                except WorkerCrashed as exc:
                    if ticket.crashed and job.policy.per_row_errors:  # its rows again, alone
                        how = how_it_ended(exc.exitcode)
                        lost = self._isolation.lost(ticket.bounds(), f"worker pid {exc.pid}", how)
                        pending += self._submit(lost)
                        continue
                    errors.append(exc)
                except Exception as exc:  # a row's, the deadline's: the lowest row's wins
                    errors.append(exc)
                else:
                    if merge is not None:
                        assert isinstance(ticket.reply, Chunk), "a part resolved has its chunk"
                        merge.take(ticket.reply, errors)
                ticket.reply = None  # its chunk's shared memory goes once merged
                start, stop = ticket.bounds()
                job.sink.advance(stop - start)
        except BaseException:  # Ctrl-C while waiting: the parts still out are dropped
            abandon(pending)  # their workers freed (``Ticket``)
            raise
        if errors:
            raise first_error(errors)
        if into is not None and job.sink.output is None:
            job.sink.adopt(into)

    def result(self) -> Output | None:
        """The batch's output once every part is back (None: every row failed under
        fill/skip); the lowest row's error raised, as serial meets it first."""
        job, known, layout = self.job, self.known, self.job.rows.layout()
        try:
            self._gather()
        except StackError:
            if self.into is None or self.given is not None:
                raise
            # rows unlike the last batch's: the batch again as a first batch runs, so that
            # the error names what serial names (or it is no error: its own shape)
            known.forget(layout)
            self.into = None
            self.tickets = self._submit(self.bounds)
            self._gather()
        out = job.sink.output
        if out is None:
            return None
        if job.policy.plain and self.given is None:
            known.keep(layout, out)
        if self.given is not None and self.into is not None and self.into is not self.given:
            job.sink.output = copy_rows(self.given, self.into, job.start)
        return job.sink.output

    def slowest(self) -> tuple[float, int] | None:
        """The busy seconds and rows of the part slowest per row (None: none was timed)."""
        timed = [(t.busy, t.bounds()) for t in self.tickets if t.busy is not None]
        if not timed:
            return None
        busy, (start, stop) = max(timed, key=lambda x: x[0] / max(1, x[1][1] - x[1][0]))
        return busy, stop - start
