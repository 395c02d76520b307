"""Random row functions for the seed= tests of DataLoaders and prep run (importable by
name, so that worker processes and spawned DataLoader workers can load them)."""

from __future__ import annotations

import random
import time

import torch


def noisy(x: torch.Tensor) -> torch.Tensor:
    """The row and a draw from each of torch's and Python's global generators."""
    return x + torch.rand(x.shape) + random.random()


def noisy_slowly(x: torch.Tensor) -> torch.Tensor:
    """:func:`noisy`, a row at a time slowly enough for a run to be stopped midway
    (the test waits on shards reported done, not on this sleep)."""
    time.sleep(0.05)
    return noisy(x)


def crop_and_flip(sample: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    """A random crop of 4 of a sample's 8 values, flipped half the time, from ``rng``."""
    start = int(torch.randint(0, 5, (), generator=rng))
    crop = sample[start : start + 4]
    return crop.flip(0) if bool(torch.rand((), generator=rng) < 0.5) else crop
