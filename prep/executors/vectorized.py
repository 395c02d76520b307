"""One call of the row function's batched twin (see :func:`prep.rowwise`), or of
``torch.func.vmap`` of it; and how ``auto`` tries either on a sample: each is kept
only if it reproduces serial's rows (bit for bit, or within the twin's declared
``atol``).

Whether vmap runs an op through torch's slow fallback (a loop over the rows for an
op without a batching rule) is left to the timing, on purpose: torch's switch that
makes the fallback raise (``torch._C._functorch._set_vmap_fallback_enabled``) is one
global flag of the process, not of a thread, so flipping it for a check would make a
``torch.func.vmap`` the user runs in another thread meanwhile raise. The fallback
gives the same rows, only slower, and auto measures every candidate it keeps."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ..core.generators import States
from ..core.output import Output, flatten
from ..core.policy import Policy
from ..core.rows import TensorRows
from ..core.rowwise import BoundTwin, twin_of
from ..core.trust import first_time, forget
from ..errors import ConfigError, PrepError, VmapUnsupported
from ._base import Executor, Traits
from ._job import Job


class VectorizedExecutor(Executor):
    """Calls ``batched(*columns, **kwargs)`` once; the loop runs inside torch."""

    name = "vectorized"
    traits = Traits(per_row=False, in_caller=True, calls_twin=True)
    #: whether its batched call can pad ragged rows (a twin that takes pad=)
    _pads: ClassVar[bool] = True

    def __init__(self, workers: int | None = 1) -> None:
        super().__init__(workers)

    def _batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        """The function to call once on all rows, and its name for messages."""
        twin = twin_of(fn)
        if twin is None:
            raise ConfigError(
                f"executor='vectorized' needs a batched twin, and {_name(fn)} has none; "
                f"mark it with @prep.rowwise(batched=...) or pick another executor"
            )
        return twin, f"the batched twin {_name(twin.twin.batched)}"

    def run(self, job: Job) -> Output | None:
        if not isinstance(job.rows, TensorRows):
            raise ConfigError(
                f"executor={self.name!r} works on a batch of tensors, not on a list "
                f"of samples; use map_rows, or another executor"
            )
        twin, what = self._batched(job.fn)
        names = job.rows.names
        if isinstance(twin, BoundTwin) and names and (unknown := twin.unknown(names)):
            raise ConfigError(
                f"{what} has no parameter for the batch's column(s) "
                f"{', '.join(map(repr, unknown))}: a dict batch's columns go to it by name, "
                f"as to the row function; name its parameters so, or map them with "
                f"@prep.rowwise(batched=..., rename={{{unknown[0]!r}: 'its_parameter'}})"
            )
        twin = self._with_policy(twin, what, job.policy)
        rows = job.rows
        if job.start:  # the first rows are already in the output: run the rest only
            rows = rows.replace([c[job.start :] for c in rows.columns])
        # one call, so its exception (and traceback) reaches the caller as it is
        result = rows.call_batched(twin)
        job.sink.advance(len(rows))
        spec, leaves = flatten(result, what=what)
        # preprocessing: no autograd history, as the per-row executors write theirs
        leaves = [t.detach() if t.requires_grad else t for t in leaves]
        n = len(rows)
        for leaf in leaves:
            if leaf.dim() == 0 or leaf.shape[0] != n:
                raise ConfigError(
                    f"{what} returned shape "
                    f"{tuple(leaf.shape)} for a batch of {n} rows; it must keep "
                    f"the rows along dim 0"
                )
        if job.sink.output is None or (job.policy.padding is not None and job.start == 0):
            return Output(spec, leaves)  # (with pad=: the twin padded the batch itself)
        # the output exists (out= or earlier rows): check one row's shape like the other
        # executors do, then copy the rest in one go
        out = job.sink.output
        if n:
            out.write(job.start, spec.unflatten([leaf[0] for leaf in leaves]))
        for buf, leaf in zip(out.buffers, leaves):
            buf[job.start :].copy_(leaf)
        return out

    def _with_policy(
        self, twin: Callable[..., Any], what: str, policy: Policy
    ) -> Callable[..., Any]:
        """The twin, given ``pad``/``pad_to`` when it takes them; one call for the whole
        batch cannot keep one row's error to that row."""
        if policy.per_row_errors:
            raise ConfigError(
                f"executor={self.name!r} makes the whole batch in one call, so a failing row "
                f"fails it: on_error={policy.on_error!r} needs a per-row executor (serial, "
                f"threads, processes, joblib or auto)"
            )
        padding = policy.padding
        if padding is None:
            return twin
        if not self._pads:
            raise ConfigError(
                f"executor={self.name!r} cannot return ragged rows (every row of a vmap has "
                f"one shape); use a per-row executor with pad=, or a twin that pads"
            )
        wants = {"pad": padding.pad} | ({"pad_to": padding.to} if padding.to is not None else {})
        batched = getattr(getattr(twin, "twin", None), "batched", twin)  # a rowwise twin's own
        params = inspect.signature(batched).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not takes_any and not set(wants) <= set(params):
            raise ConfigError(
                f"{what} takes no {' or '.join(sorted(set(wants) - set(params)))} argument, so "
                f"executor={self.name!r} cannot pad; give the twin pad= (and pad_to=) "
                f"parameters, or use a per-row executor"
            )
        return functools.partial(twin, **wants)


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class VmapExecutor(VectorizedExecutor):
    """``torch.func.vmap`` of the row function: vectorized without writing a twin.

    It only works for row functions without data-dependent control flow
    (no ``.item()``, ``nonzero``, Python branches on values); ``auto`` tries it
    on a sample and compares with ``serial`` before it ever picks it.
    """

    name = "vmap"
    traits = Traits(per_row=False, in_caller=True)
    _pads = False  # every row of a vmap has one shape

    #: what makes the batched form, as its errors name it
    _maker = "torch.func.vmap"

    def _batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        return vmap_of(fn)

    def run(self, job: Job) -> Output | None:
        try:
            return super().run(job)
        except PrepError:
            raise
        except Exception as exc:
            error = _vmap_error(job, exc, self.name, self._maker)
            if error is exc:
                raise
            raise error from exc


