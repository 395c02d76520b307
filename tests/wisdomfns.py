"""Row functions for the wisdom tests, importable by name from a second interpreter."""

from __future__ import annotations

import torch


def doubled(row: torch.Tensor) -> torch.Tensor:
    return row * 2


def tripled(row: torch.Tensor) -> torch.Tensor:
    return row * 3
