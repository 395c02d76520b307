"""``prep.Pool``: warm executors reused across batches and streams; and the default
pools behind ``prep.map_rows``, which hold the only warm executors prep keeps
without a Pool of yours.

    prep.map_rows ──▶ SHARED.pool(executor, workers, setup) ──▶ Pool.run ──▶ _batch.run
    Pool.map_rows ──────────────────────────────────────────────▶ Pool.run ──▶ _batch.run
    Collate       ──▶ its own Pool ─────────────────────────────▶ Pool.run ──▶ _batch.run
"""

from __future__ import annotations

import atexit
import operator
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import _batch
from ._explanation import Explanation
from ._warm import Warm
from ._warn import warn
from .auto import AutoExecutor, Calibration
from .core.checks import check_fn
from .core.options import DEFAULT, CallOptions, Options
from .core.rows import Rows, rows_of, samples_of
from .core.state import Binder
from .errors import ConfigError
from .executors import Executor, in_worker_process, resolve_workers
from .registry import AUTO, EXECUTORS, IN_WORKERS, executor_class
from .stream.position import Position, resume
from .stream.stream import Stream, close_open
from .stream.streams import Streams
from .stream.submit import Work

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SHARED", "Pool", "Shared"]

_warned_fallback = False
#: the pools made with ``prep.Pool`` and not closed yet, which exit closes (``_at_exit``)
_OPEN: weakref.WeakSet[Pool] = weakref.WeakSet()


def runnable_here(kind: type[Executor], may_fork: bool) -> type[Executor]:
    """The executor to run here: one that starts processes cannot where no child process
    may start (``may_fork`` False: inside a DataLoader worker, whose daemonic process
    may not have children), so threads run instead."""
    global _warned_fallback
    if not kind.traits.needs_processes or may_fork:
        return kind
    if not _warned_fallback:
        _warned_fallback = True
        warn(
            f"executor={kind.name!r} cannot start a process pool inside a DataLoader "
            f"worker (daemonic processes may not have children); using "
            f"{IN_WORKERS!r} in this worker instead"
        )
    return EXECUTORS[IN_WORKERS]


