"""``seed=``: a row's random draws are a property of the row, not of who runs it.

With a seed, row ``i`` of a batch draws from generators seeded from ``(seed, i)``
(:func:`mix`), in whatever process or worker computes it, so every executor that
runs rows one by one returns serial's rows, at any worker count, and a resumed
``prep run`` the rows of an uninterrupted one. A stream's batch ``k`` is keyed
under ``mix(seed, k)``, a shard's rows under the shard's path (``prep run``), a
Loader's sample under its index (:meth:`Seeding.sample`).

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

Threads (``shared``: an executor whose rows run at once in threads of one
process) share the global generators with each other and with the rest of the
process, so nothing seeds them there (a reseed would move the draws of the
user's own threads too). Rows of a function without ``rng`` run unseeded and
watched instead: torch's generator is compared before and after each row (about
7 microseconds), Python's and numpy's across the run (reading numpy's costs 45
microseconds); a row that moved one stops the run with a ConfigError naming
the fix, so a function that draws nothing gives a plain loop's rows there, and
one that draws never returns rows that were not seeded. The watch sees the
process's generators, not the row's draws: another thread drawing from them
while a row runs (a training step's dropout on CPU) stops the run as well, and
the error says so. A batched call (``vectorized``, ``vmap``) draws for all rows
at once and cannot seed each row.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import ConfigError
from .checks import signature
from .generators import States, same_numpy
from .state import WithState

__all__ = ["Seeding", "mix", "takes_rng"]

_MASK = (1 << 64) - 1
#: ``.run``: the run of rows this thread is in (:meth:`Seeding.run`), if any: a Loader's
#: sample, fetched by the function the run's rows call, is seeded through it
_HERE = threading.local()


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
    function takes an ``rng`` keyword, and draws from it alone; ``shared``: the rows
    run on threads that share the global generators, which are watched, not seeded.
    Travels with the rows (``Rows.seeds``), as a :class:`~prep.core.policy.ResultCheck`
    does."""

    def __init__(self, seed: int, rng: bool = False, shift: int = 0, shared: bool = False) -> None:
        self.seed, self.rng, self.shared = seed, rng, shared
        self.shift = shift  # rows numbered from 0 that are the batch's rows shift:
        self._local = threading.local()  # each thread's generator, for ``rng``

    def __reduce__(self) -> tuple[Any, ...]:  # the thread-local part is each process's own
        return (Seeding, (self.seed, self.rng, self.shift, self.shared))

    def __repr__(self) -> str:
        return (
            f"Seeding(seed={self.seed}, rng={self.rng}, shift={self.shift}, shared={self.shared})"
        )

    def shifted(self, by: int) -> Seeding:
        """These seeds for copies of rows ``by:`` numbered from 0 (serial's reference rows
        of a batch's later rows draw as those rows do, seeded where they run)."""
        return Seeding(self.seed, self.rng, self.shift + by)

    def row(self, i: int) -> dict[str, Any]:
        """Seed what row ``i`` draws from; the keywords its call adds (``rng``)."""
        seed = mix(self.seed, i + self.shift)
        if self.rng:
            return {"rng": self._generator(seed)}
        run = getattr(_HERE, "run", None)
        if run is None or run.seeds is not self:  # a row on its own (serial's reference)
            _seed_all(seed)
        else:
            run.seed(i, seed)
        return {}

    def sample(self, index: int) -> dict[str, Any]:
        """Seed what sample ``index`` of a Loader's epoch draws from (``seed``: the
        epoch's), before the sample is fetched, so that its draws are keyed by its index
        wherever they are made: in ``dataset[index]``, a transform it calls, or ``fn``;
        the keywords ``fn``'s call adds (``rng``).

        Its key ``s = mix(seed, index)`` seeds the global generators; a function that
        takes ``rng`` draws from a generator seeded with ``s``, and the global generators
        (for ``dataset[index]``) are seeded with ``mix(s, 1)`` then, so that the two
        draw apart. That is done through the run of rows the sample is in (the stream's
        ``seed=``): in its place on serial and in worker processes, the generators put
        back after the batch; not at all on threads, where the run watches."""
        seed = mix(self.seed, index + self.shift)
        given = {"rng": self._generator(seed)} if self.rng else {}
        key = mix(seed, 1) if self.rng else seed
        run = getattr(_HERE, "run", None)  # the stream's: its seeds are not these
        if run is None:  # a sample on its own (serial's reference rows, kept by the caller)
            _seed_all(key)
        else:
            run.rekey(key)
        return given

    def _generator(self, seed: int) -> torch.Generator:
        generator = getattr(self._local, "generator", None)
        if generator is None:
            generator = self._local.generator = torch.Generator()
        return generator.manual_seed(seed)

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """A run of rows in this thread: the global generators put back afterwards, or,
        ``shared``, watched: a row that moved one stops the run with a ConfigError."""
        if self.rng:
            yield
            return
        outer = getattr(_HERE, "run", None)
        run = _HERE.run = _Watch(self) if self.shared else _Run(self)
        try:
            yield
            run.check()
        except Exception:
            # a draw seen on threads stops the next row, which fails as a row (a RowError,
            # or a filled row under on_error='fill'): the draw is the run's error
            if isinstance(run, _Watch) and run.stop is not None:
                raise run.stop from None
            raise
        finally:
            _HERE.run = outer
            run.end()


