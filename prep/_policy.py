"""What a batch does with ragged rows and with bad ones: the options every
executor honours (``pad=``, ``pad_to=``, ``on_error=``, ``fill=``), and the rows
that failed under ``on_error='fill'`` or ``'skip'``."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from ._padding import Number, Padding

ON_ERROR = ("raise", "fill", "skip")


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

    def __len__(self) -> int:
        return len(self.errors)

    def rows(self) -> list[int]:
        with self._lock:
            return sorted(self.errors)

    def warn(self, rows: int, policy: Policy, stacklevel: int) -> None:
        """One warning a call: how many rows, the first failing row and its error."""
        first = min(self.errors)
        what = "filled" if policy.on_error == "fill" else "left out"
        warnings.warn(
            f"{len(self.errors)} of {rows} rows failed and were {what} "
            f"(on_error={policy.on_error!r}); the first: {self.errors[first]}",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
