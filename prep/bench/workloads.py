"""Built-in workloads that span the space: each a row function plus a batch factory.

* ``side_context`` (large features) and ``side_context_small``: memory-bound
  copies, with a batched twin;
* ``python``: a GIL-bound pure-Python loop of a chosen cost per row;
* ``matmul``: a GIL-releasing torch op (a chain of matrix products);
* ``sleep``: an I/O-like wait that holds no GIL;
* ``noop``: nothing at all, to expose each executor's per-row overhead.

Row functions live at module level so worker processes can import them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..ops import side_context_row


@dataclass(frozen=True)
class Workload:
    """A row function and a factory ``batch(rows) -> batch`` for ``map_rows``."""

    name: str
    fn: Callable[..., Any]
    batch: Callable[[int], Any]
    about: str


def noop(row: torch.Tensor) -> torch.Tensor:
    return row


def python_work(row: torch.Tensor, *, iters: int = 20_000) -> torch.Tensor:
    """Pure-Python arithmetic that holds the GIL throughout (about 2.5 ms a row here)."""
    seed = int(row[0])
    acc = 0
    for i in range(iters):
        acc = (acc + i * seed) % 1_000_003
    return torch.tensor([float(acc)])


def matmul_chain(row: torch.Tensor, *, depth: int = 4) -> torch.Tensor:
    """A few [n, n] products: torch releases the GIL while each runs."""
    y = row
    for _ in range(depth):
        y = torch.tanh(y @ row)
    return y


def sleep_row(row: torch.Tensor, *, seconds: float = 0.002) -> torch.Tensor:
    """Waits like a read from disk or network would, without holding the GIL."""
    time.sleep(seconds)
    return row


def side_context_batch(
    rows: int, seq: int = 512, dim: int = 768, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, seq, dim]`` features and a ``[rows, seq]`` mask with one span per row."""
    g = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(rows, seq, dim, generator=g)
        if dim
        else torch.randint(0, 30_000, (rows, seq), generator=g)
    )
    start = torch.randint(0, seq, (rows, 1), generator=g)
    width = torch.randint(1, 5, (rows, 1), generator=g)
    pos = torch.arange(seq)
    return x, (pos >= start) & (pos < start + width)


def _scalars(rows: int) -> torch.Tensor:
    return torch.arange(rows, dtype=torch.float32).view(rows, 1) + 1


def _squares(rows: int, n: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, n, n, generator=g) / n**0.5


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "noop",
            noop,
            lambda rows: torch.randn(rows, 8),
            "nothing: the executor's own cost per row",
        ),
        Workload("python", python_work, _scalars, "pure Python, about 2.5 ms a row, holds the GIL"),
        Workload(
            "matmul",
            matmul_chain,
            _squares,
            "4 products of [128, 128] matrices a row, releases the GIL",
        ),
        Workload(
            "sleep",
            sleep_row,
            lambda rows: torch.randn(rows, 8),
            "waits 2 ms a row (I/O-like), releases the GIL",
        ),
        Workload(
            "side_context",
            functools.partial(side_context_row, max_len=128),
            lambda rows: side_context_batch(rows, 512, 768),
            "left context of a span, [rows, 512, 768] float32: memory-bound, has a twin",
        ),
        Workload(
            "side_context_small",
            functools.partial(side_context_row, max_len=16),
            lambda rows: side_context_batch(rows, 64, 16),
            "left context of a span, [rows, 64, 16] float32: per-row overhead dominates",
        ),
    ]
}
