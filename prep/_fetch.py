"""How a :class:`prep.Loader`'s row function reaches the workers: :class:`Fetch`,
``fn(dataset[index])``, which worker processes get as a file they read once each (so a
batch sends its indices alone), and :class:`Keyed`, its form under ``seed=``."""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ._kept import keep_newest
from ._writers import writer_alive
from .core.checks import describe_callable
from .core.seeding import Seeding
from .errors import ConfigError
from .executors import pickle_fn

__all__ = ["Fetch", "Keyed", "forget_files"]


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
                _WRITTEN.add(self)
        return (_read, self._file)

    def forget(self) -> None:
        """Remove the workers' file (its Loader is gone; prep's caches may keep this
        object a while, and a later pickling writes it anew)."""
        with self._lock:
            written, self._file = self._file, None
        if written is not None:
            _remove(written[0], self._writer)


class Keyed(Fetch):
    """:class:`Fetch` whose rows are ``(index, seeds)`` (``seeds``: the epoch's): under
    ``seed=``, the sample's draws keyed by its index wherever they are made, in
    ``dataset[index]`` (a transform it calls) or in ``fn``: the global generators are
    seeded before the sample is fetched, and ``fn``'s ``rng``, where it takes one,
    apart from them (:meth:`~prep.core.seeding.Seeding.sample`). That is done through
    the stream's own ``seed=`` run of rows, which puts the generators back after each
    batch, and on threads, where nothing may seed them, watches them instead: a draw
    stops the epoch with a ConfigError."""

    def __call__(self, item: tuple[int, Seeding], **given: Any) -> Any:  # type: ignore[override]
        index, seeds = item
        drawn = seeds.sample(index)  # before the fetch: __getitem__ may draw too
        return self.row_fn(self.dataset[index], **given, **drawn)


#: the Fetches whose file is written, for :func:`forget_files`
_WRITTEN: weakref.WeakSet[Fetch] = weakref.WeakSet()


def forget_files() -> None:
    """Remove every file written for workers so far (``prep.shutdown()``: the workers
    that read them are gone; a Loader that runs again writes its file anew)."""
    for fetch in list(_WRITTEN):
        fetch.forget()


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
    _remove_stale()
    fd, path = tempfile.mkstemp(prefix=f"prep-loader-{os.getpid()}-", suffix=".pkl")
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    weakref.finalize(fetch, _remove, path, os.getpid())  # at exit, if not before
    return path, uuid.uuid4().hex


def _remove_stale() -> None:
    """Remove the files of writers that are gone (:func:`prep._writers.writer_alive`):
    a process ended before its exit handlers ran cannot remove its own."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "prep-loader-*-*.pkl")):
        pid = os.path.basename(path).split("-")[2]
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to remove
            if pid.isdigit() and not writer_alive(int(pid), os.path.getmtime(path)):
                os.remove(path)


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
