"""How ``processes`` starts its workers: prep's own forkserver, that never runs ``__main__``.

multiprocessing's spawn and forkserver start methods prepare each child by
re-importing the parent's main script (as ``__mp_main__``) so that functions
defined there can be unpickled by name. That is what runs an unguarded
script's top level again in every worker, what fails from stdin (the path
``<stdin>`` does not exist) and what cannot work from ``python -c`` or a
notebook (there is no file). prep never needs it: functions the workers cannot
import by name travel by value (cloudpickle, see ``_transport.pickle_fn``).

So prep keeps a forkserver of its own (not multiprocessing's shared one, whose
preload list belongs to the user) that preloads only torch and the worker
loop, and starts children with the parent's preparation data minus the main
module. Everything else (the user's ``sys.path``, the current folder, the
tensor reductions of ``torch.multiprocessing``) is as multiprocessing does it.

Start-up is measured, not assumed: :func:`start_costs` says what starting
the server (once per interpreter; it imports torch) and one worker took here,
and :func:`warm_up` starts the server in a background thread, so that ``auto``
can have it ready before it needs a pool.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, spawn, util
from typing import Any

import torch
import torch.multiprocessing as tmp

from ..errors import ConfigError, ExecutorUnavailable

START_METHODS = ("forkserver", "fork")
#: what prep's forkserver imports once, before it forks any worker (the last one makes
#: the server end without finalizing torch: see ``_server_end``)
PRELOAD = [
    "torch",
    "prep.executors._worker",
    "prep.executors._batch_worker",
    "prep.executors._server_end",
]


class _Server(forkserver.ForkServer):
    """A forkserver that preloads torch and the worker loop, and never ``__main__``."""

    def __init__(self) -> None:
        super().__init__()
        self._preload_modules = list(PRELOAD)

    @property
    def running(self) -> bool:
        return self._forkserver_pid is not None  # type: ignore[attr-defined]  # ForkServer's own


_server = _Server()


class _Popen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        # as popen_forkserver does, but through prep's server and without the main module
        data = spawn.get_preparation_data(process_obj._name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            # multiprocessing's private API, not in typeshed: what popen_forkserver calls
            mp_context.reduction.dump(data, buf)  # type: ignore[attr-defined]
            mp_context.reduction.dump(process_obj, buf)  # type: ignore[attr-defined]
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = _server.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        keep = os.dup(w)  # the child sees the parent die when this end closes
        self.finalizer = util.Finalize(self, util.close_fds, (keep, self.sentinel))  # type: ignore[attr-defined]
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


class _Context(mp_context.ForkServerContext):
    Process = _Process  # a subclass, started through _server


def start_method() -> str:
    method = os.environ.get("PREP_START_METHOD", "forkserver")
    if method not in START_METHODS:
        raise ConfigError(
            f"PREP_START_METHOD={method!r} is not one of {', '.join(map(repr, START_METHODS))}; "
            f"leave it unset for prep's forkserver (which is spawn-safe: workers never "
            f"inherit CUDA and never re-run your main script)"
        )
    return method


def context(fork: bool = False) -> Any:
    """The multiprocessing context workers start from (never fork after CUDA); ``fork``:
    forked from here (where :func:`fork_is_safe` says so), whatever the start method."""
    if fork or start_method() == "fork":
        if torch.cuda.is_initialized():
            raise ConfigError(
                "PREP_START_METHOD='fork' after CUDA was initialized would corrupt "
                "the workers' CUDA state; use 'forkserver' (the default)"
            )
        return tmp.get_context("fork")
    return _Context()


def fork_is_safe() -> bool:
    """Whether a worker may be forked from this process as it is now: on Linux, with no
    other thread running (a fork copies only the caller's thread; a lock another one
    held would stay held in the child for good), before CUDA, and unless
    ``PREP_START_METHOD`` asks for the forkserver. A forked worker starts in
    milliseconds and holds every module this process imported (the row function's
    too): the DataLoader's workers start this way."""
    return (
        sys.platform == "linux"
        and os.environ.get("PREP_START_METHOD", "") in ("", "fork")
        and threading.active_count() == 1
        and not torch.cuda.is_initialized()
    )


@dataclass
class StartCosts:
    """Seconds measured here: the server's start (it imports torch) and one worker's."""

    server: float | None = None
    worker: float | None = None
    failed: str | None = None  # why the server could not start, if it could not


_costs = StartCosts()
_warm_lock = threading.Lock()  # held while the server starts
_thread_lock = threading.Lock()  # held only to start the background thread
_warming: threading.Thread | None = None


def server_running() -> bool:
    return start_method() == "fork" or _server.running


def start_costs() -> StartCosts:
    return _costs


def _start_probe() -> float:
    """Start a worker that exits at once; seconds until it ran (the server's start too)."""
    from . import _worker

    t = time.perf_counter()
    p = context().Process(target=_worker.exit_now, daemon=True, name="prep-start-probe")
    p.start()
    p.join(60)
    return time.perf_counter() - t


def ensure_server() -> None:
    """Start the server now, in this thread, measuring what it took (a no-op when it
    runs). Raises :class:`ExecutorUnavailable` when it cannot start."""
    with _warm_lock:
        if server_running() and _costs.worker is not None:
            return
        try:
            first = _start_probe()
            worker = _start_probe()
        except (OSError, EOFError, RuntimeError) as exc:
            _costs.failed = f"{type(exc).__name__}: {exc}"
            raise ExecutorUnavailable(
                f"executor='processes' could not start its worker processes ({_costs.failed}); "
                f"use executor='threads' or 'joblib'"
            ) from exc
        if _costs.server is None:
            _costs.server = max(0.0, first - worker)
        _costs.worker = worker


def warm_up() -> bool:
    """Start the server in a background thread (once); :func:`start_costs` tells when
    it is done. The server runs in its own process, so this costs the caller no wait.
    True if this call started it."""
    global _warming
    with _thread_lock:  # not _warm_lock: a caller must never wait for the start itself
        if _warming is not None or (server_running() and _costs.worker is not None):
            return False
        _warming = threading.Thread(target=_warm, daemon=True, name="prep-forkserver-start")
        _warming.start()
        return True


def _warm() -> None:
    with contextlib.suppress(ExecutorUnavailable):  # recorded in _costs.failed; auto reads it
        ensure_server()


def _forget_in_child() -> None:
    # a forked child (a DataLoader worker) shares the parent's server socket but must not
    # think it owns the server; it starts its own if it ever needs one
    global _server, _costs, _warming, _warm_lock, _thread_lock
    _server = _Server()
    _costs, _warming = StartCosts(), None
    _warm_lock, _thread_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
