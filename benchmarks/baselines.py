"""The ways people run a row function without prep: what the benchmarks beat.

As in the question prep grew out of: a Python loop and ``torch.stack``
(:func:`loop_stack`), ``joblib.Parallel`` over row views (:func:`plain_joblib`),
and that question's own loop for side context (:func:`side_context_loop`), which
``scripts/bench_side_context.py`` and the tests hold :func:`prep.ops.side_context`
against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from prep.bench.peers import rows_of_batch, stack
from prep.bench.verify import leaves
from prep.ops._checks import Number, Side, check_lengths, check_options, check_tensors

__all__ = ["loop_stack", "nbytes", "plain_joblib", "side_context_loop"]


def nbytes(value: Any) -> int:
    """Bytes of the storages behind ``value``'s tensors (what pickling a view ships, as
    :func:`plain_joblib` does with every row)."""
    return sum(t.untyped_storage().nbytes() for t in leaves(value))


def loop_stack(fn: Callable[..., Any], batch: Any, *, samples: bool = False) -> Any:
    """The seed's shape: ``torch.stack([fn(*row) for row in zip(*columns)])``."""
    return stack([fn(*args, **kwargs) for args, kwargs in rows_of_batch(batch, samples=samples)])


def plain_joblib(
    fn: Callable[..., Any],
    batch: Any,
    workers: int,
    limit: int | None = None,
    *,
    samples: bool = False,
) -> Any:
    """``joblib.Parallel(n_jobs=workers)(delayed(fn)(*row) for row ...)``, first ``limit`` rows.

    Each row is a view, and pickling a view ships its whole storage: every row
    sends the entire batch to a worker. That is the cost this baseline shows.
    """
    import joblib

    rows = rows_of_batch(batch, samples=samples)[:limit]
    parts = joblib.Parallel(n_jobs=workers)(
        joblib.delayed(fn)(*args, **kwargs) for args, kwargs in rows
    )
    return stack(list(parts))


def side_context_loop(
    inputs: Tensor,
    mask: Tensor,
    *,
    side: Side,
    max_len: int,
    lengths: Tensor | None = None,
    pad_value: Number = 0,
) -> Tensor:
    """The question's loop with its bugs fixed: slice each row, cat padding, stack.

    The baseline :func:`side_context` is measured against; same results, bit for bit.

    >>> import torch
    >>> from benchmarks.baselines import side_context_loop
    >>> side_context_loop(torch.arange(1, 7)[None], torch.tensor([[0, 0, 1, 0, 0, 0]]),
    ...                   side="left", max_len=3)
    tensor([[0, 1, 2]])
    """
    check_tensors(inputs, mask, 2, "inputs")
    max_len = check_options(side, max_len, pad_value, inputs.dtype)
    if lengths is not None:
        lengths = check_lengths(lengths, inputs)
    B, L, *feat = inputs.shape
    rows = []
    for b in range(B):
        row, where = inputs[b], mask[b].nonzero().flatten()
        n = L if lengths is None else int(lengths[b])
        if where.numel() == 0:
            context = row[:0]  # the seed read this shape from a variable not yet set
        elif side == "left":
            stop = min(int(where[0]), n)  # the seed stopped at first - 1
            context = row[max(stop - max_len, 0) : stop]  # and never cut to max_len
        else:
            start = int(where[-1]) + 1
            context = row[start : min(n, start + max_len)]  # the seed stopped at the feature size
        # padding in the inputs' dtype and device (the seed made float32 on the CPU)
        padding = inputs.new_full((max_len - context.shape[0], *feat), pad_value)
        rows.append(torch.cat([padding, context] if side == "left" else [context, padding]))
    if not rows:
        return inputs.new_full((0, max_len, *feat), pad_value)
    return torch.stack(rows)
