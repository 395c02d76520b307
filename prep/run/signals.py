"""Ctrl-C and SIGTERM for ``prep run``: both become exceptions in the main thread."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import Terminated

__all__ = ["shielded", "sigterm_raises"]


@contextlib.contextmanager
def _handled(handler: Any, *signums: signal.Signals) -> Iterator[None]:
    """``handler`` for ``signums`` within the block (main thread only: elsewhere, as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def sigterm_raises() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGTERM raises :class:`~prep.errors.Terminated` (main thread only)."""
    return _handled(_raise_terminated, signal.SIGTERM)


def shielded() -> contextlib.AbstractContextManager[None]:
    """Ignore a second Ctrl-C or SIGTERM while the first one's cleanup runs."""
    return _handled(signal.SIG_IGN, signal.SIGINT, signal.SIGTERM)
