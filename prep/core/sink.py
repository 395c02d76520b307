"""Where one batch's rows land: its output, the rows that failed, and progress.

A :class:`Sink` is shared by everything that writes one batch: the parts an
executor cuts it into (``Job.part``), every thread of a pool, and the parent's
merge of what worker processes send back. The output is the caller's
(``out=``), or allocated from the first result stored (shaped by it, and by
``pad=``); a failed row (``on_error='fill'``/``'skip'``) is noted with its error
and filled, whether the output exists yet or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RowError, WorkerCrashed
from .output import Output, in_shm
from .padding import allocate
from .policy import RAISE, Failures, Policy

__all__ = ["Sink"]


@dataclass
class Sink:
    """The output of a batch of ``rows`` rows (the first of them row ``offset`` of the
    batch), its failed rows, and whom to tell as rows finish."""

    rows: int
    policy: Policy = RAISE  # its padding (the output grows to the longest row), its fill
    offset: int = 0
    output: Output | None = None
    pin: bool = False  # allocate the output in pinned memory (a CUDA copy follows)
    shared: bool = False  # allocate the output in shared memory (a worker's chunk)
    failures: Failures = field(default_factory=Failures)
    progress: Callable[[int], None] | None = None  # told as rows finish (progress=True)

    def store(self, i: int, result: Any) -> None:
        """Row ``i``'s result, the output allocated from it if there is none yet."""
        if self.output is None:
            self.adopt(
                allocate(
                    result,
                    self.rows,
                    padding=self.policy.padding,
                    row=i,
                    pin=self.pin,
                    shared=self.shared,
                    offset=self.offset,
                )
            )
        assert self.output is not None
        self.output.write(i, result)

    def adopt(self, output: Output) -> None:
        """``output`` becomes the batch's, filled where rows failed before it existed."""
        self.output = output
        for row in self.failures.rows():
            output.fail(row, self.policy.fill)

    def merge(self, chunk: Output) -> None:
        """A worker's chunk of rows into the output (made like it, if there is none). A
        chunk of every row, in private memory, is the output itself: no copy."""
        if self.output is None and self._whole(chunk):
            self.adopt(chunk)
            return
        if self.output is None:
            self.adopt(chunk.like(self.rows, pin=self.pin))
        assert self.output is not None
        self.output.merge(chunk)

    def _whole(self, chunk: Output) -> bool:
        # a plain output (a padded one is trimmed to its rows' longest), not in shared
        # memory (the caller's result would hold /dev/shm), and not to be pinned
        return (
            type(chunk) is Output
            and chunk.offset == self.offset
            and not self.pin
            and all(len(b) == self.rows and not in_shm(b) for b in chunk.buffers)
        )

    def advance(self, rows: int) -> None:
        """``rows`` more rows finished (written or failed): for a progress bar."""
        if self.progress is not None:
            self.progress(rows)

    def fail(self, i: int, error: RowError) -> None:
        """Row ``i`` failed under ``on_error='fill'``/``'skip'``: noted, and filled."""
        self.failures.add(i, error)
        if self.output is not None:
            self.output.fail(i, self.policy.fill)

    def killed(self, i: int, worker: str, how: str = "") -> None:
        """Row ``i`` killed ``worker`` (e.g. "worker pid 12") while it ran alone: a failed
        row, its cause a :class:`~prep.errors.WorkerCrashed` naming the worker."""
        died = f"{worker} died" + (f" with {how}" if how else "")
        err = RowError(
            i,
            f"row {i}: {died} running it alone: a segfault, abort or exit in the row "
            f"function, or the OS killed it for memory",
        )
        err.__cause__ = WorkerCrashed(f"{died} on row {i}")
        self.fail(i, err)