class Pool:
    """Warm executors of one kind, reused across batches; close it when done.

    ``device``, ``timeout`` and ``progress`` are each call's defaults; a call's
    own options (``map_rows``'s keywords) go beside them.

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
        binder = Binder(setup) if setup is not None else None
        warm = Warm(resolve_workers(workers))
        defaults = Options(device=device, timeout=timeout, progress=progress)
        self._init(executor, warm, binder, defaults, True)

    def _init(
        self, executor: str, warm: Warm, binder: Binder | None, defaults: Options, owns: bool
    ) -> None:
        self.executor = executor
        self._kind = executor_class(executor)  # resolved once (a ConfigError naming the choices)
        self.workers = warm.workers
        self._warm, self._binder, self._owns = warm, binder, owns
        self._defaults = defaults  # each call's, beside its own options
        self.device, self.timeout = defaults.device, defaults.timeout
        self.progress = defaults.progress
        self._streams = Streams(self.workers)  # auto's stream plans
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy must not close the parent's workers
        if owns:
            _OPEN.add(self)

    def _get(self, name: str) -> Executor:
        if self._closed:
            raise ConfigError(f"{self!r} is closed; create a new prep.Pool")
        return self._warm.get(name)

    def map_rows(self, fn: Callable[..., Any], batch: Any, **options: Unpack[CallOptions]) -> Any:
        """:func:`prep.map_rows` with this pool's executor, workers and states; the same
        options (``out``, ``pad``, ``on_error``, ...), ``device``, ``timeout`` and
        ``progress`` defaulting to the pool's."""
        rows, given = rows_of(batch), Options.of("Pool.map_rows", options, self._defaults)
        check_fn(fn, batch, "map_rows", "batch")
        return self.run(fn, rows, given)

    def map_samples(
        self, fn: Callable[[Any], Any], samples: Sequence[Any], **options: Unpack[CallOptions]
    ) -> Any:
        """:func:`prep.map_samples` with this pool's executor, workers and states."""
        rows, given = samples_of(samples), Options.of("Pool.map_samples", options, self._defaults)
        check_fn(fn, samples, "map_samples", "samples")
        return self.run(fn, rows, given)

    def run(self, fn: Callable[..., Any], rows: Rows, options: Options = DEFAULT) -> Any:
        """The typed form of :meth:`map_rows`: ``fn`` already checked to be callable
        (``prep.core.checks.check_fn``), ``rows`` already split
        (``prep.core.rows.rows_of``/``samples_of``), ``options`` already checked
        (``prep.core.options.Options``, used as given: the pool's defaults are not applied)."""
        ex = self._get(runnable_here(self._kind, not in_worker_process()).name)
        if self._binder is not None:
            fn = self._binder.bind(fn)
        return _batch.run(ex, fn, rows, options)

    def imap(
        self,
        fn: Callable[..., Any],
        batches: Iterable[Any],
        *,
        prefetch: int | None = None,
        strategy: str = "auto",
        state: dict[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> Stream:
        """:meth:`map_rows` over an iterable of batches (a DataLoader, say), the results in
        order, up to ``prefetch`` batches in the making while you work on the current one
        (at most ``prefetch + 1`` results alive; None: two per worker where whole batches
        may run, else two). ``strategy``: ``"split"`` runs each batch across all workers
        (a part each, several batches in flight, on a ``processes`` or ``threads`` pool;
        one batch at a time through ``auto`` or ``joblib``); ``"whole"`` gives each
        worker whole batches, several in
        flight, as a DataLoader does (no barrier between batches; a batch takes one
        worker's time); ``"auto"`` measures both on the stream and keeps the faster
        (:meth:`explain` says which, and why). Takes :meth:`map_rows`'s keywords but
        ``out=``; ``progress=True`` is a bar of batches (with rows/s and the share of the
        stream's time your loop waited). An error (from a
        row, the pool or ``batches``) is raised when your loop reaches that batch, and no
        batch after it is delivered; ``break``, ``close()``, leaving a ``with`` block or
        Ctrl-C stop the stream (a batch running in the pool finishes; batches in flight
        on the stream's workers are dropped). ``prefetch=0`` runs each batch in your
        loop's thread, without overlap. Warnings of its batches point at the line that
        called ``imap``. ``stream.state_dict()`` is where your loop is (the batches it
        took, and for a source with its own ``state_dict()``, that state as of the last
        of them); ``state=`` resumes from it, loading it into ``batches`` first.

        >>> import torch, prep
        >>> with prep.Pool("threads", workers=2) as pool:
        ...     [out.sum().item() for out in pool.imap(torch.neg, [torch.ones(2, 2)] * 3)]
        [-4.0, -4.0, -4.0]
        """
        given = Options.of("Pool.imap", options, self._defaults)
        return self._stream(fn, batches, prefetch, strategy, given, state, samples=False)

    def imap_samples(
        self,
        fn: Callable[[Any], Any],
        batches: Iterable[Sequence[Any]],
        *,
        prefetch: int | None = None,
        strategy: str = "auto",
        state: dict[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> Stream:
        """:meth:`imap` for batches that are lists of samples: :meth:`map_samples` on each."""
        given = Options.of("Pool.imap_samples", options, self._defaults)
        return self._stream(fn, batches, prefetch, strategy, given, state, samples=True)

    def _stream(
        self,
        fn: Callable[..., Any],
        batches: Iterable[Any],
        prefetch: Any,
        strategy: Any,
        options: Options,
        state: Any,
        samples: bool,
    ) -> Stream:
        start = resume(batches, state) if state is not None else 0  # loaded before iter()
        try:
            source, batches = batches, iter(batches)
        except TypeError:
            raise TypeError(
                f"batches must be an iterable of batches (a list, a generator, a DataLoader), "
                f"got {type(batches).__name__} {batches!r:.40}"
            ) from None
        if self._closed:
            raise ConfigError(f"{self!r} is closed; create a new prep.Pool")
        bound = self._binder.bind(fn) if self._binder is not None else fn
        may_fork = not in_worker_process()  # once a stream
        kind = runnable_here(self._kind, may_fork)
        work = Work(fn, bound, options, samples, self._get, kind.name)
        position = Position(source, batches, start)
        total = operator.length_hint(source, 0) - start  # for the bar: a list's, a Loader's
        return self._streams.open(
            kind, may_fork, batches, prefetch, strategy, work, position, max(total, 0) or None
        )

    def explain(self) -> Explanation:
        """What ``auto`` measured and chose for each signature this pool has seen, and
        the strategy of its latest streams (``imap``): text to print, with the
        calibrations behind it (see :class:`prep.Explanation`)."""
        return Explanation(self.choices(), self._streams.describe())

    def choices(self) -> list[Calibration]:
        """``auto``'s latest :class:`~prep.auto.Calibration` for each signature this pool
        has seen (its ``.choice`` is the executor it runs); empty for other executors."""
        autos = [ex for ex in self._warm.made() if isinstance(ex, AutoExecutor)]
        return [cal for auto in autos for cal in auto.choices().values()]

    def close(self) -> None:
        """Stop the pool's threads or processes. It is safe to call this several times.
        In a forked child (a DataLoader worker holding a copy of this pool) it only
        forgets them: the workers are the parent's."""
        self._closed = True
        _OPEN.discard(self)
        if os.getpid() != self._pid:
            return
        if self._owns:
            self._warm.close()
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


class Shared:
    """The pools ``prep.map_rows`` uses: one per executor, workers and ``setup``, made on
    first use and kept warm between calls. Those of one worker count share their
    executors (auto runs the very process pool ``executor="processes"`` does), those
    of one ``setup`` their worker states. :meth:`close` closes them all
    (``prep.shutdown()``, and at exit); a forked child forgets the parent's, whose
    threads and processes it does not have, and makes its own."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._pools: dict[tuple[str, int, Any], Pool] = {}
        self._warm: dict[int, Warm] = {}
        self._binders: dict[Any, Binder] = {}
        self._lock = threading.Lock()

    def pool(
        self,
        executor: str = AUTO,
        workers: int | None = None,
        setup: Callable[[], Any] | None = None,
    ) -> Pool:
        """The shared pool of these settings."""
        executor_class(executor)  # a ConfigError naming the choices (and hashable)
        key = (executor, resolve_workers(workers), setup)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None or pool._closed:
                # a pool of executors and states that this object owns and closes
                pool = self._pools[key] = Pool.__new__(Pool)
                pool._init(executor, self._warm_of(key[1]), self._binder_of(setup), DEFAULT, False)
            return pool

    def _warm_of(self, workers: int) -> Warm:
        warm = self._warm.get(workers)
        if warm is None or warm.closed:
            warm = self._warm[workers] = Warm(workers)
        return warm

    def _binder_of(self, setup: Callable[[], Any] | None) -> Binder | None:
        if setup is None:
            return None
        binder = self._binders.get(setup)
        if binder is None:
            binder = self._binders[setup] = Binder(setup)
        return binder

    def executors(self, workers: int) -> Callable[[str], Executor]:
        """The shared executor of each name, of ``workers`` workers."""
        with self._lock:
            return self._warm_of(workers).get

    def close(self) -> None:
        """Close every shared pool's executors, and the states their ``setup=`` made."""
        with self._lock:
            warm, binders = list(self._warm.values()), list(self._binders.values())
            self._pools.clear()
            self._warm.clear()
            self._binders.clear()
        for w in warm:
            w.close()
        for binder in binders:
            binder.close()


#: the pools of ``prep.map_rows``; nothing starts before the first call needs it
SHARED = Shared()


def _at_exit() -> None:
    """Before the interpreter finalizes, no thread of prep's left inside torch: every
    open stream closed, its thread joined (:func:`~prep.stream.stream.close_open` says
    why), then every pool (a ``prep.Pool`` left open, the shared ones), whose threads
    finish the batches those streams had in flight, and are joined."""
    close_open()
    for pool in list(_OPEN):
        pool.close()
    SHARED.close()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=SHARED._forget)
