"""Workers' chunks of one batch, merged into its sink by the parent.

Where rows may differ in size or fail on their own (``pad=``, ``on_error=``), a
worker builds its rows into a chunk of its own, and the parent merges the
chunks: ``processes``' ranges (``_dispatch``), ``joblib``'s tasks and a stream's
parts (``_parts``). Under ``on_error='fill'``/``'skip'`` a worker checks its
rows against its own chunk's first row, having no other; the batch's reference
is the first row of the lowest chunk (:meth:`ResultCheck.admit`), so the parent
may refuse a chunk that disagrees with it, take it in after all once a lower
chunk replaces the reference, and write rows a worker failed against its own
reference that the batch's finds good.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.output import Output
from ..core.policy import ResultCheck
from ..errors import RowError, StackError
from ._job import Job
from ._messages import Chunk
from ._worker import error_from_reply

__all__ = ["ChunkMerge"]


class ChunkMerge:
    """Chunks into ``job``'s sink, by the batch's :class:`ResultCheck` where its rows
    carry one (the check keeps the state between chunks)."""

    def __init__(self, job: Job) -> None:
        self.sink = job.sink
        check = getattr(job.rows, "check", None)
        self.check = check if isinstance(check, ResultCheck) else None

    def take(self, reply: Chunk, errors: list[BaseException]) -> None:
        """:meth:`merge`; a chunk that does not fit the output is an error noted in
        ``errors``, not raised: a lower row's error may still come back, and the
        lowest row's is the one serial would have met (``first_error``)."""
        try:
            self.merge(reply)
        except StackError as exc:
            errors.append(exc)

    def merge(self, reply: Chunk) -> None:
        """A :class:`~._messages.Chunk`: its rows, and its failed rows noted. Under
        ``on_error='fill'``/``'skip'`` a chunk whose rows return another dtype or rank
        than the batch's reference is a chunk of failed rows, each with the reason."""
        start, stop, chunk, failed = reply.start, reply.stop, reply.output, reply.failed
        sink, check = self.sink, self.check
        for error_reply in failed:
            err = error_from_reply(error_reply)
            if not isinstance(err, RowError):
                raise err  # not a row's own failure (a fill= that does not fit, say)
            sink.fail(err.row, err)
            result = getattr(err.__cause__, "result", None)
            if result is not None and check is not None:
                check.pending[err.row] = result  # failed against its chunk's own reference
        if check is None:
            if chunk is not None:
                sink.merge(chunk)
            return
        if chunk is not None:
            self._admit(check, chunk, start, stop)
        self._take_back(check)

    def _admit(self, check: ResultCheck, chunk: Output, start: int, stop: int) -> None:
        """A chunk whose rows agree with the batch's reference joins the output; one that
        disagrees fails, or (a lower row's) becomes the reference, the rows before failing."""
        problem, dropped = check.admit(chunk, start, stop)
        if problem is not None and not dropped:
            # a chunk with a lower first row may yet replace the reference it disagrees with
            failed = self._fail_all(range(start, stop), problem)
            check.refused.append((chunk, start, stop, failed))
            return
        if dropped:
            self.sink.output = None  # remade from this chunk
        self.sink.merge(chunk)
        if problem is not None:
            self._fail_all(dropped, problem)
        self._readmit(check)

    def _readmit(self, check: ResultCheck) -> None:
        """Chunks refused under a reference that a lower row's chunk has since replaced:
        those that agree with the new one join the output after all (the refusal's
        failures taken back; their rows' own failures stay)."""
        sink = self.sink
        refused, check.refused = check.refused, []
        for chunk, start, stop, failed in refused:
            if check.admit(chunk, start, stop)[0] is not None:
                check.refused.append((chunk, start, stop, failed))
                continue
            assert sink.output is not None, "a reference was set: its chunk made the output"
            for i in failed:
                sink.failures.forgive(i)
                sink.output.unfail(i)
            sink.merge(chunk)

    def _take_back(self, check: ResultCheck) -> None:
        """Rows a worker failed against its chunk's own first row that the batch's
        reference finds good: written after all, their failure taken back."""
        sink = self.sink
        if sink.output is None:
            return
        for i, result in list(check.pending.items()):
            if i in sink.failures.errors and check.matches(result):
                del check.pending[i]
                sink.failures.forgive(i)
                sink.output.unfail(i)
                sink.output.write(i, result)
                check.admitted.append((i, i + 1))

    def _fail_all(self, rows: Iterable[int], problem: str) -> list[int]:
        """Each of ``rows`` not failed yet fails with a StackError saying ``problem``;
        returns those."""
        failed = [i for i in rows if i not in self.sink.failures.errors]
        for i in failed:
            err = RowError(i, f"row {i}: StackError: {problem}")
            err.__cause__ = StackError(problem)
            self.sink.fail(i, err)
        return failed
