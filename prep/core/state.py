"""Per-worker state: ``setup=`` is called once where each worker runs, and the row
function receives what it returned as ``state=``.

A tokenizer, a model, a decoder or a database handle is too costly to build per
row and often unsafe to share (an HF tokenizer raises "Already borrowed" when
two threads use it at once). So the state belongs to the worker that uses it:
one per pool under ``serial``, one per thread under ``threads``, one per process
under ``processes`` and ``joblib``, built on the worker's first row and kept for
every batch after. It never crosses a process boundary: a worker process gets
``setup`` itself (pickled by name, or by value like a row function) and calls it
there. A state with a ``close()`` method is closed when its worker stops: the
pool's close for threads and serial, the worker process's exit for processes
and joblib (a worker killed by a crash cannot close anything).

:class:`WorkerState` is the store (one per pool; a worker process finds its own
through a registry, so the state outlives the batch that built it), and
:class:`WithState` the row function that passes ``state=``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from multiprocessing import util
from typing import Any

from .._kept import keep_newest
from ..errors import ConfigError, SetupError
from .checks import describe_callable, takes_keyword

#: this process's stores, by pool: a worker unpickles the same store every batch
_STORES: dict[str, WorkerState] = {}
_STORES_LOCK = threading.Lock()


class WorkerState:
    """The states ``setup()`` made in this process, one per thread that asked."""

    def __init__(self, setup: Callable[[], Any], key: str | None = None) -> None:
        if not callable(setup):
            raise TypeError(
                f"setup={setup!r} is not callable; pass a function of no arguments that "
                f"returns the state, e.g. setup=lambda: Tokenizer.from_file('tok.json')"
            )
        self.setup = setup
        self.key = key or uuid.uuid4().hex
        self._local = threading.local()
        self._made: list[Any] = []
        self._lock = threading.Lock()
        self.seconds: float | None = None  # what the last setup() here took

    def __reduce__(self) -> tuple[Any, ...]:  # to a worker process: the function, not states
        return (_store, (self.key, self.setup))

    def get(self) -> Any:
        """This thread's state, made by ``setup()`` on first use."""
        try:
            return self._local.state
        except AttributeError:
            pass
        t = time.perf_counter()
        try:
            state = self.setup()
        except Exception as exc:
            raise SetupError(
                f"setup={_name(self.setup)} raised {type(exc).__name__}: {exc}; fix it "
                f"and make a new pool (its traceback is the cause below)"
            ) from exc
        self.seconds = time.perf_counter() - t
        self._local.state = state
        with self._lock:
            self._made.append(state)
        return state

    def close(self) -> None:
        """``close()`` every state made here that has one; the next ``get`` makes anew."""
        with self._lock:
            made, self._made = self._made, []
        self._local = threading.local()
        for state in made:
            closer = getattr(state, "close", None)
            if callable(closer):
                closer()


def _store(key: str, setup: Callable[[], Any]) -> WorkerState:
    """The store of pool ``key`` in this process (made on the first batch)."""
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = WorkerState(setup, key)
            # a worker process closes its states as it exits (multiprocessing runs its
            # finalizers then, where atexit handlers do not run)
            util.Finalize(store, store.close, exitpriority=10)
        return store


class WithState:
    """``fn(*row, state=<this worker's state>)``: the row function a pool with
    ``setup=`` runs (picklable when ``fn`` and ``setup`` are)."""

    def __init__(self, fn: Callable[..., Any], store: WorkerState) -> None:
        if not takes_keyword(fn, "state"):
            raise ConfigError(
                f"setup={_name(store.setup)} gives the row function its state as the keyword "
                f"state=, but {describe_callable(fn)} has no state parameter; add one (e.g. "
                f"def fn(row, *, state): ...), or drop setup="
            )
        self.fn = fn
        self.store = store

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, state=self.store.get(), **kwargs)

    def __repr__(self) -> str:
        return f"{_name(self.fn)} with setup={_name(self.store.setup)}"


def setup_seconds(fn: Any) -> float:
    """What ``setup()`` took here for a row function with state (0 without; None
    measured yet counts 0 too: auto then learns it on the first batch)."""
    return (fn.store.seconds or 0.0) if isinstance(fn, WithState) else 0.0


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class Binder:
    """The :class:`WithState` of each row function for one store, kept so that a
    function keeps one wrapper (auto keys its choices on the function)."""

    LIMIT = 64  # a new lambda per batch must not pile up

    def __init__(self, setup: Callable[[], Any]) -> None:
        self.store = WorkerState(setup)
        self._bound: dict[Any, WithState] = {}
        self._lock = threading.Lock()

    def bind(self, fn: Callable[..., Any]) -> WithState:
        try:
            with self._lock:
                bound = self._bound.get(fn)
                if bound is None:
                    bound = WithState(fn, self.store)
                    keep_newest(self._bound, fn, bound, self.LIMIT)
                return bound
        except TypeError:  # an unhashable callable: a wrapper per call
            return WithState(fn, self.store)

    def close(self) -> None:
        self.store.close()
