"""Row functions whose values depend on the interpreter that runs them: imported by
name in worker processes, so what the test process changes at run time is not there."""

from __future__ import annotations

import torch

#: a config value a program sets in its main() at run time (workers import it as 1)
SCALE = 1


def scaled(row: torch.Tensor) -> torch.Tensor:
    return row * SCALE


def hashed(text: str) -> torch.Tensor:
    """hash() of a str is salted per interpreter (unless PYTHONHASHSEED is set)."""
    return torch.tensor([hash(text) % 1000])


def stable(text: str) -> torch.Tensor:
    return torch.tensor([len(text)])


def noisy(row: torch.Tensor) -> torch.Tensor:
    """Random augmentation: other values at every call, everywhere."""
    return row + torch.rand(row.shape)


def in_place(row: torch.Tensor) -> torch.Tensor:
    return row.add_(1)


def doubled(row: torch.Tensor) -> torch.Tensor:
    return row * 2
