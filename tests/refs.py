"""What a plain loop gives: the references the executor, ragged, fill and stream tests
compare with, built without prep's output, padding or sink code (``torch.stack`` and
``torch.nn.functional.pad`` over the rows, one by one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def padded(row: torch.Tensor, size: Sequence[int], value: float) -> torch.Tensor:
    """``row`` padded with ``value`` at the end of every dim to ``size``."""
    widths = [p for s, have in zip(reversed(size), reversed(row.shape)) for p in (0, s - have)]
    return F.pad(row, widths, value=value) if any(widths) else row


def loop(
    fn: Callable[[Any], torch.Tensor],
    samples: Sequence[Any],
    *,
    pad: float | None = None,
    pad_to: Sequence[int] | None = None,
    on_error: str = "raise",
    fill: float | None = None,
    return_lengths: bool = False,
    return_valid: bool = False,
) -> Any:
    """``map_samples(fn, samples, **options)`` as a loop computes it, for a function of
    one tensor result: each row padded to the longest good row (or ``pad_to``), a
    failed row filled whole with ``fill`` (default: ``pad``, else 0) or left out;
    ``(out, lengths, valid)``, those asked for. Under ``on_error="raise"`` the row's
    own exception propagates."""
    results: list[torch.Tensor | None] = []
    for sample in samples:
        try:
            results.append(fn(sample).detach())
        except Exception:
            if on_error == "raise":
                raise
            results.append(None)
    good = [r for r in results if r is not None]
    ragged = pad is not None or pad_to is not None
    if pad_to is not None:
        size = tuple(pad_to)
    elif ragged:
        size = tuple(max(r.shape[d] for r in good) for d in range(good[0].dim()))
    else:
        size = tuple(good[0].shape)
    value = 0 if pad is None else pad
    filler = fill if fill is not None else value
    rows, lengths = [], []
    for r in results:
        if r is None:
            if on_error == "fill":
                rows.append(torch.full(size, filler, dtype=good[0].dtype))
                lengths.append(0 if len(size) == 1 else [0] * len(size))
            continue
        rows.append(padded(r, size, value) if ragged else r)
        lengths.append(r.shape[0] if r.dim() == 1 else list(r.shape))
    out: list[Any] = [torch.stack(rows)]
    if return_lengths:
        out.append(torch.tensor(lengths, dtype=torch.int64))
    if return_valid:
        out.append(torch.tensor([r is not None for r in results]))
    return out[0] if len(out) == 1 else tuple(out)
