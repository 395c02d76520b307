"""What ``auto`` tells of one signature, and the key it keeps it under.

A :class:`Calibration` is the report: what was measured (by the calibrator, on
the first batch) and observed (every batch auto runs is timed), what was left
out and why, what happened, and the choice. It is what ``prep.explain`` returns
and ``print`` shows; the decisions that move it are
:class:`~prep.auto._decisions.Decisions`'. The cache key of a choice is
:func:`signature`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.identity import key
from ..core.rows import Rows
from ._explain import render
from ._figures import Figures


class Calibration(Figures):
    """What ``auto`` measured, predicted, observed and chose for one signature: the
    figures (:class:`~prep.auto._figures.Figures`' fields, for code), and ``print``
    shows why in a few lines. :class:`~prep.auto._decisions.Decisions` moves it."""

    def __str__(self) -> str:
        return render(self)


# ---------------------------------------------------------------- signature


def signature(fn: Callable[..., Any], rows: Rows, pinned: bool, policy: Any = None) -> Any:
    """What a cached choice is valid for (everything but the number of rows); with
    ``pad=`` or ``on_error=`` another choice (they rule batched forms in or out)."""
    return (key(fn), rows.layout(), pinned, repr(policy))
