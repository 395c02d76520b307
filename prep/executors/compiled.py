"""``torch.compile`` of ``torch.func.vmap`` of the row function: vmap's batched form with
its ops fused into loops of their own (inductor: C++ on CPU, cached on disk), compiled
once per function and kept by the executor.

    a function's first batch ─▶ vmap on a copy of its first row, eagerly (what vmap
                                refuses is refused here, for vmap's reasons)
                             ─▶ torch.compile(vmap(fn)), the batch dimension dynamic
    every batch of it        ─▶ the compiled form, whatever the batch's size

The compile costs seconds (8.6-11 s cold with inductor on a 2-core machine, 1.5-2.3 s
from inductor's disk cache: docs/benchmarks.md); ``executor="compiled"`` pays it on a
function's first batch, and ``auto`` counts it as a start that it rents or buys, and
holds the compiled rows to serial's (bit for bit, or within the row function's
``@prep.rowwise(atol=...)``: fusion may reorder floating-point operations).

The backend is inductor, or what ``PREP_COMPILE_BACKEND`` names (read once, at import):
prep's test suite runs on ``eager``, which traces every function as inductor would and
generates no code, so that a test does not pay a compile of seconds."""

from __future__ import annotations

import functools
import itertools
import os
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from .._kept import keep_newest
from ..core.identity import key
from ._base import Traits
from .vectorized import VmapExecutor, _name, vmap_of

#: the environment variable that names torch.compile's backend
ENV = "PREP_COMPILE_BACKEND"
#: torch.compile's backend (read where a function is compiled: a test may set it)
BACKEND: str | Callable[..., Any] = os.environ.get(ENV) or "inductor"
#: compiled forms an executor keeps, the oldest forgotten first (each holds its code)
FORMS = 16
_made = itertools.count()


class CompiledExecutor(VmapExecutor):
    """``torch.compile(torch.func.vmap(fn))``: vmap's form, compiled once per function.

    It runs the row functions vmap runs, and refuses the others with vmap's reasons.
    """

    name = "compiled"
    traits = Traits(per_row=False, in_caller=True, compiles=True)
    _maker = "torch.compile(torch.func.vmap)"

    def __init__(self, workers: int | None = 1) -> None:
        super().__init__(workers)
        self._forms: dict[Any, Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def _batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        return functools.partial(self._call, fn), f"torch.compile(torch.func.vmap({_name(fn)}))"

    def _call(self, fn: Callable[..., Any], *columns: Any, **named: Any) -> Any:
        made = key(fn)  # a fresh lambda or partial of the same code and values is the same
        with self._lock:
            form = self._forms.get(made)
        if form is not None:
            return form(*columns, **named)
        # vmap refuses what it cannot run on one row as on all: on a copy, eagerly, so
        # that its reasons (and a draw from the global generators) are vmap's own
        one = [c[:1].clone() if isinstance(c, torch.Tensor) else c for c in columns]
        vmap_of(fn, self.name)[0](*one, **{k: v[:1].clone() for k, v in named.items()})
        form = compiled(fn)
        # views: the mark is the view's, not the caller's tensor's
        views = [_dynamic(c[:]) for c in columns]
        out = form(*views, **{k: _dynamic(v[:]) for k, v in named.items()})
        with self._lock:
            keep_newest(self._forms, made, form, FORMS)
        return out

    def close(self) -> None:
        with self._lock:
            self._forms.clear()


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(torch.func.vmap(fn))`` as one call on a batch's columns (named
    columns passed positionally to vmap, as :func:`vmap_of` does); it compiles on its
    first call."""

    def call(*columns: Any, **named: Any) -> Any:
        names, k = list(named), len(columns)
        row = lambda *c: fn(*c[:k], **dict(zip(names, c[k:])))
        return torch.func.vmap(row)(*columns, *named.values())

    # a code object of its own, named apart: dynamo keeps what it compiled per code
    # object, at most 8 entries (torch._dynamo.config.recompile_limit) before it runs
    # the code eagerly, so a code object shared by every function would fall back from
    # the 9th on; and what it learnt of a code's inputs (which sizes change) it keeps by
    # file, line and name, so one name would carry a function's lesson to the next one
    # (a recompile: seconds)
    name = f"{call.__name__}:{_name(fn)}#{next(_made)}"
    code = call.__code__.replace(co_name=name)
    own = types.FunctionType(code, call.__globals__, name, None, call.__closure__)
    return torch.compile(own, backend=BACKEND)


def _dynamic(column: Any) -> Any:
    """``column`` with its batch dimension marked dynamic: one compile serves every
    batch size (a size of 1 is compiled for itself, as torch specializes it)."""
    if isinstance(column, torch.Tensor) and column.dim():
        torch._dynamo.maybe_mark_dynamic(column, 0)
    return column


__all__ = ["BACKEND", "ENV", "FORMS", "CompiledExecutor", "compiled"]
