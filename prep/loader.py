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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ._explanation import Explanation
from ._fetch import Fetch, Keyed
from .core.checks import call_problem, describe_callable
from .core.options import Options
from .core.seeding import Seeding, mix, takes_rng
from .errors import ConfigError, RowError
from .pool import SHARED
from .registry import AUTO
from .stream.stats import Meter, StreamStats, verdict
from .stream.stream import Stream, check_prefetch

__all__ = ["Epoch", "Fetch", "Loader"]


@dataclass
class _Place:
    """Where an epoch's consumer is: the samples of the epoch's order before its first
    batch (``start``), the steps passed since (a step is a batch on every rank: handed
    over, or failed and gone past), whether it ended; its stream while it lives (for
    :meth:`Loader.stats`), its figures once it ends."""

    epoch: int
    start: int
    steps: int = 0
    ended: bool = False
    stream: weakref.ref[Stream] | None = None
    final: StreamStats | None = None
    strategy: Callable[[], str] | None = None  # how its stream runs batches (explain)

    def stats(self) -> StreamStats | None:
        stream = self.stream() if self.stream is not None else None
        return stream.stats() if stream is not None else self.final


class Epoch(Iterator[Any]):
    """One pass over a :class:`Loader`: its batches in order, from a stream of the pool
    (``close()``, leaving a ``with`` block, dropping it or Ctrl-C stop it, as they stop
    a stream). It holds its Loader, so ``for batch in prep.Loader(...)`` runs with no
    name for the Loader. A batch that raises is raised in its place; a loop that
    catches the error and calls ``next()`` again gets the rest of the epoch (as a
    DataLoader's does), and until it does, the Loader's ``state_dict`` points at the
    failed batch."""

    def __init__(self, loader: Loader, place: _Place, order: torch.Tensor) -> None:
        self._loader, self._place, self._order = loader, place, order
        self._failed = False  # the last batch raised: the next call goes on past it
        self._streams = [loader._stream(order, place)]  # the one running, last
        weakref.finalize(self, _keep_figures, place, self._streams)

    def __iter__(self) -> Epoch:
        return self

    def __next__(self) -> Any:
        place = self._place
        if self._failed:  # the loop went on past a failed batch: a stream of the rest
            self._failed, place.steps = False, place.steps + 1
            self._streams[-1].close()
            self._streams[-1] = self._loader._stream(self._order, place)
        stream = self._streams[-1]
        try:
            batch = next(stream)
        except StopIteration:
            place.ended = True
            place.final = stream.stats()
            raise
        except Exception as exc:
            self._failed = True
            _name_sample(exc, self._loader._share(self._order, place))
            raise
        place.steps += 1
        return self._loader._collated(batch)

    def stats(self) -> StreamStats:
        """The stream's figures, and what bounds the loop (:meth:`prep.Pool.imap`)."""
        return self._streams[-1].stats()

    def close(self) -> None:
        self._streams[-1].close()
        self._place.final = self._streams[-1].stats()

    def __enter__(self) -> Epoch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Loader:
    """Batches of ``fn(dataset[i])``, an epoch per ``for`` loop, made by a pool's stream
    while you use the current one: a DataLoader whose workers are sent indices.

    ``dataset`` is map-style (``__getitem__`` and ``__len__``); each batch is what
    :func:`prep.map_samples` returns for its samples (``pad=``, ``on_error=``,
    ``device=``, ... as ``options``; ``setup=`` as there), or ``collate(results)``,
    the list of each sample's result, where ``collate`` is given. The order of epoch
    ``e`` is ``range(len(dataset))``, with ``shuffle`` a permutation drawn from
    ``(seed, e)`` (no seed: one drawn from torch's generator when the Loader is made,
    kept in its state), or the indices ``sampler`` gives (with ``seed=``, a sampler
    with a ``generator`` attribute is given one seeded by ``(seed, e)``). With
    ``rank``/``world_size`` (by default ``torch.distributed``'s, once initialised),
    this process takes its share of every step of ``batch_size * world_size``
    samples. With ``seed=``, each sample's random draws are keyed by ``(seed, epoch,
    its index)``: the same in any batch, order, rank or executor (see ``map_rows``'
    ``seed=`` for what is seeded). ``executor``, ``workers`` and ``setup`` pick the
    shared pool ``map_samples`` runs on (warm between epochs; :func:`prep.shutdown`
    closes it); ``prefetch`` is :meth:`prep.Pool.imap`'s. :meth:`state_dict` is
    where the loop is; :meth:`load_state_dict` resumes there.

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
        sampler: Iterable[int] | None = None,
        seed: int | None = None,
        drop_last: bool = False,
        collate: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        executor: str = AUTO,
        workers: int | None = None,
        prefetch: int | None = None,
        setup: Callable[[], Any] | None = None,
        **options: Any,  # map_samples' (CallOptions), but seed=, which is the Loader's
    ) -> None:
        self.samples = _check_dataset(dataset, fn)
        _check_dataloader_names(options)
        _check_fn(fn, setup is not None, seed is not None)
        self.batch_size = _check_count("batch_size", batch_size)
        self.shuffle = _check_flag("shuffle", shuffle)
        self.sampler = _check_sampler(sampler, shuffle)
        self.drop_last = _check_flag("drop_last", drop_last)
        self.collate = _check_collate(collate, options)
        self.rank, self.world_size = _ranks(rank, world_size)
        self._given = Options.of("prep.Loader", {**options, "seed": seed}).seed  # checked
        self.seed = self._given if self._given is not None else _drawn()
        self.prefetch = prefetch if prefetch is None else check_prefetch(prefetch)
        self._pool = SHARED.pool(executor, workers, setup)
        self._options = dict(options, pad=0, return_lengths=True) if collate else dict(options)
        self._fetch = (Keyed if self._given is not None else Fetch)(dataset, fn)
        weakref.finalize(self, self._fetch.forget)
        self._rng = self._given is not None and takes_rng(fn)
        self._epoch = self._position = 0  # what the next ``for`` runs, from which sample
        self._place: _Place | None = None  # the latest epoch's, while it runs

    def __len__(self) -> int:
        """This rank's batches in an epoch (a last, smaller one left out under
        ``drop_last``; ranks differ by one where the last step is too short to give
        every rank a sample)."""
        return self._left(0)

    def _left(self, position: int) -> int:
        """This rank's batches from sample ``position`` of an epoch's order."""
        full, rest = divmod(max(self._length() - position, 0), self._step)
        return full + (1 if rest > self.rank and not self.drop_last else 0)

    @property
    def _step(self) -> int:
        """Samples of the order a step takes: a batch for every rank."""
        return self.batch_size * self.world_size

    def _length(self) -> int:
        """Samples in an epoch's order."""
        return len(self.sampler) if self.sampler is not None else self.samples

    def __iter__(self) -> Epoch:
        epoch, position = self._epoch, self._position
        self._epoch, self._position = epoch + 1, 0
        self._place = _Place(epoch, position)
        return Epoch(self, self._place, self.order(epoch))

    def _stream(self, order: torch.Tensor, place: _Place) -> Stream:
        """A stream of epoch ``place.epoch``'s batches from the step ``place`` is at."""
        # seed=: the stream's run of rows seeds the global generators and puts them back
        # after each batch (on threads it watches them); Keyed keys each sample's draws
        # by its index through that run, whether or not fn takes rng (__getitem__ may draw)
        given = self._given is not None
        options = {**self._options, "seed": mix(self.seed, -1) if given else None}
        seeds = Seeding(mix(self.seed, place.epoch), self._rng) if self._given is not None else None
        at = place.start + place.steps * self._step
        batches = _Sized(self._batches(order, at, seeds), self._left(at))  # the bar's total
        stream = self._pool.imap_samples(self._fetch, batches, prefetch=self.prefetch, **options)
        place.stream, place.strategy = weakref.ref(stream), stream.strategy
        return stream

    def _batches(
        self, order: torch.Tensor, position: int, seeds: Seeding | None
    ) -> Iterator[list[Any]]:
        """This rank's batches of indices from sample ``position`` of ``order`` (pulled
        by the stream's thread): under ``seed=``, each index with the epoch's seeds."""
        for at in range(position, len(order), self._step):
            share = self._share_at(order, at)
            if not share or (self.drop_last and len(order) - at < self._step):
                return
            yield share if seeds is None else [(i, seeds) for i in share]

    def _share_at(self, order: torch.Tensor, at: int) -> list[int]:
        """This rank's indices of the step that starts at sample ``at``: every
        ``world_size``-th from its rank, so that a step takes a run of the order."""
        return order[at : at + self._step][self.rank :: self.world_size].tolist()

    def _share(self, order: torch.Tensor, place: _Place) -> list[int]:
        return self._share_at(order, place.start + place.steps * self._step)

    def _collated(self, batch: Any) -> Any:
        """The batch the loop gets: ``collate`` of each sample's own result, where given."""
        if self.collate is None:
            return batch
        out, lengths = batch
        return self.collate(_each(out, lengths))

    def stats(self) -> StreamStats:
        """The latest epoch's figures (so far, while it runs), and (its ``str()``) what
        bounds the loop: :meth:`prep.Pool.imap`'s ``stats()``."""
        place = self._place
        found = place.stats() if place is not None else None
        return found if found is not None else Meter(0, 1).stats()  # no epoch yet

    def explain(self) -> Explanation:
        """What this Loader's latest epoch ran (its pool's executor and workers, how its
        stream ran the batches, where it is) and what bounded its loop: this Loader's
        own, where ``pool.explain()`` tells of every stream of a shared pool."""
        pool, place = self._pool, self._place
        lines = [
            f"prep.Loader: {type(self._fetch.dataset).__name__} of {self.samples:,} samples, "
            f"{len(self):,} batches of {self.batch_size} an epoch"
            + (f" on rank {self.rank} of {self.world_size}" if self.world_size > 1 else "")
            + f"; executor={pool.executor!r}, {pool.workers} workers"
        ]
        if place is None:
            lines.append("  no epoch yet")
        else:
            state = "ended" if place.ended else "running"
            lines.append(f"  epoch {place.epoch} ({state}): {place.steps:,} batches handed over")
            if place.strategy is not None:
                lines.append("  " + place.strategy().strip())
            stats = self.stats()
            if stats.batches:
                lines.append(f"  {verdict(stats)}")
        return Explanation((), lines)

    def order(self, epoch: int) -> torch.Tensor:
        """The dataset's indices in epoch ``epoch``'s order (int64), all ranks' together."""
        if self.sampler is not None:
            if self._given is not None and hasattr(self.sampler, "generator"):
                seeded = torch.Generator().manual_seed(mix(self.seed, epoch))
                self.sampler.generator = seeded
            return torch.as_tensor(list(self.sampler), dtype=torch.int64)
        if not self.shuffle:
            return torch.arange(self.samples)
        generator = torch.Generator().manual_seed(mix(self.seed, epoch))
        return torch.randperm(self.samples, generator=generator)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: ``epoch``, ``position`` (the samples of the epoch's order
        handed over on every rank: a resume yields the rest, at any batch size or world
        size), the order's ``seed``, the ``samples`` in the dataset, and (where the
        dataset has ``state_dict()``) ``dataset``, the dataset's state in this process.
        An epoch run to its end is the next one at its start. Plain values:
        ``torch.save`` or ``json`` keep it (the dataset's part as it gave it)."""
        place = self._place
        if place is not None and not place.ended:
            epoch, position = place.epoch, place.start + place.steps * self._step
        else:
            epoch, position = self._epoch, self._position
        epoch, position = self._past_the_end(epoch, position)
        state = {
            "epoch": epoch,
            "position": position,
            "seed": self.seed,
            "samples": self.samples,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
        }
        if _stateful(self._fetch.dataset):
            state["dataset"] = self._fetch.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (a :meth:`state_dict`): the next ``for`` loop yields that
        epoch's batches after the samples already handed over, then epochs go on."""
        epoch, position, seed = _check_state(state, self)
        self.seed = seed
        self._epoch, self._position = self._past_the_end(epoch, position)
        self._place = None
        if "dataset" in state and _stateful(self._fetch.dataset):
            self._fetch.dataset.load_state_dict(state["dataset"])
            self._fetch.forget()  # worker processes read the dataset anew, in this state

    def _past_the_end(self, epoch: int, position: int) -> tuple[int, int]:
        """An epoch whose every step was taken is the next one, at its start."""
        left = self._length() - position
        if left <= 0 or (self.drop_last and left < self._step):
            return epoch + 1, 0
        return epoch, position

    def __repr__(self) -> str:
        return (
            f"<prep.Loader {type(self._fetch.dataset).__name__} of {self.samples} samples, "
            f"batch_size={self.batch_size}, executor={self._pool.executor!r}, "
            f"epoch {self.state_dict()['epoch']}>"
        )


class _Sized(Iterator[Any]):
    """An epoch's batches with their number, which a progress bar shows as its end."""

    def __init__(self, batches: Iterator[Any], count: int) -> None:
        self._batches, self._count = batches, count

    def __next__(self) -> Any:
        return next(self._batches)

    def __length_hint__(self) -> int:
        return self._count


def _keep_figures(place: _Place, streams: list[Stream]) -> None:
    """An epoch dropped: its stream's figures kept for :meth:`Loader.stats`."""
    if place.final is None:
        place.final = streams[-1].stats()


def _name_sample(exc: BaseException, indices: list[int]) -> None:
    """A failed row named by its dataset index too (a batch's row alone would leave the
    user to find it in ``loader.order(epoch)``)."""
    row = getattr(exc, "row", None)
    if isinstance(exc, RowError) and isinstance(row, int) and 0 <= row < len(indices):
        exc.index = indices[row]  # type: ignore[attr-defined]
        exc.args = (f"dataset[{indices[row]}] (row {row} of the batch): {exc}",)


def _each(out: Any, lengths: Any) -> list[Any]:
    """Each sample's own result, from a batch padded to the longest (its rows'
    ``lengths``): views, not copies."""
    if isinstance(out, torch.Tensor):
        sizes = [size if isinstance(size, list) else [size] for size in lengths.tolist()]
        return [row[tuple(slice(0, n) for n in size)] for row, size in zip(out, sizes)]
    if isinstance(out, dict):
        columns = {k: _each(v, lengths[k]) for k, v in out.items()}
        return [dict(zip(columns, row)) for row in zip(*columns.values())]
    return [tuple(row) for row in zip(*(_each(v, n) for v, n in zip(out, lengths)))]


def _stateful(dataset: Any) -> bool:
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
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


#: the DataLoader's arguments that a Loader takes under another name or in another way,
#: and what to pass instead (docs/streams.md has the whole table)
DATALOADER = {
    "num_workers": "workers= (and executor=: 'processes', 'threads', 'serial' for none)",
    "collate_fn": "collate=, a function of the list of fn's results for each sample",
    "pin_memory": "device='cuda' (prep pins and copies each batch to the GPU)",
    "prefetch_factor": "prefetch=, the batches made ahead in all",
    "worker_init_fn": "setup=, a function whose result each worker's fn gets as state=",
    "generator": "seed=, a number that keys the order and each sample's draws",
    "batch_sampler": "sampler= with batch_size=, or a dataset indexed by batch",
    "persistent_workers": "nothing: the pool's workers stay up between epochs",
    "multiprocessing_context": "nothing: prep starts its own worker processes",
    "in_order": "nothing: batches always come in order",
}


def _check_dataloader_names(options: dict[str, Any]) -> None:
    for name, instead in DATALOADER.items():
        if name in options:
            raise TypeError(
                f"prep.Loader got the DataLoader's {name}={options[name]!r:.40}; pass {instead}"
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


def _check_sampler(sampler: Any, shuffle: bool) -> Any:
    """``sampler``: an iterable of indices with a length; a ConfigError naming the fix."""
    if sampler is None:
        return None
    if shuffle:
        raise ConfigError(
            "sampler= gives the order of each epoch, and shuffle=True draws one: pass one "
            "of them (a sampler that shuffles draws its own order)"
        )
    if not (hasattr(sampler, "__iter__") and hasattr(sampler, "__len__")):
        raise ConfigError(
            f"sampler={sampler!r:.60} is not an iterable of indices with a length; pass a "
            f"torch.utils.data sampler (RandomSampler, WeightedRandomSampler, ...) or a list"
        )
    return sampler


def _check_collate(collate: Any, options: dict[str, Any]) -> Any:
    """``collate``: a function of the list of results, with no option that shapes the
    batch prep would stack; a ConfigError naming the fix otherwise."""
    if collate is None:
        return None
    if not callable(collate):
        raise TypeError(
            f"collate={collate!r:.60} is not a function; pass a function of the list of "
            f"each sample's result that returns the batch (or drop it for prep's stacking)"
        )
    shaping = [k for k in ("pad", "pad_to", "return_lengths", "return_valid", "return_errors")
               if options.get(k) is not None and options.get(k) is not False]  # fmt: skip
    if shaping:
        raise ConfigError(
            f"collate= builds the batch from each sample's own result, so {shaping[0]}= has "
            f"no batch to shape; drop {shaping[0]}= (pad or mark in collate), or drop collate="
        )
    return collate


def _ranks(rank: Any, world_size: Any) -> tuple[int, int]:
    """This process's rank and the world size: as given, else torch.distributed's once
    it is initialised, else one process."""
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world_size))
    if not whole or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank={rank!r} of world_size={world_size!r}: pass both, whole numbers with "
            f"0 <= rank < world_size (e.g. rank=torch.distributed.get_rank(), "
            f"world_size=torch.distributed.get_world_size()), or neither"
        )
    return rank, world_size


