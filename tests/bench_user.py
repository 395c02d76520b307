"""A user's own workload for ``prep bench --fn/--batch`` tests (importable by workers)."""

from __future__ import annotations

import threading

import torch


def scale_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A row function of two columns."""
    return x * w.sum()


def make_batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The factory: rows -> a batch (a tuple of two columns)."""
    g = torch.Generator().manual_seed(rows)
    return torch.randn(rows, 4, generator=g), torch.rand(rows, 3, generator=g)


def failing_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    raise ValueError("this row function always fails")


def broken_factory(rows: int) -> torch.Tensor:
    raise OSError(f"cannot read the data for {rows} rows")


def main_thread_only(row: torch.Tensor) -> torch.Tensor:
    """Fails on any thread but the main one: one executor (threads) fails, others run."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("called off the main thread")
    return row + 1
