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

import contextlib
import os
import pickle
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._kept import keep_newest
from .core.checks import call_problem, describe_callable
from .core.options import Options
from .core.seeding import Seeding, mix, takes_rng
from .errors import ConfigError
from .executors import pickle_fn
from .pool import SHARED
from .registry import AUTO
from .stream.stream import Stream, check_prefetch

if TYPE_CHECKING:
    from .stream.stats import StreamStats

__all__ = ["Epoch", "Fetch", "Loader"]


class Fetch:
    """``fn(dataset[index])``: the row function of a Loader's stream, whose rows are
    indices. Worker processes get it as a file they read once each (pickled on first
    need, kept while the Loader lives), so a batch sends its indices alone, whatever
    the engine pickles per batch; threads and serial index the dataset here."""

    def __init__(self, dataset: Any, fn: Callable[..., Any]) -> None:
        self.dataset, self.row_fn = dataset, fn
        self._file: tuple[str, str] | None = None  # (path, token) once written
        self._writer = os.getpid()  # the process that wrote it, the only one to remove it
        self._lock = threading.Lock()

    def __call__(self, index: int, **given: Any) -> Any:
        return self.row_fn(self.dataset[index], **given)

    def __repr__(self) -> str:
        return f"{describe_callable(self.row_fn)} of {type(self.dataset).__name__}[i]"

    def __reduce__(self) -> tuple[Any, ...]:
        with self._lock:
            if self._file is None:
                self._file, self._writer = _write(self), os.getpid()
        return (_read, self._file)

    def forget(self) -> None:
        """Remove the workers' file (its Loader is gone; prep's caches may keep this
        object a while, and a later pickling writes it anew)."""
        with self._lock:
            written, self._file = self._file, None
        if written is not None:
            _remove(written[0], self._writer)


class Keyed(Fetch):
    """:class:`Fetch` whose rows are ``(index, seeds)``: the sample's draws seeded by
    ``seeds.row(index)``, keyed by its index (``seeds``: the epoch's). A function that
    takes ``rng`` is given a generator seeded so; any other draws from the global
    generators, seeded so here, after prep seeded them for the row's place (prep's
    ``seed=`` puts them back after the batch and keeps such rows off threads)."""

    def __call__(self, item: tuple[int, Seeding], **given: Any) -> Any:  # type: ignore[override]
        index, seeds = item
        return self.row_fn(self.dataset[index], **given, **seeds.row(index))


#: worker side: the Fetch of each file read, the latest kept (an engine that does not
#: keep functions, joblib's, unpickles the small handle every batch)
_READ: dict[str, Fetch] = {}
_READ_LOCK = threading.Lock()
#: Loaders whose datasets a worker process keeps
READ = 4


def _write(fetch: Fetch) -> tuple[str, str]:
    """``fetch`` pickled (its dataset and function, by value where workers cannot
    import them) into a file of its own, removed when its Loader goes."""
    try:
        blob = pickle_fn((type(fetch), fetch.dataset, fetch.row_fn))
    except ConfigError as exc:
        raise ConfigError(
            f"worker processes get the dataset ({type(fetch.dataset).__name__}) and the row "
            f"function {describe_callable(fetch.row_fn)} once, pickled, and they cannot be "
            f"pickled ({exc.__cause__!r:.200}); make them picklable (open files and handles "
            f"in __getitem__, or in setup=), or use executor='threads'"
        ) from exc.__cause__
    fd, path = tempfile.mkstemp(prefix="prep-loader-", suffix=".pkl")
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    weakref.finalize(fetch, _remove, path, os.getpid())  # at exit, if not before
    return path, uuid.uuid4().hex


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child's copy is not its file
        with contextlib.suppress(OSError):
            os.remove(path)


def _read(path: str, token: str) -> Fetch:
    """The Fetch in ``path``, read once in this process."""
    with _READ_LOCK:
        fetch = _READ.get(token)
        if fetch is None:
            with open(path, "rb") as f:
                kind, dataset, fn = pickle.load(f)
            fetch = kind(dataset, fn)
        keep_newest(_READ, token, fetch, READ)
        return fetch


@dataclass
class _Place:
    """Where an epoch's consumer is: the batches it was handed, and whether it ended."""

    epoch: int
    batches: int
    ended: bool = False


class Epoch(Iterator[Any]):
    """One pass over a :class:`Loader`: its batches in order, from a stream of the pool
    (``close()``, leaving a ``with`` block, dropping it or Ctrl-C stop it, as they stop
    a stream); it counts the batches handed over, which the Loader's ``state_dict``
    reads."""

    def __init__(self, stream: Stream, place: _Place) -> None:
        self._stream, self._place = stream, place

    def __iter__(self) -> Epoch:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._stream)
        except StopIteration:
            self._place.ended = True
            raise
        self._place.batches += 1
        return batch

    def stats(self) -> StreamStats:
        """The stream's figures, and what bounds the loop (:meth:`prep.Pool.imap`)."""
        return self._stream.stats()

    def close(self) -> None:
        self._stream.close()

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