def _check_state(state: Any, loader: Loader) -> tuple[int, int, int]:
    """``state``'s epoch, position and seed, where it fits ``loader``; a ConfigError
    naming what does not (another dataset, another given seed). A state saved before
    positions were counted in samples has ``batches`` of its ``batch_size``."""
    keys = ("epoch", "seed", "samples")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ConfigError(
            f"state={state!r:.80} is not a prep.Loader state_dict() (a dict of "
            f"{', '.join(keys)}, position, ...); pass what loader.state_dict() returned"
        )
    if "position" not in state and "batches" in state:
        state = {**state, "position": state["batches"] * state.get("batch_size", 1)}
    position = state.get("position")
    if not all(isinstance(v, int) and v >= 0 for v in (state["epoch"], position)):
        raise ConfigError(
            f"the state's epoch={state['epoch']!r} and position={position!r} must be "
            f"whole numbers >= 0; pass what loader.state_dict() returned"
        )
    if state["samples"] != loader.samples:
        raise ConfigError(
            f"the state counts its position in a dataset of samples={state['samples']!r}, "
            f"but this Loader's has samples={loader.samples!r}; resume with the dataset "
            f"the state was saved from"
        )
    if loader._given is not None and state["seed"] != loader._given:
        raise ConfigError(
            f"the state was saved from a Loader of seed={state['seed']!r}, but this one "
            f"has seed={loader._given!r}: its order and draws differ; make it with "
            f"seed={state['seed']!r}"
        )
    return int(state["epoch"]), int(position), int(state["seed"])
