"""``prep.Loader``: a map-style dataset in batches, an epoch at a time, each sample's row
function run by the pool's stream, whose workers are sent indices, not samples.

    Loader.__iter__ ─▶ epoch e's order (seed, e) ─▶ batches of indices, from the
                       │                            position a state_dict() saved
                       ▼
    Pool.imap_samples(Fetch, index batches) ─▶ fn(dataset[i]) for i in a batch,
                       │                        stacked as map_samples stacks them
                       ├ serial, threads: the dataset indexed here
                       └ processes: a worker reads the dataset (with fn) from a
                         file once, written on first need; then only indices travel

The stream is the pool's own (its engine, tickets and strategies): a Loader adds an
order, a position, and a row function that fetches by index (:class:`Fetch`).
With ``seed=``, a sample's draws are keyed by ``(seed, epoch, its index)``: the
same whatever batch it lands in, in any order, on any executor.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._fetch import Fetch, Keyed
from .core.checks import call_problem, describe_callable
from .core.options import Options
from .core.seeding import Seeding, mix, takes_rng
from .errors import ConfigError
from .pool import SHARED
from .registry import AUTO
from .stream.stats import Meter, StreamStats
from .stream.stream import Stream, check_prefetch

__all__ = ["Epoch", "Fetch", "Loader"]


@dataclass
class _Place:
    """Where an epoch's consumer is: the batches it was handed, and whether it ended;
    its stream while it lives (for :meth:`Loader.stats`), its figures once it ends."""

    epoch: int
    batches: int
    ended: bool = False
    stream: weakref.ref[Stream] | None = None
    final: StreamStats | None = None

    def stats(self) -> StreamStats | None:
        stream = self.stream() if self.stream is not None else None
        return stream.stats() if stream is not None else self.final


class Epoch(Iterator[Any]):
    """One pass over a :class:`Loader`: its batches in order, from a stream of the pool
    (``close()``, leaving a ``with`` block, dropping it or Ctrl-C stop it, as they stop
    a stream); it counts the batches handed over, which the Loader's ``state_dict``
    reads."""

    def __init__(self, stream: Stream, place: _Place) -> None:
        self._stream, self._place = stream, place
        place.stream = weakref.ref(stream)
        weakref.finalize(self, _keep_figures, place, stream)

    def __iter__(self) -> Epoch:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._stream)
        except StopIteration:
            self._place.ended = True
            self._place.final = self._stream.stats()
            raise
        self._place.batches += 1
        return batch

    def stats(self) -> StreamStats:
        """The stream's figures, and what bounds the loop (:meth:`prep.Pool.imap`)."""
        return self._stream.stats()

    def close(self) -> None:
        self._stream.close()
        self._place.final = self._stream.stats()

    def __enter__(self) -> Epoch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Loader:
    """Batches of ``fn(dataset[i])``, an epoch per ``for`` loop, made by a pool's stream
    while you use the current one: a DataLoader whose workers are sent indices.

    ``dataset`` is map-style (``__getitem__`` and ``__len__``); each batch is what
    :func:`prep.map_samples` returns for its samples (``pad=``, ``on_error=``,
    ``device=``, ... as ``options``; ``setup=`` as there). The order of epoch ``e``
    is ``range(len(dataset))``, or with ``shuffle`` a permutation drawn from
    ``(seed, e)`` (no seed: one drawn from torch's generator when the Loader is made,
    kept in its state). With ``seed=``, each sample's random draws are keyed by
    ``(seed, epoch, its index)``: the same in any batch, order or executor (see
    ``map_rows``' ``seed=`` for what is seeded). ``executor``, ``workers`` and
    ``setup`` pick the shared pool ``map_samples`` runs on (warm between epochs;
    :func:`prep.shutdown` closes it); ``prefetch`` is :meth:`prep.Pool.imap`'s.
    :meth:`state_dict` is where the loop is; :meth:`load_state_dict` resumes there.

    >>> import torch, prep
    >>> loader = prep.Loader(list(range(10)), torch.tensor, batch_size=4, executor="serial")
    >>> len(loader), [b.tolist() for b in loader]
    (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
    """

    def __init__(
        self,
        dataset: Any,
        fn: Callable[..., Any],
        *,
        batch_size: int = 1,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        executor: str = AUTO,
        workers: int | None = None,
        prefetch: int | None = None,
        setup: Callable[[], Any] | None = None,
        **options: Any,  # map_samples' (CallOptions), but seed=, which is the Loader's
    ) -> None:
        self.samples = _check_dataset(dataset, fn)
        _check_fn(fn, setup is not None, seed is not None)
        self.batch_size = _check_count("batch_size", batch_size)
        self.shuffle = _check_flag("shuffle", shuffle)
        self.drop_last = _check_flag("drop_last", drop_last)
        self._given = Options.of("prep.Loader", {**options, "seed": seed}).seed  # checked
        self.seed = self._given if self._given is not None else _drawn()
        self.prefetch = prefetch if prefetch is None else check_prefetch(prefetch)
        self._pool = SHARED.pool(executor, workers, setup)
        self._options = dict(options)
        self._fetch = (Keyed if self._given is not None else Fetch)(dataset, fn)
        weakref.finalize(self, self._fetch.forget)
        self._rng = self._given is not None and takes_rng(fn)
        self._epoch = self._skip = 0  # what the next ``for`` runs, from which batch
        self._place: _Place | None = None  # the latest epoch's, while it runs

    def __len__(self) -> int:
        """Batches in an epoch (a last, smaller one left out under ``drop_last``)."""
        full, rest = divmod(self.samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Epoch:
        epoch, skip = self._epoch, self._skip
        self._epoch, self._skip = epoch + 1, 0
        # global draws: prep's seed= seeds each row by its place and puts the generators
        # back after the batch; Keyed then seeds them by index, under another key (rows
        # seeded alike by both would look to prep as if the first drew nothing)
        global_draws = self._given is not None and not self._rng
        options = {**self._options, "seed": mix(self.seed, -1) if global_draws else None}
        batches = self._batches(epoch, skip)
        stream = self._pool.imap_samples(self._fetch, batches, prefetch=self.prefetch, **options)
        self._place = _Place(epoch, skip)
        return Epoch(stream, self._place)

    def stats(self) -> StreamStats:
        """The latest epoch's figures (so far, while it runs), and (its ``str()``) what
        bounds the loop: :meth:`prep.Pool.imap`'s ``stats()``."""
        place = self._place
        found = place.stats() if place is not None else None
        return found if found is not None else Meter(0, 1).stats()  # no epoch yet

    def order(self, epoch: int) -> torch.Tensor:
        """The dataset's indices in epoch ``epoch``'s order (int64)."""
        if not self.shuffle:
            return torch.arange(self.samples)
        generator = torch.Generator().manual_seed(mix(self.seed, epoch))
        return torch.randperm(self.samples, generator=generator)

    def _batches(self, epoch: int, start: int) -> Iterator[list[Any]]:
        """Epoch ``epoch``'s batches of indices from batch ``start`` (pulled by the
        stream's thread): under ``seed=``, each index with the epoch's seeds."""
        order, size = self.order(epoch), self.batch_size
        seeds = Seeding(mix(self.seed, epoch), self._rng) if self._given is not None else None
        for k in range(start, len(self)):
            indices = order[k * size : (k + 1) * size].tolist()
            yield indices if seeds is None else [(i, seeds) for i in indices]

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: ``epoch``, ``batches`` handed over in it (the next one is
        the first a resume yields), the order's ``seed``, and the ``batch_size`` and
        ``samples`` the position counts in. An epoch run to its end is the next one at
        its start. Plain values: ``torch.save`` or ``json`` keep it."""
        place = self._place
        if place is not None and not place.ended:
            epoch, batches = place.epoch, place.batches
        else:
            epoch, batches = self._epoch, self._skip
        epoch, batches = self._past_the_end(epoch, batches)
        return {
            "epoch": epoch,
            "batches": batches,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "samples": self.samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (a :meth:`state_dict`): the next ``for`` loop yields that
        epoch's batches after those already handed over, then epochs go on from it."""
        epoch, batches, seed = _check_state(state, self)
        self.seed = seed
        self._epoch, self._skip = self._past_the_end(epoch, batches)
        self._place = None

    def _past_the_end(self, epoch: int, batches: int) -> tuple[int, int]:
        """An epoch whose every batch was handed over is the next one, at its start."""
        if len(self) and batches >= len(self):
            return epoch + 1, 0
        return epoch, batches

    def __repr__(self) -> str:
        return (
            f"<prep.Loader {type(self._fetch.dataset).__name__} of {self.samples} samples, "
            f"batch_size={self.batch_size}, executor={self._pool.executor!r}, "
            f"epoch {self.state_dict()['epoch']}>"
        )


def _keep_figures(place: _Place, stream: Stream) -> None:
    """An epoch dropped: its stream's figures kept for :meth:`Loader.stats`."""
    if place.final is None:
        place.final = stream.stats()


def _drawn() -> int:
    """A seed for the order where none was given: from torch's default generator, so
    ``torch.manual_seed`` makes the shuffles repeat (a DataLoader's do too)."""
    return int(torch.empty((), dtype=torch.int64).random_(0, 2**62))


def _check_dataset(dataset: Any, fn: Any) -> int:
    """``len(dataset)``, for a map-style dataset; a TypeError naming the fix otherwise."""
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        swapped = callable(dataset) and hasattr(fn, "__len__")
        raise TypeError(
            "prep.Loader(dataset, fn) got a function first and a dataset second: the "
            "arguments are swapped; the dataset comes first"
            if swapped
            else f"prep.Loader needs a map-style dataset (__getitem__ and __len__: a list, "
            f"a torch Dataset), got {type(dataset).__name__}, which has no indices; batch "
            f"an IterableDataset or an iterator of samples yourself and stream them with "
            f"pool.imap_samples(fn, batches)"
        )
    return len(dataset)


def _check_fn(fn: Any, state: bool, seeded: bool) -> None:
    """A TypeError where ``fn`` cannot take a sample as the Loader will call it."""
    if not callable(fn):
        raise TypeError(
            f"fn={fn!r:.60} is not a function but a {type(fn).__name__}; pass the row "
            f"function second: prep.Loader(dataset, fn)"
        )
    given = {"state": None} if state else {}
    if seeded and takes_rng(fn):
        given["rng"] = None
    problem = call_problem(fn, 1, (), **given)
    if problem is not None:
        call = ", ".join(["sample", *(f"{k}=..." for k in given)])
        raise TypeError(
            f"the row function {describe_callable(fn)} cannot take a sample, called as "
            f"fn({call}): {problem}; give it one parameter for the sample (dataset[i])"
        )


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{name}={value!r} is not a number of samples; pass a whole number >= 1, e.g. {name}=32"
        )
    return value


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is not True or False")
    return value


