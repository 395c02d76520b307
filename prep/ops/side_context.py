"""Side context: the tokens left or right of a masked span, padded to a fixed length.

Three forms with one meaning, checked bit for bit against each other:

* :func:`side_context` -- the batch at once, no Python loop over rows;
* :func:`side_context_row` -- one row, marked with :func:`prep.rowwise` so every
  executor (``vectorized`` included, which calls :func:`side_context`) can run it;
* the repository's ``benchmarks.baselines.side_context_loop`` -- the loop from the
  question prep grew out of (slice each row, ``torch.cat`` the padding, ``torch.stack``),
  with its bugs fixed: the benchmarks' baseline, not an op.

The meaning, for row ``b`` with valid length ``n = lengths[b]`` (``L`` if not given):

* ``left``: positions ``[0, min(first, n))``, ``first`` being the first nonzero
  of ``mask[b]``; the ``max_len`` nearest the span are kept and padding goes in
  front, so the token next to the span is the last one;
* ``right``: positions ``[last + 1, n)``; the ``max_len`` nearest the span are
  kept and padding goes behind;
* an all-zero mask row gives all padding. ``mask`` is read over the whole row;
  ``lengths`` only bounds the *context*, on both sides: nothing at or beyond
  ``lengths[b]`` is ever copied (a span that starts in the padding gets the
  row's valid tokens as left context and nothing on the right).

How :func:`side_context` stays at the memory-copy limit: row ``b``'s slots are
one contiguous run of the ``[B * L, *F]`` view of ``inputs``, i.e. one window of
the overlapping view ``flat.unfold(0, max_len, 1)``. So the copy is a single
``index_select`` of those windows (one int64 index per row, one contiguous block
per row) straight into ``out``, and then only the padding slots are
overwritten. Its temporaries are ``[B]`` and ``[B, max_len]`` bool, never of the
output's size. (The first and last few rows, whose windows could leave the
batch, take one index per slot.) On a 2-core CPU (B=256, L=512, F=768,
max_len=128) that copy ran at the speed of ``out.copy_`` of the same bytes and
the whole call at 1.3x, where one index per output slot took 1.1-2.3x as long
for the copy alone, ``torch.gather`` with an expanded index about 6x, and a
``masked_fill_`` of the padding adds a second pass over the output; see
``scripts/bench_side_context.py``. On CUDA the padding does take that masked
pass, because finding the padding slots needs ``nonzero()``, a host sync; no
CUDA call syncs except the range check of ``lengths``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.rowwise import rowwise
from ._checks import (
    Number,
    Side,
    check_length,
    check_lengths,
    check_options,
    check_out,
    check_tensors,
)

__all__ = ["side_context", "side_context_row"]

# Below this many elements per feature slice, one masked pass over the output is
# cheaper than finding the padding slices with nonzero() and filling only those.
_INDEX_FILL_MIN_SLICE = 4


# ------------------------------------------------------------------ batched


def _window(
    present: Tensor, lengths: Tensor | None, side: Side, max_len: int
) -> tuple[Tensor, Tensor]:
    """Per row, the position output slot 0 copies from (``[B]`` int64, may be out of
    ``[0, L)``), and which slots are padding (``[B, max_len]`` bool)."""
    L = present.shape[1]
    slots = torch.arange(max_len, device=present.device)
    if side == "left":
        # max returns the first maximal index: the first masked position, or 0
        found, first = present.max(1)
        stop = torch.where(found, first, 0)
        if lengths is not None:
            stop = torch.minimum(stop, lengths)
        return stop - max_len, slots < (max_len - stop)[:, None]
    found, back = present.flip(1).max(1)  # L - 1 - back is the last masked position
    start = torch.where(found, L - back, L)
    real = (L if lengths is None else lengths) - start  # may be negative: no real token
    return start, slots >= real[:, None]


def _merged(t: Tensor, rows: int, feat: tuple[int, ...]) -> Tensor | None:
    """``t`` viewed as ``[rows, *F]`` without a copy, or None where its strides forbid it."""
    try:
        return t.view(rows, *feat)
    except RuntimeError:
        return None


def _positions(base: Tensor, lo: int, hi: int, L: int, max_len: int) -> Tensor:
    """Rows ``lo:hi`` of the ``[B * L]`` source index of every output slot, clamped in-row."""
    rows = torch.arange(lo, hi, device=base.device)[:, None]
    slots = torch.arange(max_len, device=base.device)
    return (base[lo:hi, None] + slots).clamp_(0, L - 1).add_(rows * L).view(-1)


def _copy_windows(inputs: Tensor, base: Tensor, dest: Tensor) -> None:
    """``dest[b, j] = inputs[b, base[b] + j]`` where that is in the row (the rest: anything)."""
    B, L, *rest = inputs.shape
    feat, max_len = tuple(rest), dest.shape[1]
    flat = _merged(inputs, B * L, feat)
    if flat is None:  # strides that cannot be merged: gather by (row, position)
        rows = torch.arange(B, device=base.device)[:, None]
        slots = torch.arange(max_len, device=base.device)
        dest.copy_(inputs[rows, (base[:, None] + slots).clamp_(0, L - 1)])
        return
    # Row b's slots are one contiguous run of the [B * L, *F] view, starting at
    # b * L + base[b]: a window of the overlapping view windows[i] = flat[i : i + max_len].
    # One index per row, each copy one contiguous block. The run may spill into the
    # neighbouring rows (those slots are padding, overwritten later) but not past
    # either end of the batch, except in the first and last `edge` rows.
    edge = min(B, -(-max_len // L))
    head, tail = edge, max(edge, B - edge)
    if tail > head:
        windows = flat.unfold(0, max_len, 1).movedim(-1, 1)  # [B*L - max_len + 1, max_len, *F]
        starts = base[head:tail] + torch.arange(head, tail, device=base.device) * L
        torch.index_select(windows, 0, starts, out=dest[head:tail])
    for lo, hi in ((0, head), (tail, B)):  # the edge rows: one index per slot
        if hi > lo:
            index = _positions(base, lo, hi, L, max_len)
            target = _merged(dest[lo:hi], (hi - lo) * max_len, feat)
            if target is None:
                dest[lo:hi] = flat.index_select(0, index).view(hi - lo, max_len, *feat)
            else:
                torch.index_select(flat, 0, index, out=target)


def _fill_padding(dest: Tensor, pad: Tensor, value: Number) -> None:
    """Write ``value`` into the slots ``dest[b, j]`` where ``pad[b, j]``, in place."""
    B, max_len, *rest = dest.shape
    flat = _merged(dest, B * max_len, tuple(rest))
    if dest.device.type == "cpu" and math.prod(rest) >= _INDEX_FILL_MIN_SLICE and flat is not None:
        # touch only the padding slots (a few % of the output, usually)
        flat.index_fill_(0, pad.view(-1).nonzero().squeeze(1), value)
    else:
        # one pass over the output, but no nonzero(): on CUDA that would wait for the GPU
        dest.masked_fill_(pad.view(B, max_len, *[1] * len(rest)), value)


def side_context(
    inputs: Tensor,
    mask: Tensor,
    *,
    side: Side = "left",
    max_len: int,
    lengths: Tensor | None = None,
    pad_value: Number = 0,
    out: Tensor | None = None,
    return_mask: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The ``max_len`` tokens left or right of each row's masked span, padded.

    ``inputs`` is ``[B, L, *F]`` (no ``F`` for token ids), ``mask`` is ``[B, L]``
    (bool or integer; nonzero marks the span), ``lengths`` an optional ``[B]``
    count of each row's valid positions. Returns ``[B, max_len, *F]`` with the
    dtype and device of ``inputs`` (into ``out`` when given, with no temporary
    of the output's size), and with ``return_mask=True`` also a ``[B, max_len]``
    bool tensor, True where a real token was copied. Gradients flow to
    ``inputs`` when ``out`` is None; ``out=`` with ``inputs`` that require grad
    (grad mode on) raises ``ValueError``. See the module docstring for the rules.

    >>> import torch
    >>> from prep.ops import side_context
    >>> ids = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    >>> span = torch.tensor([[0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]])
    >>> side_context(ids, span, side="left", max_len=2, pad_value=-1)
    tensor([[ 2,  3],
            [-1, -1]])
    >>> side_context(ids, span, side="right", max_len=3, lengths=torch.tensor([6, 4]))
    tensor([[ 6,  0,  0],
            [ 8,  9, 10]])
    """
    check_tensors(inputs, mask, 2, "inputs")
    max_len = check_options(side, max_len, pad_value, inputs.dtype)
    B, L, *rest = inputs.shape
    shape = (B, max_len, *rest)
    if lengths is not None:
        lengths = check_lengths(lengths, inputs)
    if out is not None:
        out = check_out(out, shape, inputs)
    if B == 0 or L == 0 or max_len == 0:  # nothing to copy: all padding, or empty
        result = out if out is not None else inputs.new_empty(shape)
        result.fill_(pad_value)
        valid = torch.zeros((B, max_len), dtype=torch.bool, device=inputs.device)
        return (result, valid) if return_mask else result
    present = mask if mask.dtype == torch.bool else mask != 0
    base, pad = _window(present, lengths, side, max_len)
    if torch.is_grad_enabled() and inputs.requires_grad:
        # a per-slot gather: its backward scatters into [B * L, *F], where the
        # windows' backward would need max_len times the inputs' memory
        index = _positions(base, 0, B, L, max_len)
        result = inputs.reshape(B * L, *rest).index_select(0, index).view(shape)
    else:
        result = out if out is not None else inputs.new_empty(shape)
        _copy_windows(inputs, base, result)
    _fill_padding(result, pad, pad_value)
    return (result, ~pad) if return_mask else result


