"""Ragged rows: ``pad=`` and ``pad_to=``, resolved per result leaf.

Rows whose results differ in size are written into one output all the same: at
the end of every dim in which they differ, each row is padded to the batch's
largest size (or to ``pad_to``). The sizes are not known before the rows run, so
an output leaf starts at the first row's shape and grows, in place of a list of
row tensors and ``pad_sequence``: to exactly the size a row needs the first few
times (in a batch in random order a new longest row is rare: ln(B) + 0.6
times on average), by a quarter more after 16 growths (rows sorted by
length would otherwise copy the output at every row), with one trim at the end
when it grew past the longest row. A growth holds the old and the new buffer at
once, so the peak stays under twice the output while growths are exact. Each
row fills only its own padding; a row of the full size is one copy.

Rows of 1-D results (token ids, say) into an output in this process's own memory
skip the growing: their blocks are held as the row function returned them, and
once every row has come that way each leaf is one ``pad_sequence``, as the loop
a user would write does it (no growth, no second copy; the same peak, the rows
and the output). Anything else (a 2-D row, a failed row, a worker's chunk, a
fixed size) first writes what is held the growing way.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import StackError
from .output import TENSOR, Output, Result, Spec, check_fits, empty, flatten, in_shm
from .pad_blocks import (
    Block,
    all_full,
    covers,
    holdable,
    may_hold,
    pad_into,
    padded,
    sequences_fit,
    tensors,
)
from .pad_options import Number, Padding

__all__ = ["Number", "Padding", "PaddedOutput", "allocate", "given_padded"]

#: exact growths of a leaf before it grows by GROWTH at a time (a batch in random order
#: has about ln(B) + 0.6 new longest rows: 6 at 256 rows, 8 at 1024)
EXACT_GROWTHS = 16
GROWTH = 1.25
#: what rows of a padded output must return alike
SAME_DIMS = "the same number of dims and the same dtype"

# ---------------------------------------------------------------- in a buffer


def box(size: Sequence[int]) -> tuple[slice, ...]:
    """The index of a row's own elements (its ``size``) in a padded row."""
    return tuple(slice(0, s) for s in size)


def corner(row: Tensor, size: Sequence[int]) -> Tensor:
    """``row[box(size)]`` by ``narrow`` (a few times cheaper than indexing by slices)."""
    for d, s in enumerate(size):
        if s != row.shape[d]:
            row = row.narrow(d, 0, s)
    return row


def fill_outside(row: Tensor, size: Sequence[int], value: Number) -> None:
    """Fill what lies outside ``row[box(size)]`` with ``value``: one slab per dim in
    which ``size`` falls short (dims before it limited to the row's size)."""
    lead = row.dim() - len(size)
    for d, s in enumerate(size):
        c = row.shape[lead + d]
        if s < c:
            slab = row.narrow(lead + d, s, c - s)
            for e in range(d):  # dims before it: the row's own size only
                slab = slab.narrow(lead + e, 0, size[e])
            slab.fill_(value)


def grown(buf: Tensor, need: Sequence[int], value: Number, growths: int) -> Tensor:
    """``buf`` ([rows, *capacity]) copied into a larger buffer that fits ``need``, the new
    room filled with ``value`` for every row; shared or pinned as ``buf`` was."""
    cap = tuple(buf.shape[1:])
    factor = 1.0 if growths < EXACT_GROWTHS else GROWTH
    new_cap = tuple(c if n <= c else max(n, math.ceil(c * factor)) for c, n in zip(cap, need))
    pinned = buf.device.type == "cpu" and buf.is_pinned()
    new = empty((buf.shape[0], *new_cap), buf.dtype, buf.device, pinned, in_shm(buf))
    new[(slice(None), *box(cap))].copy_(buf)
    fill_outside(new, cap, value)
    return new


def trimmed(buf: Tensor, size: Sequence[int]) -> Tensor:
    """``buf`` cut to ``size`` per row (the longest row's), if it grew past it."""
    if tuple(buf.shape[1:]) == tuple(size):
        return buf
    return buf[(slice(None), *box(size))].contiguous()


