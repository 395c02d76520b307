"""``prep.Pool``: a warm executor of one kind, reused across batches and streams."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._checks import check_device, check_timeout
from ._rows import Rows, rows_of, samples_of
from ._state import Binder
from ._stream import Stream
from ._streams import Streams
from .api import AUTO, _call, _check_name, _choose
from .auto import AutoExecutor, Calibration
from .errors import ConfigError
from .executors import Executor, resolve_workers
from .registry import EXECUTORS as REGISTRY

__all__ = ["Pool"]


class Pool:
    """A warm executor of one kind, reused across batches; close it when done.

    >>> import torch, prep
    >>> with prep.Pool("threads", workers=2) as pool:
    ...     pool.map_rows(torch.neg, torch.ones(2, 2)).tolist()
    [[-1.0, -1.0], [-1.0, -1.0]]
    """

    def __init__(
        self,
        executor: str = AUTO,
        workers: int | None = None,
        device: Any = None,
        timeout: float | None = None,
        setup: Callable[[], Any] | None = None,
        progress: bool = False,
    ) -> None:
        self.executor = _check_name(executor)
        self.progress = progress  # each call's default
        self._binder = Binder(setup) if setup is not None else None
        self.workers = resolve_workers(workers)
        self.device = check_device(device)
        self.timeout = check_timeout(timeout)
        self._executors: dict[str, Executor] = {}
        self._streams = Streams(self.workers)  # whole-batch workers, auto's stream plans
        self._closed = False
        self._lock = threading.Lock()  # two threads' first calls build one executor
        self._pid = os.getpid()  # a forked child's copy must not close the parent's workers

    def _get(self, name: str) -> Executor:
        with self._lock:
            if self._closed:
                raise ConfigError(f"{self!r} is closed; create a new prep.Pool")
            ex = self._executors.get(name)
            if ex is None:
                ex = self._executors[name] = REGISTRY[name](self.workers)
            return ex

    def map_rows(self, fn: Callable[..., Any], batch: Any, **options: Any) -> Any:
        """:func:`map_rows` with this pool's executor, workers, device and timeout; the
        same keywords (``out``, ``pad``, ``pad_to``, ``return_lengths``, ``on_error``,
        ``fill``, ``return_valid``)."""
        return self._call(fn, rows_of(batch), options)

    def map_samples(self, fn: Callable[[Any], Any], samples: Sequence[Any], **options: Any) -> Any:
        """:func:`map_samples` with this pool's executor, workers, device and timeout."""
        return self._call(fn, samples_of(samples), options)

    def _call(self, fn: Callable[..., Any], rows: Rows, options: dict[str, Any]) -> Any:
        ex = self._get(_choose(self.executor))
        if self._binder is not None:
            fn = self._binder.bind(fn)
        options.setdefault("progress", self.progress)
        return _call(ex, fn, rows, device=self.device, timeout=self.timeout, **options)

    def imap(
        self,
        fn: Callable[..., Any],
        batches: Iterable[Any],
        *,
        prefetch: int | None = None,
        strategy: str = "auto",
        **options: Any,
    ) -> Stream:
        """:meth:`map_rows` over an iterable of batches (a DataLoader, say), the results in
        order, up to ``prefetch`` batches in the making while you work on the current one
        (at most ``prefetch + 1`` results alive; None: two per worker where whole batches
        may run, else two). ``strategy``: ``"split"`` runs each batch across all workers,
        one batch at a time; ``"whole"`` gives each worker whole batches, several in
        flight, as a DataLoader does (no barrier between batches; a batch takes one
        worker's time); ``"auto"`` measures both on the stream and keeps the faster
        (:meth:`explain` says which, and why). Takes :meth:`map_rows`'s keywords but
        ``out=``; ``progress=True`` is a bar of batches (with rows/s). An error (from a
        row, the pool or ``batches``) is raised when your loop reaches that batch, and no
        batch after it is delivered; ``break``, ``close()``, leaving a ``with`` block or
        Ctrl-C stop the stream (a batch running split finishes; whole batches in flight
        are dropped). ``prefetch=0`` runs each batch in your loop's thread, without
        overlap.

        >>> import torch, prep
        >>> with prep.Pool("threads", workers=2) as pool:
        ...     [out.sum().item() for out in pool.imap(torch.neg, [torch.ones(2, 2)] * 3)]
        [-4.0, -4.0, -4.0]
        """
        return self._stream(self.map_rows, fn, batches, prefetch, strategy, options)

    def imap_samples(
        self,
        fn: Callable[[Any], Any],
        batches: Iterable[Sequence[Any]],
        *,
        prefetch: int | None = None,
        strategy: str = "auto",
        **options: Any,
    ) -> Stream:
        """:meth:`imap` for batches that are lists of samples: :meth:`map_samples` on each."""
        return self._stream(self.map_samples, fn, batches, prefetch, strategy, options)

    def _stream(
        self,
        method: Callable[..., Any],
        fn: Callable[..., Any],
        batches: Iterable[Any],
        prefetch: Any,
        strategy: Any,
        options: dict[str, Any],
    ) -> Stream:
        try:
            batches = iter(batches)
        except TypeError:
            raise TypeError(
                f"batches must be an iterable of batches (a list, a generator, a DataLoader), "
                f"got {type(batches).__name__} {batches!r:.40}"
            ) from None
        if self._closed:
            raise ConfigError(f"{self!r} is closed; create a new prep.Pool")
        name = _choose(self.executor)
        progress = options.pop("progress", self.progress)
        bound = self._binder.bind(fn) if self._binder is not None else fn

        def finish(ex: Executor, rows: Rows) -> Any:
            return _call(
                ex, bound, rows, device=self.device, timeout=self.timeout, progress=False,
                **options,
            )  # fmt: skip

        return self._streams.open(
            name, batches, prefetch, strategy,
            lambda batch: method(fn, batch, progress=False, **options), finish, bound, options,
            samples=method == self.map_samples, progress=progress,
            isolate=lambda: self._get("processes"), timeout=self.timeout,
        )  # fmt: skip

    def explain(self) -> str:
        """What ``auto`` measured and chose for each signature this pool has seen, and
        the strategy of its latest streams (``imap``)."""
        auto = self._executors.get(AUTO)
        text = auto.explain() if isinstance(auto, AutoExecutor) else "nothing yet"
        plans = self._streams.describe()
        if plans:
            text = "\n".join([text if text != "nothing yet" else "", *plans]).strip()
        return text

    def choices(self) -> list[Calibration]:
        """``auto``'s latest :class:`~prep.auto.Calibration` for each signature this pool
        has seen (its ``.choice`` is the executor it runs); empty for other executors."""
        auto = self._executors.get(AUTO)
        return list(auto.choices().values()) if isinstance(auto, AutoExecutor) else []

    def close(self) -> None:
        """Stop the pool's threads or processes. It is safe to call this several times.
        In a forked child (a DataLoader worker holding a copy of this pool) it only
        forgets them: the workers are the parent's."""
        with self._lock:
            self._closed = True
            executors, self._executors = self._executors, {}
        if os.getpid() != self._pid:
            return
        for ex in executors.values():
            ex.close()
        self._streams.close()
        if self._binder is not None:
            self._binder.close()  # the states of this process's workers (serial, threads)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<prep.Pool executor={self.executor!r} workers={self.workers} "
            f"device={str(self.device) if self.device else None!r} "
            f"timeout={self.timeout} {state}>"
        )