# ------------------------------------------------------------------ one row


@rowwise(batched=side_context, rename={"x": "inputs", "length": "lengths"})
def side_context_row(
    x: Tensor,
    mask: Tensor,
    *,
    side: Side = "left",
    max_len: int,
    length: Tensor | int | None = None,
    pad_value: Number = 0,
) -> Tensor:
    """:func:`side_context` for one row: ``x`` ``[L, *F]``, ``mask`` ``[L]`` -> ``[max_len, *F]``.

    Marked with :func:`prep.rowwise`, so ``map_rows`` runs it with any executor
    (``vectorized`` calls :func:`side_context` once). Lengths per row need a
    dict batch, since ``length`` is keyword-only.

    >>> import functools, torch, prep
    >>> from prep.ops import side_context_row
    >>> ids, span = torch.arange(12).view(2, 6), torch.eye(2, 6, dtype=torch.bool)
    >>> fn = functools.partial(side_context_row, side="right", max_len=2)
    >>> prep.map_rows(fn, {"x": ids, "mask": span, "length": torch.tensor([6, 3])},
    ...               executor="serial")
    tensor([[1, 2],
            [8, 0]])
    """
    check_tensors(x, mask, 1, "x")
    max_len = check_options(side, max_len, pad_value, x.dtype)
    L, feat = x.shape[0], tuple(x.shape[1:])
    n = check_length(length, L)
    where = mask.nonzero()
    start = stop = 0
    if where.numel() and side == "left":
        stop = min(int(where[0, 0]), n)
        start = max(stop - max_len, 0)
    elif where.numel():
        start = int(where[-1, 0]) + 1
        stop = max(start, min(n, start + max_len))
    result = x.new_full((max_len, *feat), pad_value)
    count = stop - start
    if count:
        # copy_ into a slice keeps autograd (the padding simply gets no gradient)
        at = max_len - count if side == "left" else 0
        result[at : at + count] = x[start:stop]
    return result
