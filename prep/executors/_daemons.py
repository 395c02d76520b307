"""Daemon threads that run torch on their own share of intra-op threads.

``torch.set_num_threads`` sets the calling thread's OpenMP threads (per thread)
and also a process-wide default that threads which have not run a parallel op
yet pick up on their first. So a thread takes its share in itself and puts the
default back from a short-lived thread, whose own setting dies with it: the
caller's setting is never touched (see :mod:`.threads` for why that matters).
A pool's threads (``_batch_threads``) take their share so; :func:`on_intra_op_threads`
runs one function as such a thread would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_DEFAULT_LOCK = threading.Lock()


def own_intra_op_threads(intra: int) -> None:
    """Give this thread ``intra`` intra-op threads without changing anyone else's."""
    # one thread at a time: a pool's threads start together, and one that read the
    # default while another had lowered it would restore the lowered value for good
    with _DEFAULT_LOCK:
        default = torch.get_num_threads()  # this new thread's: the process-wide default
        if intra >= default:
            return
        torch.set_num_threads(intra)
        restore = threading.Thread(target=torch.set_num_threads, args=(default,), daemon=True)
        restore.start()
        restore.join()


def on_intra_op_threads(fn: Callable[[], T], intra: int) -> T:
    """``fn()`` run in a short-lived thread of its own with torch on ``intra``
    intra-op threads; its result, or its exception raised here. The caller's
    setting and torch's default for new threads are left as they were."""
    box: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        own_intra_op_threads(intra)
        try:
            box.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    # a daemon joined here, not a ThreadPoolExecutor's thread: Ctrl-C in the join
    # returns at once, and a function that hangs never blocks the interpreter's exit
    t = threading.Thread(target=target, daemon=True, name="prep-intra-op")
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return box[0]


__all__ = ["on_intra_op_threads", "own_intra_op_threads"]
