"""Batched tensor operations with a per-row twin, ready for :func:`prep.map_rows`.

>>> import torch
>>> from prep.ops import side_context
>>> side_context(torch.arange(6)[None], torch.tensor([[0, 0, 0, 1, 0, 0]]), max_len=2)
tensor([[1, 2]])
"""

from __future__ import annotations

from .side_context import side_context, side_context_row

__all__ = ["side_context", "side_context_row"]
