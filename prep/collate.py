"""A DataLoader ``collate_fn`` that runs the per-sample work of a batch in parallel.

A DataLoader's workers parallelize over whole batches; the per-sample work
inside ``collate_fn`` (padding, cropping, cutting contexts) still runs in a
plain loop. :class:`Collate` maps it over the samples of each batch with an
executor and writes the results into one output.

Where it runs decides what it may do:

* in the main process (``num_workers=0``) it keeps a warm pool of the chosen
  executor for as long as the Collate object lives, and moves each batch to
  ``device``;
* inside a DataLoader worker it never starts processes (a daemonic worker may
  have no children): ``processes``/``joblib`` fall back to threads, with one
  warning per worker; it sizes its threads so that ``num_workers x threads``
  stays within the cores, and returns plain CPU tensors: a worker's batch
  reaches the main process through shared memory, which keeps neither pinning
  nor a device, so ``DataLoader(pin_memory=True)`` pins it there and the
  training loop moves it to the GPU.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._warn import warn
from .core.checks import call_problem, describe_callable
from .core.options import CallOptions, Options
from .core.output import Result, flatten
from .core.rows import Rows, rows_of, samples_of
from .core.seeding import mix
from .errors import ConfigError
from .executors import available_cores, in_worker_process, resolve_workers
from .pool import Pool
from .registry import AUTO, executor_class

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Collate"]


class Collate:
    """``DataLoader(..., collate_fn=prep.Collate(fn, executor="threads"))``.

    ``fn(sample)`` turns one sample into a Tensor, a tuple or a dict of Tensors
    of the same shapes for every sample; the batch is their stack. With
    ``collate=`` (e.g. ``torch.utils.data.default_collate``) the samples are
    collated first and ``fn`` runs on the rows of that batch (``map_rows``). The
    options are ``map_rows``'s (``pad=``, ``on_error=``, ``timeout=``, ``device=``,
    ...), but ``out=``; ``device=`` and ``pin_memory=`` apply in the main process.

    With ``seed=``, batch ``i`` of an epoch draws under ``(seed, epoch, i)``, whichever
    worker builds it: ``i`` is the batch's place in the DataLoader's order (it hands
    batch ``i`` to worker ``i % num_workers``, so a worker's ``k``-th batch is
    ``k * num_workers + id``), the same at any ``num_workers``. Call
    :meth:`set_epoch` before each epoch, as a ``DistributedSampler`` is told. On
    threads, which share the process's global generators, a function without ``rng``
    runs unseeded, and a draw from them stops the batch (``map_rows``' ``seed=``).

    >>> import torch, prep
    >>> pad = lambda s: torch.nn.functional.pad(s, (0, 4 - len(s)))
    >>> collate = prep.Collate(pad, executor="threads", workers=2)
    >>> collate([torch.tensor([1, 2]), torch.tensor([3])]).tolist()
    [[1, 2, 0, 0], [3, 0, 0, 0]]
    >>> collate.close()
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        executor: str = AUTO,
        workers: int | None = None,
        pin_memory: bool = False,
        collate: Callable[[list[Any]], Any] | None = None,
        setup: Callable[[], Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> None:
        if not callable(fn):
            raise TypeError(f"Collate needs a callable row function, got {fn!r}")
        self.fn = fn
        executor_class(executor)  # a ConfigError naming the choices
        self.executor = executor
        self.workers = None if workers is None else resolve_workers(workers)
        self.pin_memory = pin_memory
        self.collate = collate
        self.options = Options.of("Collate", options)  # checked here, not at the first batch
        if self.options.out is not None:
            raise ConfigError(
                "out= is one buffer, but a DataLoader hands you each batch while Collate "
                "makes the next ones: they would overwrite it; drop out= (each batch gets "
                "its own output)"
            )
        self.setup = setup
        self._here = self.options  # as this process runs them (no device in a worker)
        self._pool: Pool | None = None
        self._pid: int | None = None
        self._warned_device = False
        self._epoch = self._count = 0  # seed=: the epoch, and batches taken in it here
        self._checked: set[tuple[Any, str]] = set()  # batch layouts fn was checked against

    def _get_pool(self) -> Pool:
        # a pool belongs to the process that made it: a forked DataLoader worker gets a
        # copy of the parent's object, whose threads or processes it does not have
        if self._pool is None or self._pid != os.getpid():
            in_worker = in_worker_process()
            workers = self.workers
            if in_worker and workers is None:
                info = torch.utils.data.get_worker_info()
                loaders = info.num_workers if info is not None else 1
                workers = max(1, available_cores() // loaders)
            self._pool = Pool(self.executor, workers=workers, setup=self.setup)
            self._here = self.options.with_(device=None) if in_worker else self.options
            self._pid = os.getpid()
            self._count = 0  # a worker counts the batches it takes from its start
            weakref.finalize(self, self._pool.close)
        return self._pool

    def __call__(self, samples: Sequence[Any]) -> Result:
        pool = self._get_pool()
        if self.collate is not None:
            batch = self.collate(list(samples))
            self._check_rows_of(batch)
            rows: Rows = rows_of(batch)
        else:
            rows = samples_of(samples)
        result = pool.run(self.fn, rows, self._seeded(self._here))
        in_worker = in_worker_process()
        if (
            in_worker
            and not self._warned_device
            and (self.pin_memory or (self.device is not None and self.device.type != "cpu"))
        ):
            self._warned_device = True
            warn(
                "prep.Collate returns plain CPU tensors inside DataLoader workers: a batch "
                "reaches the main process through shared memory, which keeps neither pinning "
                "nor a device. Use DataLoader(pin_memory=True) and move the batch to the "
                "device in the training loop"
            )
        if self.pin_memory and not in_worker and self.device is None and torch.cuda.is_available():
            returns = self.options.returns
            result = _pinned(result, extras=returns.lengths or returns.valid or returns.errors)
        return result

    def set_epoch(self, epoch: int) -> None:
        """Key the next batches' draws (``seed=``) under ``epoch``, counted from 0 again.
        DataLoader workers started for the epoch (the default) take it with them; those
        of ``persistent_workers=True`` keep the epoch they started with."""
        self._epoch, self._count = epoch, 0

    def _seeded(self, options: Options) -> Options:
        """This batch's options: under ``seed=``, keyed by the epoch and the batch's place
        in the DataLoader's order."""
        if options.seed is None:
            return options
        k, self._count = self._count, self._count + 1
        info = torch.utils.data.get_worker_info()
        number = k if info is None else k * info.num_workers + info.id
        return options.with_(seed=mix(mix(options.seed, self._epoch), number))

    @property
    def device(self) -> torch.device | None:
        """Where each batch lands, in the main process (checked)."""
        return self.options.device

    @property
    def _state(self) -> dict[str, Any]:
        return {"state": None} if self.setup is not None else {}

    def _check_rows_of(self, batch: Any) -> None:
        """With ``collate=``, ``fn`` runs on the rows of the collated batch as map_rows
        calls it: ``fn(**row)`` for a dict, ``fn(*row)`` for a tuple. Without it, ``fn``
        gets each sample whole: a TypeError that says so, before any row, where the
        function cannot take the row that way."""
        if isinstance(batch, Mapping):
            keys = tuple(batch)
            if (keys, "dict") in self._checked:
                return
            problem = call_problem(self.fn, 0, keys, **self._state)
            how, shape = f"fn({', '.join(f'{k}=...' for k in keys)})", f"a dict {list(keys)}"
        elif isinstance(batch, (tuple, list)):
            if (len(batch), "tuple") in self._checked:
                return
            problem = call_problem(self.fn, len(batch), **self._state)
            how, shape = f"fn({', '.join(['...'] * len(batch))})", f"a {len(batch)}-tuple"
        else:
            return
        if problem is not None:
            raise TypeError(
                f"Collate({describe_callable(self.fn)}, collate=...): the collated batch is "
                f"{shape}, so the function runs on each of its rows as map_rows does, "
                f"{how}, and that call fails: {problem}. Give the function those "
                f"parameters, or leave out collate= to have it take each sample whole"
            )
        self._checked.add((keys, "dict") if isinstance(batch, Mapping) else (len(batch), "tuple"))

    def close(self) -> None:
        """Stop the warm pool. It is safe to call this several times."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.close()
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        # pools do not travel: each process makes its own on first use
        return {**self.__dict__, "_pool": None, "_pid": None, "_here": self.options}

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        extra = "".join(f", {part}" for part in [self.options.policy.describe()] if part)
        return (
            f"prep.Collate({name}, executor={self.executor!r}, workers={self.workers}, "
            f"device={str(self.device) if self.device else None!r}, "
            f"pin_memory={self.pin_memory}{extra})"
        )


def _pinned(result: Any, extras: bool) -> Any:
    """The output (the first of ``(out, lengths, valid, errors)`` with ``extras``) pinned."""
    if extras:
        return (_pinned(result[0], extras=False), *result[1:])
    spec, leaves = flatten(result)
    return spec.unflatten([t.pin_memory() for t in leaves])
