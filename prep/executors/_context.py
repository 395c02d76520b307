"""What a worker process follows of its caller: the working directory and the
environment variables, as they are when a unit is sent to it.

A worker process is another interpreter, started once and kept: without this it
would keep the directory and environment it started with, and a batch sent after
the caller ran ``os.chdir(...)`` or ``os.environ["SCALE"] = "3"`` would compute
with the old ones while serial, in the caller, sees the new ones. So the parent
sends a worker the caller's :class:`Context` before a unit whenever it differs
from the one that worker last had. Telling whether it changed costs a copy and a
comparison of the raw environment, about a microsecond: nothing is sent when
nothing changed.

What cannot follow: objects a program changes at run time in a module's globals
(``config.SCALE = 3``). A worker imports that module afresh and sees what its
source says. ``auto`` compares the workers' first rows with serial's before it
uses them (:mod:`prep.core.trust`); a named executor warns on a difference.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["OWN", "Context", "Follower", "follow"]

#: variables each worker sets for itself (its share of the cores, in
#: ``_worker.limit_threads``): not the caller's to set or to take away
OWN = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    }
)


@dataclass(frozen=True, eq=False)
class Context:
    """The caller's working directory (None if it was removed) and environment."""

    cwd: str | None
    env: dict[str, str]


def _raw() -> Any:
    # os.environ keeps its bytes in _data: comparing that dict is far cheaper than
    # decoding every variable, so it is what tells whether anything changed
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else os.environ


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the caller's directory was removed: the workers keep theirs
        return None


class Follower:
    """The caller's :class:`Context`, the same object for as long as neither the
    directory nor the environment changes (a sender compares by identity)."""

    def __init__(self) -> None:
        self._raw: Any = None
        self._context: Context | None = None

    def now(self) -> Context:
        raw, cwd = _raw(), _cwd()
        ctx = self._context
        if ctx is None or raw != self._raw or cwd != ctx.cwd:  # copied only on a change
            env = {k: v for k, v in os.environ.items() if k not in OWN}
            self._raw, self._context = dict(raw), Context(cwd, env)
        assert self._context is not None
        return self._context


def follow(ctx: Context) -> None:
    """In a worker: take the caller's directory and environment (what differs only)."""
    if ctx.cwd is not None and _cwd() != ctx.cwd:
        with contextlib.suppress(OSError):  # removed since it was read: the worker stays
            os.chdir(ctx.cwd)
    env = os.environ
    for k in [k for k in env if k not in ctx.env and k not in OWN]:
        del env[k]
    for k, v in ctx.env.items():
        if env.get(k) != v:
            env[k] = v
