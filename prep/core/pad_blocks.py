"""Blocks of ragged rows on their way into a :class:`~prep.core.padding.PaddedOutput`.

A block is the results of a few consecutive rows, each flattened into its
leaves. Blocks of 1-D rows into private memory are held as they came
(where :func:`may_hold`) until the output is read: if by then they are every row,
each leaf is one ``pad_sequence`` (what a loop over the rows would do);
otherwise each block is padded into the output's rows with :func:`pad_into`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .output import in_shm
from .pad_options import Number

Block = list[list[Tensor]]  # rows, each its leaves


def holdable(rows: Block, buffers: Sequence[Tensor]) -> bool:
    """Whether every leaf of ``rows`` is a 1-D tensor of its buffer's dtype."""
    return all(
        leaf.dim() == 1 and leaf.dtype == buf.dtype
        for leaves in rows
        for leaf, buf in zip(leaves, buffers)
    )


def tensors(results: Sequence[object], buffers: Sequence[Tensor]) -> Block | None:
    """``results`` as a block if each is a plain 1-D tensor of the one buffer's dtype (the
    common ragged row, held without flattening and checking each); else None."""
    rows = [[r] for r in results if type(r) is Tensor]
    return rows if len(rows) == len(results) and holdable(rows, buffers) else None


def all_full(rows: Block, buffers: Sequence[Tensor]) -> bool:
    """Whether every leaf of ``rows`` fills its buffer's row exactly (nothing to pad)."""
    return all(
        leaf.shape == buf.shape[1:] and leaf.dtype == buf.dtype
        for leaves in rows
        for leaf, buf in zip(leaves, buffers)
    )


def sequences_fit(buf: Tensor, fixed: object, column: list[Tensor]) -> bool:
    """Whether a block's ``column`` (its rows' leaf) are 1-D of ``buf``'s dtype and, for
    a ``fixed`` size, fit it: then they go in with one ``pad_sequence``."""
    if buf.dim() != 2 or not all(t.dim() == 1 and t.dtype == buf.dtype for t in column):
        return False
    return fixed is None or max(t.shape[0] for t in column) <= buf.shape[1]


def pad_into(rows: Tensor, column: list[Tensor], pad: Number) -> list[int]:
    """1-D ``column`` into ``rows`` (as wide as the longest of them, or wider): padded
    in one C++ loop (a block-sized temporary), copied, the rest of the width filled;
    three calls a block instead of three a row. Returns the rows' lengths."""
    lengths = [t.shape[0] for t in column]
    longest = max(lengths)
    block = torch.nn.utils.rnn.pad_sequence(column, batch_first=True, padding_value=pad)
    rows.narrow(1, 0, longest).copy_(block)
    if longest < rows.shape[1]:
        rows.narrow(1, longest, rows.shape[1] - longest).fill_(pad)
    return lengths


def may_hold(buffers: Sequence[Tensor], fixed: Sequence[object]) -> bool:
    """Whether an output of ``buffers`` may hold rows: 1-D rows of no fixed size
    (``fixed``, per leaf), in private, unpinned memory (another process reads
    shared memory without a word, and a pinned buffer must stay the one written)."""
    return all(
        b.dim() == 2 and not in_shm(b) and not b.is_pinned() and to is None
        for b, to in zip(buffers, fixed)
    )


def covers(blocks: list[tuple[int, Block]], rows: int) -> bool:
    """Whether ``blocks`` (in row order) are rows ``0:rows``, each once."""
    covered = 0
    for lo, block in blocks:
        if lo != covered:
            return False
        covered += len(block)
    return covered == rows


def padded(blocks: list[tuple[int, Block]], k: int, pad: Number) -> tuple[Tensor, list[int]]:
    """Leaf ``k`` of every row of ``blocks``, as one padded tensor, and its lengths."""
    column = [leaves[k] for _, block in blocks for leaves in block]
    out = torch.nn.utils.rnn.pad_sequence(column, batch_first=True, padding_value=pad)
    return out, [t.shape[0] for t in column]
