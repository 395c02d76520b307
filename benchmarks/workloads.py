"""Built-in workloads that span the space: each a row function plus a batch factory.

* ``side_context`` (large features) and ``side_context_small``: memory-bound
  copies, with a batched twin;
* ``python``: a GIL-bound pure-Python loop of a chosen cost per row;
* ``matmul``: a GIL-releasing torch op (a chain of matrix products);
* ``sleep``: an I/O-like wait that holds no GIL;
* ``tokenize``: a character-level tokenizer in pure Python (light, GIL-bound);
* ``noop``: nothing at all, to expose each executor's per-row overhead.

:func:`user_workload` turns ``--fn MODULE:FUNCTION --batch MODULE:FACTORY``
into one more. Row functions live at module level so worker processes can
import them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prep._imports import load_callable
from prep.ops import side_context_row


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
    """Waits like a read from disk or network would, without holding the GIL.

    Like a loader, it first reads which record the row names (``int(row[0])``):
    real I/O depends on the row's value, so ``vmap`` cannot batch the wait into
    one call, and neither can this.
    """
    if int(row[0]) < 0:  # the record id; every id waits the same here
        return row
    time.sleep(seconds)
    return row


# A tokenizer's vocabulary: ids 0-3 are special, then one id per character.
PAD, BOS, EOS, UNK = 0, 1, 2, 3
_VOCAB = {ch: i + 4 for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'-")}


def tokenize_row(row: torch.Tensor, *, max_len: int = 128) -> torch.Tensor:
    """Character ids of a row of ASCII bytes, ``BOS word EOS`` per word, cut or padded.

    The dict lookups, ``str`` methods and list appends all hold the GIL, like the
    text cleaning people write before a real tokenizer (about 0.15 ms a row of 512
    bytes here).
    """
    text = row.numpy().tobytes().decode("ascii").lower()
    ids: list[int] = []
    for word in text.split():
        ids.append(BOS)
        ids.extend(_VOCAB.get(ch, UNK) for ch in word)
        ids.append(EOS)
    ids = ids[:max_len]
    ids.extend([PAD] * (max_len - len(ids)))
    return torch.tensor(ids, dtype=torch.int64)


def text_batch(rows: int, length: int = 512, seed: int = 0) -> torch.Tensor:
    """``[rows, length]`` uint8 ASCII: lowercase letters, about one space in six."""
    g = torch.Generator().manual_seed(seed)
    letters = torch.randint(ord("a"), ord("z") + 1, (rows, length), generator=g)
    spaces = torch.rand(rows, length, generator=g) < 1 / 6
    return letters.masked_fill(spaces, ord(" ")).to(torch.uint8)


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
            lambda rows: torch.arange(rows * 8, dtype=torch.float32).view(rows, 8),
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
        Workload(
            "tokenize",
            tokenize_row,
            text_batch,
            "character-level tokenizer on 512 ASCII bytes a row: light pure Python, holds the GIL",
        ),
    ]
}


def user_workload(fn: str, batch: str) -> Workload:
    """The workload of ``--fn MODULE:FUNCTION --batch MODULE:FACTORY``.

    The factory takes the number of rows and returns a batch for ``map_rows``
    (a Tensor, a tuple or a dict of Tensors with that many rows).

    >>> w = user_workload("benchmarks.workloads:noop", "benchmarks.workloads:text_batch")
    >>> w.name, tuple(w.batch(3).shape)
    ('user:noop', (3, 512))
    """
    row_fn = load_callable(fn, "--fn")
    factory = load_callable(batch, "--batch")
    name = getattr(row_fn, "__name__", None) or fn.partition(":")[2]
    return Workload(f"user:{name}", row_fn, factory, f"your function {fn}, batches from {batch}")