def vmap_of(fn: Callable[..., Any], executor: str = "vmap") -> tuple[Callable[..., Any], str]:
    """``torch.func.vmap`` of the row function, as one call on a batch's columns, and its
    name for messages (``executor`` names who refuses a function that draws)."""

    def call(*columns: Any, **named: Any) -> Any:
        # vmap maps positional inputs only: pass named columns positionally, rename inside
        names, k = list(named), len(columns)
        row = lambda *c: fn(*c[:k], **dict(zip(names, c[k:])))
        if not first_time(_DRAWS, fn):
            return torch.func.vmap(row)(*columns, *named.values())
        before = States.now()
        out = torch.func.vmap(row)(*columns, *named.values())
        if (drew := before.moved_besides_torch()) is not None:
            forget(_DRAWS, fn)  # every call of it is refused alike
            raise VmapUnsupported(
                f"executor={executor!r} cannot run {_name(fn)}: it draws from {drew}, and vmap "
                f"calls it once for every row, so every row would get the same numbers. Use a "
                f"per-row executor ('serial', 'processes', or 'auto', which leaves vmap out), "
                f"or draw with torch (vmap refuses that too: per-row executors run it)"
            )
        return out

    return call, f"torch.func.vmap({_name(fn)})"


class _Draws:
    """What :func:`vmap_of` checks once per function: whether one call of it moved
    Python's or numpy's global generator (a draw vmap would make once for all rows)."""


_DRAWS = _Draws()


def _vmap_error(
    job: Job, exc: Exception, executor: str = "vmap", maker: str = "torch.func.vmap"
) -> Exception:
    """What vmap's failure means: the row function's own error where it fails on a
    plain row too (raised as it is), else a :class:`VmapUnsupported` that says why and
    what runs it. It runs the first row once more, on a copy, and only once vmap has
    failed (auto, which promises one call a row, never gets here: it calls the
    batched form itself)."""
    if len(job.rows) <= job.start:
        return exc
    try:
        result = job.rows.take(job.start, job.start + 1).call(job.fn, job.start)
    except Exception:
        return exc  # the function fails on its own: its error, not vmap's
    try:  # a result no executor could store (None, an empty tuple): the one error all give
        flatten(result, row=job.start)
    except TypeError as own:
        return own
    text = str(exc).strip()
    reason = text.splitlines()[0].rstrip(".") if text else type(exc).__name__
    return VmapUnsupported(
        f"executor={executor!r} cannot run {_name(job.fn)}: {maker} raised "
        f"{type(exc).__name__}: {reason}. The function runs on a single row, but vmap runs "
        f"all rows as one traced batch, so it cannot read values (.item(), int(row[0]), a "
        f"Python if on data) nor make shapes that depend on them. Use executor='auto' "
        f"(it tries vmap and falls back), a per-row executor ('serial', 'threads', "
        f"'processes'), or give the function a batched twin with @prep.rowwise"
    )
