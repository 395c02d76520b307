"""What a batch does with ragged rows and with bad ones: the options every
executor honours (``pad=``, ``pad_to=``, ``on_error=``, ``fill=``), and the rows
that failed under ``on_error='fill'`` or ``'skip'``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._warn import warn
from ..errors import StackError
from .output import Output, detached, flatten
from .padding import Number, Padding

ON_ERROR = ("raise", "fill", "skip")
#: :attr:`ResultCheck.row` where ``out=`` holds the reference
OUT = -1


@dataclass(frozen=True)
class Policy:
    """``padding`` (None: every row returns equal shapes), ``on_error`` and ``fill``."""

    padding: Padding | None = None
    on_error: str = "raise"
    fill: Number | None = None  # a failed row's value (None: the pad value, else 0)

    @classmethod
    def of(
        cls, pad: Any = None, pad_to: Any = None, on_error: Any = "raise", fill: Any = None
    ) -> Policy:
        """The options as given to ``map_rows`` and friends, checked."""
        if on_error not in ON_ERROR:
            raise ValueError(
                f"on_error={on_error!r} is not one of {', '.join(map(repr, ON_ERROR))}; "
                f"'fill' fills a failed row with fill=, 'skip' leaves it out"
            )
        if fill is not None and not isinstance(fill, (bool, int, float)):
            raise TypeError(f"fill={fill!r} is not a number; e.g. fill=0 or fill=float('nan')")
        if fill is not None and on_error == "raise":
            raise ValueError(
                f"fill={fill!r} is for failed rows, but on_error='raise' fails the batch; "
                f"pass on_error='fill' too"
            )
        if pad_to is not None and pad is None:
            pad = 0  # a fixed size needs a value to pad with: zeros, as torch.zeros would
        padding = Padding(pad, pad_to) if pad is not None else None
        return cls(padding, on_error, fill)

    @property
    def plain(self) -> bool:
        """Equal rows, and the first error fails the batch: rows written in place."""
        return self.padding is None and self.on_error == "raise"

    @property
    def per_row_errors(self) -> bool:
        return self.on_error != "raise"

    def describe(self) -> str:
        parts = [self.padding.describe()] if self.padding else []
        if self.per_row_errors:
            parts.append(f"on_error={self.on_error!r}")
            if self.fill is not None:
                parts.append(f"fill={self.fill!r}")
        return ", ".join(parts)


RAISE = Policy()


@dataclass
class Failures:
    """Rows that failed, with their errors, from any thread of the batch."""

    errors: dict[int, BaseException] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, row: int, error: BaseException) -> None:
        with self._lock:
            self.errors.setdefault(row, error)

    def forgive(self, row: int) -> None:
        """Row ``row`` did not fail after all (a worker's provisional verdict)."""
        with self._lock:
            self.errors.pop(row, None)

    def __len__(self) -> int:
        return len(self.errors)

    def forget(self, start: int) -> None:
        """Forget the rows from ``start`` on: they run again, another way."""
        with self._lock:
            for row in [r for r in self.errors if r >= start]:
                del self.errors[row]

    def rows(self) -> list[int]:
        with self._lock:
            return sorted(self.errors)

    def warn(self, rows: int, policy: Policy, place: tuple[int, int] | None = None) -> None:
        """One warning a call: how many rows, the first failing row and its error, at
        the user's line (:func:`prep._warn.warn`); in a stream, ``place`` (the batch's
        number and the rows before it) says which batch, and the row's place overall."""
        first = min(self.errors)
        what = "filled" if policy.on_error == "fill" else "left out"
        where = ""
        if place is not None:
            number, before = place
            where = f" (batch {number} of the stream: row {before + first} of the stream)"
        warn(
            f"{len(self.errors)} of {rows} rows failed and were {what} "
            f"(on_error={policy.on_error!r}); the first: {self.errors[first]}{where}"
        )


class ResultCheck:
    """Under ``on_error='fill'``/``'skip'``: a row result that could not go into the
    batch's output fails its row, as an exception in the row function would, so it
    is filled or left out, with its row's index, on every executor.

    Bad: anything but a Tensor, a tuple or a dict of Tensors (None, a list of
    numbers), or another structure, dtype or number of dims than the first good
    row's (or ``out=``'s); without ``pad=`` another shape too. It is called where the
    row ran; a worker process gets a copy, with the reference as it was when its
    rows were sent (an executor seeds it from the first row, run alone, where it
    can), and :meth:`admit` checks a worker's chunk of rows as a whole.
    """

    def __init__(self, padded: bool, out: Any = None) -> None:
        self.padded = padded
        self.first: tuple[Any, ...] | None = None  # the reference: (spec, leaves' layouts)
        self.row: int | None = None  # the row that returned it (None: learned as rows ran)
        # False where a lower chunk's first row may yet replace the reference (a chunk set
        # it, or a worker's chunk learned its own): rows failed against it carry results
        self.final = True
        self.admitted: list[tuple[int, int]] = []  # chunks' rows admitted under it
        self.pending: dict[int, Any] = {}  # rows failed provisionally, with their results
        # chunks refused under a reference a lower chunk may replace: (chunk, its rows,
        # the rows the refusal failed)
        self.refused: list[tuple[Output, int, int, list[int]]] = []
        if out is not None:
            try:
                self.first = self._of(Output.given(out, len(flatten(out, "out=")[1][0])))
                self.row = OUT
            except (TypeError, ValueError, IndexError):
                pass  # the batch's own check of out= says what is wrong with it

    @property
    def origin(self) -> str:
        """Whose result the reference is, for messages."""
        if self.row is None:
            return "the first good row returned"
        return "out= holds" if self.row == OUT else f"row {self.row} returned"

    def _leaf(self, dtype: torch.dtype, shape: Sequence[int]) -> tuple[Any, ...]:
        return (dtype, len(shape)) if self.padded else (dtype, tuple(shape))

    def _of(self, out: Output) -> tuple[Any, ...]:
        return (out.spec, tuple(self._leaf(b.dtype, b.shape[1:]) for b in out.buffers))

    def __call__(self, result: Any) -> None:
        first = self.first
        if type(result) is torch.Tensor and first is not None and first[0].kind == "tensor":
            # the common case, kept short: one tensor like the reference's
            dtype, size = first[1][0]
            if result.dtype == dtype and (result.dim() if self.padded else result.shape) == size:
                return
        layout = self._layout(result)  # a TypeError that says what it must return
        if self.first is None:
            self.first = layout  # threads may race here: each with a good row's layout
        elif layout != self.first:
            error = StackError(self._differs(layout, "the row function returned"))
            if not self.final:  # the parent may find this row good: it travels along
                error.result = detached(result)  # type: ignore[attr-defined]
            raise error

    def _layout(self, result: Any) -> tuple[Any, ...]:
        spec, leaves = flatten(result)
        return (spec, tuple(self._leaf(t.dtype, t.shape) for t in leaves))

    def matches(self, result: Any) -> bool:
        """Whether ``result`` has the reference's layout (a provisional failure that the
        batch's reference makes good)."""
        return self.first is not None and self._layout(result) == self.first

    def __getstate__(self) -> dict[str, Any]:
        # to a worker: the reference only, not the parent's record of admitted chunks
        return {**self.__dict__, "admitted": [], "pending": {}, "refused": []}

    def fresh(self) -> ResultCheck:
        """A copy with this one's reference (if any), that learns its own: a worker's
        chunk must not keep the reference an earlier chunk learned there (a bad row
        that came first in it would fail every row of the worker's later chunks)."""
        copy = ResultCheck(self.padded)
        copy.first, copy.row = self.first, self.row
        # without a reference from the parent, this chunk's is its own first good row,
        # which the batch's may not be: rows failed against it carry their results
        copy.final = self.final and self.first is not None
        return copy

    def seed(self, out: Output) -> None:
        """The rows to come are checked against ``out`` (the batch's output, shaped by
        its first good row)."""
        if self.first is None:
            self.first, self.row = self._of(out), out.first_row

    def admit(self, chunk: Output, start: int, stop: int) -> tuple[str | None, list[int]]:
        """A worker's chunk of rows ``start:stop`` against the reference: why its rows
        fail (None: it joins the output), and the rows admitted before that fail instead.

        Where no reference was seeded, the first chunk to come back is one; but chunks
        come back in any order, and serial's reference is the lowest good row. So a
        chunk with a lower first row that disagrees takes over, and the rows admitted
        under the old reference fail (the caller then remakes the output)."""
        layout, row = self._of(chunk), chunk.first_row
        if self.first is not None and layout == self.first:
            self.admitted.append((start, stop))
            return None, []
        lower = not self.final and self.row is not None and row < self.row
        if self.first is not None and not lower:
            return self._differs(layout, f"row {row} returned"), []
        dropped = [i for a, b in self.admitted for i in range(a, b)]
        old, old_row = self.first, self.row
        self.first, self.row, self.final = layout, row, False
        self.admitted = [(start, stop)]
        if old is None or not dropped:
            return None, []
        return self._differs(old, f"row {old_row} returned"), dropped

    def _differs(self, layout: tuple[Any, ...], what: str) -> str:
        first = self.first if self.first is not None else layout
        return (
            f"{what} {_layout_text(layout)}, but {self.origin} {_layout_text(first)}; "
            f"every row must return the same structure and dtypes"
            + ("" if self.padded else " and shapes (pass pad= for ragged rows)")
        )


def _layout_text(layout: tuple[Any, ...]) -> str:
    spec, leaves = layout
    parts = [
        f"{f'shape {s}' if isinstance(s, tuple) else f'{s}-d'} {str(d).removeprefix('torch.')}"
        for d, s in leaves
    ]
    if spec.kind == "tensor":
        return f"a Tensor of {parts[0]}"
    names = spec.keys or range(spec.n)
    return f"a {spec.kind} of {{{', '.join(f'{k!r}: {p}' for k, p in zip(names, parts))}}}"
