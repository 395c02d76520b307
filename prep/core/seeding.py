"""``seed=``: a row's random draws are a property of the row, not of who runs it.

With a seed, row ``i`` of a batch draws from generators seeded from ``(seed, i)``
(:func:`mix`), in whatever process or worker computes it, so every executor that
runs rows one by one returns serial's rows, at any worker count, and a resumed
``prep run`` the rows of an uninterrupted one. A stream's batch ``k`` is keyed
under ``mix(seed, k)``, a shard's rows under the shard's path (``prep run``).

Which generators: a row function that takes an ``rng`` keyword is given a
``torch.Generator`` of its thread, seeded for the row, and nothing else is
touched. Any other draws from the process's global generators: torch's default
CPU generator is seeded for every row (a few microseconds); Python's ``random``
and numpy's global generator only where the first row of a run of rows moved
them (seeding them costs 10-20 microseconds a row, reading them 50-100 once a
run). A function that draws from one of those on a later row but not on the
first is stopped with an error that names the fix, never left to draw unseeded.
The generators are put back as they were once the run of rows ends, in the
caller and in workers alike, so nothing outside the rows sees a seeded state.

Threads share the global generators, so they cannot give a function that draws
from them seeded rows (two rows at once interleave their draws): such a function
takes ``rng`` to run on threads. A batched call (``vectorized``, ``vmap``) draws
for all rows at once and cannot seed each row.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .checks import signature
from .generators import States, same_numpy
from .state import WithState

__all__ = ["Seeding", "mix", "takes_rng"]

_MASK = (1 << 64) - 1


def mix(seed: int, key: int) -> int:
    """A 63-bit seed for ``key`` under ``seed`` (splitmix64 of the two): neighbouring
    keys give unrelated streams, and the same pair gives the same seed everywhere."""
    z = (seed * 0x9E3779B97F4A7C15 + key + 0x632BE59BD9B4E019) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def takes_rng(fn: Any) -> bool:
    """Whether the row function declares an ``rng`` parameter (by that name: a function
    taking ``**kwargs`` is not given one it did not ask for)."""
    sig = signature(fn.fn if isinstance(fn, WithState) else fn)
    rng = sig.parameters.get("rng") if sig is not None else None
    return rng is not None and rng.kind in (rng.POSITIONAL_OR_KEYWORD, rng.KEYWORD_ONLY)


class Seeding:
    """The seeds of one batch's rows (``seed``: the batch's own); ``rng``: the row
    function takes an ``rng`` keyword, and draws from it alone. Travels with the rows
    (``Rows.seeds``), as a :class:`~prep.core.policy.ResultCheck` does."""

    def __init__(self, seed: int, rng: bool = False, shift: int = 0) -> None:
        self.seed, self.rng = seed, rng
        self.shift = shift  # rows numbered from 0 that are the batch's rows shift:
        self._local = threading.local()

    def __reduce__(self) -> tuple[Any, ...]:  # the thread-local part is each process's own
        return (Seeding, (self.seed, self.rng, self.shift))

    def __repr__(self) -> str:
        return f"Seeding(seed={self.seed}, rng={self.rng}, shift={self.shift})"

    def shifted(self, by: int) -> Seeding:
        """These seeds for copies of rows ``by:`` numbered from 0 (serial's reference rows
        of a batch's later rows draw as those rows do)."""
        return Seeding(self.seed, self.rng, self.shift + by)

    def row(self, i: int) -> dict[str, Any]:
        """Seed what row ``i`` draws from; the keywords its call adds (``rng``)."""
        seed = mix(self.seed, i + self.shift)
        if self.rng:
            generator = getattr(self._local, "generator", None)
            if generator is None:
                generator = self._local.generator = torch.Generator()
            generator.manual_seed(seed)
            return {"rng": generator}
        run = getattr(self._local, "run", None)
        if run is None:  # a row on its own (serial's reference rows): every generator
            _seed_all(seed)
        else:
            run.seed(i, seed)
        return {}

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """A run of rows in this thread: the global generators put back afterwards."""
        if self.rng:
            yield
            return
        outer = getattr(self._local, "run", None)
        run = self._local.run = _Run()
        try:
            yield
            run.check()
        finally:
            self._local.run = outer
            run.before.restore()


class _Run:
    """Which global generators a run of rows seeds: torch's always; ``random`` and
    numpy's where its first row moved them."""

    def __init__(self) -> None:
        self.before = States.now()
        self.first: int | None = None  # the first row, until the second comes
        self.after_first: States | None = None
        self.python = self.numpy = True  # until the first row shows otherwise
        #: the states once the first row showed what it draws from (those not seeded
        #: from then on must not move)
        self.unseeded: States | None = None

    def seed(self, i: int, seed: int) -> None:
        if self.first is None:
            self.first = i
            _seed_all(seed)
            self.after_first = States.now()
            return
        if self.after_first is not None:  # the second row: what did the first draw from?
            now = States.now()
            self.python = now.random != self.after_first.random
            self.numpy = not same_numpy(now.numpy, self.after_first.numpy)
            self.after_first, self.unseeded = None, now
        _seed_all(seed, self.python, self.numpy)

    def check(self) -> None:
        """A generator left unseeded after the first row must not have moved since."""
        unseeded = self.unseeded
        if unseeded is None:
            return
        now = States.now()
        moved = []
        if not self.python and now.random != unseeded.random:
            moved.append("Python's random")
        if not self.numpy and not same_numpy(now.numpy, unseeded.numpy):
            moved.append("numpy's global generator")
        if moved:
            raise RuntimeError(
                f"with seed=, the row function drew from {' and '.join(moved)} on a later "
                f"row but not on row {self.first}, the first of its run, so prep had not "
                f"seeded it for every row; take an rng keyword and draw from it (a "
                f"torch.Generator seeded for each row), or draw on every row"
            )


def _seed_all(seed: int, python: bool = True, numpy: bool = True) -> None:
    torch.random.default_generator.manual_seed(seed)  # not torch.manual_seed: no CUDA
    if python:
        random.seed(seed)
    if numpy and (np := sys.modules.get("numpy")) is not None:
        np.random.seed(seed % 2**32)  # numpy's legacy seeds are 32-bit