# ---------------------------------------------------------------- the output


class PaddedOutput(Output):
    """An :class:`Output` whose rows may differ in size: each leaf is a buffer
    ``[rows, *capacity]`` that grows to fit, and ``sizes[k][i]`` is row ``i``'s own
    size of leaf ``k``. Writes take a lock (a growth replaces a buffer)."""

    def __init__(
        self,
        spec: Spec,
        buffers: list[Tensor],
        first_row: int,
        offset: int,
        leaves: list[tuple[Number, Any]],
    ) -> None:
        super().__init__(spec, buffers, first_row, offset)
        self.pads = [value for value, _ in leaves]
        for k, (buf, pad) in enumerate(zip(buffers, self.pads)):
            check_fits(pad, buf.dtype, "pad", self.spec.where(k))
        self.fixed = [to for _, to in leaves]
        shared = any(in_shm(b) for b in buffers)
        shapes = [(len(b), b.dim() - 1) for b in buffers]  # each row's size: int64 [rows, dims]
        self.sizes = [empty(s, torch.int64, shared=shared).zero_() for s in shapes]
        self._sizes = [s.numpy() for s in self.sizes]  # the same memory: a row's write is cheap
        self.growths = [0] * len(buffers)
        self.failed: dict[int, Number | None] = {}  # row -> its fill (None: the pad)
        self.lock = threading.RLock()
        #: blocks of 1-D rows not yet written, by the buffer row each starts at
        self.held: list[tuple[int, Block]] = []
        self.holding = may_hold(buffers, self.fixed)

    @property
    def buffers(self) -> list[Tensor]:
        """The leaves' buffers, with every held row in them."""
        if self.held:
            self.settle()
        return self._buffers

    @buffers.setter
    def buffers(self, value: list[Tensor]) -> None:
        self._buffers = value

    def __getstate__(self) -> dict[str, Any]:
        self.settle()
        return {k: v for k, v in super().__getstate__().items() if k not in ("lock", "_sizes")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()
        self._sizes = [s.numpy() for s in self.sizes]

    def settle(self) -> None:
        """Write the held rows: each leaf one ``pad_sequence`` if they are every row,
        else block by block into the (growing) buffers."""
        with torch.no_grad(), self.lock:
            blocks, self.held = sorted(self.held, key=lambda b: b[0]), []
            if not blocks:
                return
            if covers(blocks, len(self._buffers[0])) and not self.failed:
                for k, pad in enumerate(self.pads):
                    self._buffers[k], self._sizes[k][:, 0] = padded(blocks, k, pad)
                return
            self.holding = False  # rows came another way too: no longer worth holding
            for lo, rows in blocks:
                for k in range(len(self._buffers)):
                    self._put_sequences(k, lo, [leaves[k] for leaves in rows])

    def write(self, i: int, result: Any) -> None:
        self.write_block(i, [result])

    def write_block(self, start: int, results: Sequence[Any]) -> None:
        """Rows ``start, start + 1, ...``: checked and flattened outside the lock, then
        written under it, one lock and one ``no_grad`` a block."""
        lo = start - self.offset
        if self.holding and self.spec is TENSOR and (held := tensors(results, self._buffers)):
            with self.lock:
                self.held.append((lo, held))
            return
        rows = []
        for k, result in enumerate(results):
            spec, leaves = flatten(result, row=start + k)
            self.check_spec(start + k, spec)
            rows.append(leaves)
        with torch.no_grad(), self.lock:
            if self.holding and holdable(rows, self._buffers):
                self.held.append((lo, rows))
                return
            if self.held:
                self.settle()
            if len(rows) > 1 and all_full(rows, self._buffers):  # one stack a leaf, as plain rows
                for k, buf in enumerate(self.buffers):
                    torch.stack([leaves[k] for leaves in rows], out=buf[lo : lo + len(rows)])
                    self._sizes[k][lo : lo + len(rows)] = buf.shape[1:]
                return
            for leaf_k in range(len(self.buffers)):
                column = [leaves[leaf_k] for leaves in rows]
                buf = self._buffers[leaf_k]
                if len(column) > 1 and sequences_fit(buf, self.fixed[leaf_k], column):
                    self._put_sequences(leaf_k, lo, column)
                    continue
                for k, leaf in enumerate(column):
                    self._put(leaf_k, lo + k, leaf, start + k)

    def _put_sequences(self, k: int, lo: int, column: list[Tensor]) -> None:
        longest = max(t.shape[0] for t in column)
        buf = self._buffers[k]
        if longest > buf.shape[1]:
            buf = self._grow(k, (longest,))
        self._sizes[k][lo : lo + len(column), 0] = pad_into(
            buf[lo : lo + len(column)], column, self.pads[k]
        )

    def _put(self, k: int, j: int, leaf: Tensor, i: int) -> None:
        buf = self.buffers[k]
        cap = buf.shape[1:]
        if leaf.shape == cap and leaf.dtype == buf.dtype:  # nothing to pad
            buf[j].copy_(leaf)
            self._sizes[k][j] = cap
            return
        if leaf.dim() != len(cap) or leaf.dtype != buf.dtype:
            raise self.mismatch(i, k, leaf, SAME_DIMS)
        size = tuple(leaf.shape)
        if any(s > c for s, c in zip(size, cap)):
            if self.fixed[k] is not None:
                raise too_large(i, size, self.fixed[k], self.spec.where(k))
            buf = self._grow(k, size)
        row = buf[j]
        corner(row, size).copy_(leaf)
        fill_outside(row, size, self.pads[k])
        self._sizes[k][j] = size

    def _grow(self, k: int, size: Sequence[int]) -> Tensor:
        self.buffers[k] = grown(self.buffers[k], size, self.pads[k], self.growths[k])
        self.growths[k] += 1
        return self.buffers[k]

    def fail(self, i: int, value: Number | None) -> None:
        """Row ``i`` failed: every leaf filled with ``value`` (None: its pad), sizes 0."""
        if value is not None:  # every leaf checked before any is touched
            for k, buf in enumerate(self.buffers):
                check_fits(value, buf.dtype, "fill", self.spec.where(k))
        with torch.no_grad(), self.lock:
            self.failed[i - self.offset] = value  # filled again once the size is final
            for buf, sizes, pad in zip(self.buffers, self.sizes, self.pads):
                buf[i - self.offset].fill_(pad if value is None else value)
                sizes[i - self.offset] = 0

    def unfail(self, i: int) -> None:
        with self.lock:
            self.failed.pop(i - self.offset, None)  # else finish() would fill it again

    def like(self, rows: int | None = None, *, pin: bool = False, shared: bool = False,
             device: torch.device | str | None = None) -> PaddedOutput:  # fmt: skip
        """As :meth:`Output.like`, padded as this one is (a staging area for ``out=``
        elsewhere keeps ``pad=``)."""
        plain = super().like(rows, pin=pin, shared=shared, device=device)
        return PaddedOutput(
            self.spec, plain.buffers, self.first_row, 0, list(zip(self.pads, self.fixed))
        )

    def merge(self, chunk: Output) -> None:
        """Rows of a worker's ``chunk`` (its own capacity, its padding filled) into
        rows ``chunk.offset:`` here: one copy and a few fills per leaf."""
        assert isinstance(chunk, PaddedOutput), "a padded batch's chunks are padded"
        self.check_spec(chunk.offset, chunk.spec)
        for k, (part, buf) in enumerate(zip(chunk.buffers, self.buffers)):
            if part.dtype != buf.dtype or part.dim() != buf.dim():  # as _put refuses a row
                raise self.mismatch(chunk.first_row, k, part[0], SAME_DIMS)
        lo, n = chunk.offset - self.offset, len(chunk)
        with torch.no_grad(), self.lock:
            for k, (part, sizes) in enumerate(zip(chunk.buffers, chunk.sizes)):
                cap = tuple(part.shape[1:])
                if any(c > h for c, h in zip(cap, self.buffers[k].shape[1:])):
                    longest = tuple(sizes.amax(0).tolist()) if n else cap
                    if self.fixed[k] is None:
                        self._grow(k, cap)
                    else:  # a fixed size (pad_to=, out=) never grows: out= would be left unfilled
                        j = first_over(sizes, self.buffers[k].shape[1:])
                        if j is not None:
                            size = sizes[j].tolist()
                            raise too_large(
                                chunk.offset + j, size, self.fixed[k], self.spec.where(k)
                            )
                        part, cap = part[(slice(None), *box(longest))], longest
                rows = self.buffers[k][lo : lo + n]
                rows[(slice(None), *box(cap))].copy_(part)
                fill_outside(rows, cap, self.pads[k])
                self.sizes[k][lo : lo + n] = sizes

    def finish(self) -> None:
        """Trim each leaf to its longest row (after a growth past it), or to pad_to; a
        failed row is filled whole again (a growth after it padded the new room)."""
        for k, (buf, sizes) in enumerate(zip(self.buffers, self.sizes)):
            if self.fixed[k] is None and len(buf):
                self.buffers[k] = buf = trimmed(buf, sizes.amax(0).tolist())
            for j, value in self.failed.items():
                buf[j].fill_(self.pads[k] if value is None else value)

    def lengths(self) -> Result:
        """Each row's size per leaf: int64 ``[rows]`` for 1-D rows, ``[rows, dims]`` else."""
        self.settle()
        return self.spec.unflatten([s[:, 0] if s.shape[1] == 1 else s for s in self.sizes])


def too_large(i: int, size: Sequence[int], fixed: object, where: str) -> StackError:
    return StackError(
        f"row {i} returned shape {tuple(size)}{where}, larger than the fixed {fixed} "
        f"(pad_to= or out=); make it larger, or crop in the row function (prep never "
        f"truncates a row)",
        row=i,
    )


def first_over(sizes: Tensor, limit: Sequence[int]) -> int | None:
    """The first row of ``sizes`` (int64 ``[rows, dims]``) larger than ``limit`` in a dim."""
    over = (sizes > torch.tensor(limit, dtype=sizes.dtype)).any(1).nonzero().flatten()
    return int(over[0]) if len(over) else None


def allocate(
    result: Any,
    rows: int,
    *,
    padding: Padding | None = None,
    row: int = 0,
    pin: bool = False,
    shared: bool = False,
    offset: int = 0,
) -> Output:
    """The output for ``rows`` rows shaped by ``result`` (row ``row``'s): equal rows
    without ``padding``, else rows that may differ, starting at ``pad_to`` or at
    this row's size."""
    if padding is None:
        return Output.allocate(result, rows, row=row, pin=pin, shared=shared, offset=offset)
    spec, leaves = flatten(result, row=row)
    per_leaf = padding.leaves(spec)
    shapes = []
    for k, (leaf, (_, to)) in enumerate(zip(leaves, per_leaf)):
        if to is not None and len(to) != leaf.dim():
            raise ValueError(
                f"pad_to={to} has {len(to)} dims but row {row} returned a {leaf.dim()}-d "
                f"tensor{spec.where(k)}; give pad_to one size per dim of the row's result"
            )
        shapes.append(torch.Size(to) if to is not None else leaf.shape)
    template = spec.unflatten(
        [torch.empty(s, dtype=t.dtype, device=t.device) for s, t in zip(shapes, leaves)]
    )
    plain = Output.allocate(template, rows, row=row, pin=pin, shared=shared, offset=offset)
    return PaddedOutput(spec, plain.buffers, row, offset, per_leaf)


def given_padded(out: Any, rows: int, padding: Padding) -> PaddedOutput:
    """``out=`` with ``pad=``: its shapes are fixed sizes, as ``pad_to`` would be."""
    plain = Output.given(out, rows)
    per_leaf = padding.leaves(plain.spec)
    fixed = [(pad, tuple(b.shape[1:])) for (pad, _), b in zip(per_leaf, plain.buffers)]
    return PaddedOutput(plain.spec, plain.buffers, -1, 0, fixed)