class _Run:
    """Which global generators a run of rows seeds: torch's always; ``random`` and
    numpy's where its first row moved them."""

    def __init__(self, seeds: Seeding) -> None:
        self.seeds = seeds
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

    def rekey(self, seed: int) -> None:
        """The current row's draws under ``seed`` instead (a Loader's sample, keyed by
        its index, not its place); on the first row, what it draws from is read after
        this seeding, not the row's."""
        _seed_all(seed, self.python, self.numpy)
        if self.after_first is not None:
            self.after_first = States.now()

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

    def end(self) -> None:
        self.before.restore()


class _Watch:
    """A run of rows on a thread that shares the global generators (``Seeding.shared``):
    none is seeded here, and a row that moved one stops the run (:attr:`stop`). Torch's
    is read as each row begins (so the last row's draws are seen before the next row
    runs), Python's and numpy's as the run begins and ends (numpy's costs 45
    microseconds to read: once a run, not once a row)."""

    def __init__(self, seeds: Seeding) -> None:
        self.seeds = seeds
        self.before = States.now()
        self.first: int | None = None
        self.current: int | None = None
        self.torch: torch.Tensor | None = None  # torch's state as the current row began
        self.stop: ConfigError | None = None

    def seed(self, i: int, seed: int) -> None:
        """Row ``i`` begins: nothing is seeded; the row before it must not have drawn."""
        self._look()
        if self.stop is not None:
            raise self.stop
        self.first = i if self.first is None else self.first
        self.current, self.torch = i, torch.random.get_rng_state()

    def rekey(self, seed: int) -> None:
        """Nothing to seed on threads: the row is watched under any key."""

    def check(self) -> None:
        self._look()
        if self.stop is None and self.first is not None:
            moved = self.before.moved_besides_torch()
            if moved is not None:
                self.stop = _drew(moved, f"rows {self.first} to {self.current}")
        if self.stop is not None:
            raise self.stop

    def _look(self) -> None:
        """The current row's draws from torch's generator, if it moved while the row ran."""
        if self.stop is not None or self.torch is None:
            return
        if not torch.equal(torch.random.get_rng_state(), self.torch):
            self.stop = _drew("torch's default CPU generator", f"row {self.current}")

    def end(self) -> None:
        """Nothing to put back: nothing was seeded (and a restore would move the draws of
        the process's other threads)."""


def _drew(what: str, rows: str) -> ConfigError:
    """The error of a watched run whose ``rows`` moved ``what``: one line, and the fix."""
    return ConfigError(
        f"seed= on threads: {what} moved while {rows} ran; threads share it with the whole "
        f"process, so prep cannot seed it for each row. If the row drew from it (the row "
        f"function, or a Loader's dataset[i]), draw from the row function's rng parameter "
        f"instead (torch.rand(..., generator=rng)), or use executor='processes' or "
        f"'serial', which seed it for each row; if not, another thread of this process "
        f"drew from it meanwhile (a training step's dropout on CPU, say): use "
        f"executor='processes'"
    )


def _seed_all(seed: int, python: bool = True, numpy: bool = True) -> None:
    torch.random.default_generator.manual_seed(seed)  # not torch.manual_seed: no CUDA
    if python:
        random.seed(seed)
    if numpy and (np := sys.modules.get("numpy")) is not None:
        np.random.seed(seed % 2**32)  # numpy's legacy seeds are 32-bit
