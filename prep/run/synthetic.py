"""``prep make-shards``: a synthetic data set of token features with masked spans, the
shape of the question prep grew from (:func:`prep.ops.side_context_row`'s batches)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from ..errors import ConfigError
from .save import save_shard
from .shards import FORMATS

_SUFFIX = {name: suffix for suffix, name in FORMATS.items()}


def make_shards(
    out: str | os.PathLike[str],
    *,
    shards: int = 4,
    rows: int = 256,
    seq: int = 64,
    dim: int = 16,
    seed: int = 0,
    fmt: str = "pt",
) -> list[Path]:
    """Write a synthetic data set of token features with one masked span per row.

    Each shard holds ``x`` ``[rows, seq, dim]`` float32, ``mask`` ``[rows, seq]``
    bool (one contiguous span inside the row's valid length; about one row in
    ten has none) and ``length`` ``[rows]`` int64 (valid positions, at least
    ``seq // 2``): the keyword names of :func:`prep.ops.side_context_row`, so a
    shard is a ready dict batch for it. The same arguments give the same bytes.

    >>> import tempfile, prep.run
    >>> paths = prep.run.make_shards(tempfile.mkdtemp(), shards=2, rows=8, seq=6, dim=2)
    >>> [p.name for p in paths]
    ['shard-00000.pt', 'shard-00001.pt']
    """
    for name, value, low in (
        ("shards", shards, 1),
        ("rows", rows, 0),
        ("seq", seq, 1),
        ("dim", dim, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}={value!r} is not an integer >= {low}")
    if fmt not in _SUFFIX:
        raise ConfigError(f"format={fmt!r} is not one of {', '.join(map(repr, _SUFFIX))}")
    folder = Path(out)
    gen = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(shards):
        path = folder / f"shard-{i:05d}{_SUFFIX[fmt]}"
        save_shard(_synthetic(rows, seq, dim, gen), path, fmt)
        paths.append(path)
    return paths


def _synthetic(rows: int, seq: int, dim: int, gen: torch.Generator) -> dict[str, Tensor]:
    x = torch.randn(rows, seq, dim, generator=gen)
    length = torch.randint(seq // 2, seq + 1, (rows,), generator=gen).clamp_(min=1)
    start = (torch.rand(rows, generator=gen) * length).long()
    stop = torch.minimum(start + torch.randint(1, 4, (rows,), generator=gen), length)
    pos = torch.arange(seq)
    mask = (pos >= start[:, None]) & (pos < stop[:, None])
    mask &= (torch.rand(rows, generator=gen) >= 0.1)[:, None]  # some rows have no span
    return {"x": x, "mask": mask, "length": length}


__all__ = ["make_shards"]
