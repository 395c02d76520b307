"""Executors kept warm: :class:`Warm` is what a :class:`~prep.Pool` owns, its
executors, made from the registry on first use and kept until it closes. An
``auto`` made there is given the others, so it measures and runs the pool's own
(one process pool, whichever name asked for it first).
"""

from __future__ import annotations

from ._kept import Kept
from .executors import Executor
from .registry import make

__all__ = ["Warm"]


class Warm(Kept[Executor]):
    """The executors of ``workers`` workers each, by name, made on first use (an
    ``auto`` made here is handed :meth:`get`, to measure and run the pool's own)."""

    def __init__(self, workers: int) -> None:
        super().__init__(lambda name: make(name, workers, self.get))
        self.workers = workers