def _check_state(state: Any, loader: Loader) -> tuple[int, int, int]:
    """``state``'s epoch, batches and seed, where it fits ``loader``; a ConfigError
    naming what does not (another batch size or dataset, another given seed)."""
    keys = ("epoch", "batches", "seed", "batch_size", "samples")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ConfigError(
            f"state={state!r:.80} is not a prep.Loader state_dict() (a dict of "
            f"{', '.join(keys)}); pass what loader.state_dict() returned"
        )
    if not all(isinstance(state[k], int) and state[k] >= 0 for k in ("epoch", "batches")):
        raise ConfigError(
            f"the state's epoch={state['epoch']!r} and batches={state['batches']!r} must be "
            f"whole numbers >= 0; pass what loader.state_dict() returned"
        )
    for key, ours in (("batch_size", loader.batch_size), ("samples", loader.samples)):
        if state[key] != ours:
            raise ConfigError(
                f"the state counts its position in batches of a Loader of {key}="
                f"{state[key]!r}, but this one has {key}={ours!r}; resume with the "
                f"Loader the state was saved from"
            )
    if loader._given is not None and state["seed"] != loader._given:
        raise ConfigError(
            f"the state was saved from a Loader of seed={state['seed']!r}, but this one "
            f"has seed={loader._given!r}: its order and draws differ; make it with "
            f"seed={state['seed']!r}"
        )
    return int(state["epoch"]), int(state["batches"]), int(state["seed"])
