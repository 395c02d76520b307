"""The process's global random generators (torch's default CPU generator, Python's
``random``, numpy's global one where ``numpy.random`` is imported): what prep runs in
the caller's process on its own account draws from them, and leaves them as it found
them. Torch imports numpy but not ``numpy.random``, whose import (about 130 ms) the
first read of ``numpy.random`` would pay; where it is not imported, nothing has drawn
from it, so there is no state to keep."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class States:
    """The generators' states at one moment (numpy's: None where ``numpy.random`` is not
    imported)."""

    torch: torch.Tensor
    random: Any
    numpy: Any

    @classmethod
    def now(cls) -> States:
        numpy = _numpy_random()
        state = numpy.get_state() if numpy is not None else None
        return cls(torch.random.get_rng_state(), random.getstate(), state)

    def moved_besides_torch(self) -> str | None:
        """Which of Python's ``random`` and numpy's global generator moved since these
        states were taken (None: neither)."""
        now = States.now()
        if now.random != self.random:
            return "Python's random"
        both = self.numpy is not None and now.numpy is not None
        if both and not same_numpy(self.numpy, now.numpy):
            return "numpy's global generator"
        return None

    def restore(self) -> None:
        torch.random.set_rng_state(self.torch)
        random.setstate(self.random)
        if self.numpy is not None:
            numpy = _numpy_random()
            if numpy is not None:
                numpy.set_state(self.numpy)


def _numpy_random() -> Any:
    """``numpy.random`` once imported whole (None before): the package gets the
    attribute only when the submodule's import has finished, where ``sys.modules``
    holds it half-made while another thread imports it (and ``numpy.random`` itself
    would import it)."""
    numpy = sys.modules.get("numpy")
    return vars(numpy).get("random") if numpy is not None else None


def same_numpy(a: Any, b: Any) -> bool:
    """Whether two of numpy's legacy global states (``get_state()``, or None where numpy
    was not imported) are the same state."""
    if a is None or b is None:
        return a is b
    return bool(a[0] == b[0] and (a[1] == b[1]).all() and a[2:] == b[2:])


class Kept:
    """Where a :func:`kept` block left the generators (:attr:`end`, once it ended)."""

    end: States | None = None


@contextlib.contextmanager
def kept(start: States | None = None) -> Iterator[Kept]:
    """The generators' states, put back once the block ends: a check that runs the row
    function again in the caller (serial's reference rows) must not move the draws the
    user's own code makes next. ``start``: the block draws from there (where an
    earlier block ended, so that a second run of a random function draws anew)."""
    before, block = States.now(), Kept()
    if start is not None:
        start.restore()
    try:
        yield block
    finally:
        block.end = States.now()
        before.restore()
