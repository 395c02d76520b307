"""What ``auto`` tells of one signature, and the key it keeps it under.

A :class:`Calibration` is the report: what was measured (by the calibrator, on
the first batch) and observed (every batch auto runs is timed), what was left
out and why, what happened, and the choice. It is what ``prep.explain`` returns
and ``print`` shows; the decisions that move it are
:class:`~prep.auto._decisions.Decisions`'. The cache key of a choice is
:func:`signature`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from .._rows import Rows
from .._rowwise import unwrap_partial
from ._explain import CalibrationText
from ._figures import Figures


class Calibration(Figures):
    """What ``auto`` measured, predicted, observed and chose for one signature: the
    figures (:class:`~prep.auto._figures.Figures`' fields, for code), and ``print``
    shows why in a few lines. :class:`~prep.auto._decisions.Decisions` moves it."""

    def __str__(self) -> str:
        return str(CalibrationText(self))


# ---------------------------------------------------------------- signature


def _value_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), str(v.device))
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return (type(v).__qualname__, id(v))


def _fn_key(fn: Callable[..., Any]) -> Any:
    """Ids stay unique only while their objects live: ``Auto`` keeps ``fn`` (and with
    it everything this key names) alive for as long as it keeps the choice."""
    fn, args, kwargs = unwrap_partial(fn)
    if isinstance(fn, types.MethodType):  # ``obj.method`` is a new object at every access
        method: types.MethodType = fn
        fn, args = method.__func__, (method.__self__, *args)
    return (
        id(fn),
        tuple(map(_value_key, args)),
        tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())),
    )


def signature(fn: Callable[..., Any], rows: Rows, pinned: bool, policy: Any = None) -> Any:
    """What a cached choice is valid for (everything but the number of rows); with
    ``pad=`` or ``on_error=`` another choice (they rule batched forms in or out)."""
    return (_fn_key(fn), rows.layout(), pinned, repr(policy))
