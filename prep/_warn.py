"""Warnings that point at the user's line, whatever path inside prep led to them.

A hard-coded ``stacklevel`` counts prep's own frames, and the count differs by path
(``map_rows``, ``Pool.map_rows``, ``Collate``, a stream's batch): one path's right
number is another's wrong line. So the level is worked out where the warning is
given: the first frame, walking out, whose code is not prep's. A stream's batches
run in its own thread, where no frame is the user's: :func:`pointing_at` tells that
thread the site of the ``imap`` call that made the stream, and warnings point there.
(Python 3.12's ``skip_file_prefixes`` does the walk; prep runs on 3.10 and 3.11 too.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

_PREP = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_PREP)


def _outside(frame: FrameType | None) -> tuple[FrameType | None, int]:
    """The first frame from ``frame`` outward that is not prep's, and how many frames
    out it is (1: ``frame`` itself)."""
    level = 1
    while frame is not None and _ours(frame):
        frame, level = frame.f_back, level + 1
    return frame, level


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller of this function
    point at the first frame outside prep."""
    _, level = _outside(sys._getframe(1))
    return level


@dataclass(frozen=True)
class Site:
    """A line of the user's code, to point warnings at from another thread."""

    filename: str
    lineno: int
    module_globals: dict[str, Any]

    @classmethod
    def here(cls) -> Site | None:
        """The user's line that led to this call (None if there is no such frame)."""
        frame, _ = _outside(sys._getframe(1))
        if frame is None:
            return None
        return cls(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


_local = threading.local()


@contextlib.contextmanager
def pointing_at(site: Site | None) -> Iterator[None]:
    """Warnings given in this thread meanwhile point at ``site``."""
    before = getattr(_local, "site", None)
    _local.site = site
    try:
        yield
    finally:
        _local.site = before


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn``, pointing at the user's line: the site this thread was told
    (a stream's ``imap`` call), else the first frame outside prep."""
    site: Site | None = getattr(_local, "site", None)
    if site is None:
        _, level = _outside(sys._getframe(1))
        warnings.warn(message, category, stacklevel=level + 1)
        return
    module_globals = site.module_globals
    warnings.warn_explicit(
        message,
        category,
        site.filename,
        site.lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
        # code read from stdin or -c has no source to show: its __main__'s loader (the
        # builtin importer) raises ImportError when asked for it
        module_globals=None if site.filename.startswith("<") else module_globals,
    )


__all__ = ["Site", "pointing_at", "user_stacklevel", "warn"]
