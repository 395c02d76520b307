"""A user's own workload for ``prep bench --fn/--batch`` tests (importable by workers)."""

from __future__ import annotations

import os
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


def in_this_process(row: torch.Tensor) -> torch.Tensor:
    """Adds the pid of the process it runs in: another process's result differs from serial's."""
    return row + os.getpid()


def make_rows(rows: int) -> torch.Tensor:
    """A factory of one column: ``rows`` rows of 3 floats."""
    return torch.arange(rows * 3, dtype=torch.float32).view(rows, 3)


def make_named(rows: int) -> dict[str, torch.Tensor]:
    """A factory of a dict batch, passed to the row function by keyword."""
    x, w = make_batch(rows)
    return {"x": x, "w": w}


def scaled_by_first(row: torch.Tensor) -> torch.Tensor:
    """Reads a value of its row (``float(row[0])``), which vmap cannot trace."""
    return row * float(row[0])
