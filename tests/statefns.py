"""Row functions and setups for the per-worker state tests (importable by workers)."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import torch

_made = itertools.count()


class Tracked:
    """A state that says where it was made, and writes a file when it is closed."""

    def __init__(self, closed_dir: str | None = None) -> None:
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.serial = next(_made)  # the how-manieth state this process made
        self.lock = threading.Lock()  # cannot be pickled: it never has to be
        self.closed_dir = closed_dir
        self.closed = False

    def close(self) -> None:
        self.closed = True
        if self.closed_dir:
            Path(self.closed_dir, f"{self.pid}-{self.thread}-{self.serial}").touch()


def make_tracked() -> Tracked:
    return Tracked()


def where(row: torch.Tensor, *, state: Tracked) -> torch.Tensor:
    """[pid, thread id mod 2**31, which state, row value]."""
    with state.lock:
        return torch.tensor(
            [state.pid, state.thread % 2**31, state.serial, int(row[0])], dtype=torch.int64
        )


def broken_setup() -> Tracked:
    raise RuntimeError("the model file is missing")


def offset_state() -> dict[str, float]:
    """For ``prep run --setup``: the state a row function adds to its rows."""
    return {"offset": 100.0}


def add_offset(x: torch.Tensor, *, state: dict[str, float]) -> torch.Tensor:
    return x + state["offset"]
