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

from ..core.output import Output, flatten
from ..core.policy import Policy
from ..core.rows import TensorRows
from ..core.rowwise import BoundTwin, twin_of
from ..core.trust import same
from ..errors import ConfigError, PrepError, VmapUnsupported
from ._base import Executor, Measured, Sampling
from ._job import Job

#: seconds of serial work for a whole batch below which auto does not try vmap: a
#: first vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


class VectorizedExecutor(Executor):
    """Calls ``batched(*columns, **kwargs)`` once; the loop runs inside torch."""

    name = "vectorized"
    per_row = False
    in_caller = True
    #: whether its batched call can pad ragged rows (a twin that takes pad=)
    pads: ClassVar[bool] = True

    def __init__(self, workers: int | None = 1) -> None:
        super().__init__(workers)

    def batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        """The function to call once on all rows, and its name for messages."""
        twin = twin_of(fn)
        if twin is None:
            raise ConfigError(
                f"executor='vectorized' needs a batched twin, and {_name(fn)} has none; "
                f"mark it with @prep.rowwise(batched=...) or pick another executor"
            )
        return twin, f"the batched twin {_name(twin.twin.batched)}"

    def batched_twin(self, fn: Callable[..., Any]) -> Any:
        return twin_of(fn)

    @classmethod
    def ruled_out(cls, job: Job, processes_allowed: bool) -> str | None:
        # before vmap in the registry: auto tries the first batched form not ruled out,
        # and a twin the user wrote comes first
        return None if job.rows.batched and twin_of(job.fn) is not None else "no batched twin here"

    @classmethod
    def first_batch(cls, sample: Sampling) -> bool:
        """The twin makes the whole output (no copy); the row function runs on copies of
        a few rows into a scratch output, to time serial and to check the twin
        against; so the row function still runs at most once a row of the batch."""
        s, job, cal = sample, sample.job, sample.cal
        # copies: a row function that changes its row in place must not change the
        # rows the twin then reads
        timed = s.scratch(min(s.n, 4))
        s.serial(budget_rows=4, cursor=timed)
        t = s.now()
        try:
            out = s.executor(cls.name).run(job.strict())
        except Exception as exc:
            if not job.policy.per_row_errors:
                raise  # the twin's own error, as executor="vectorized" would raise it
            cal.dropped[cls.name] = f"it failed on this batch ({why(exc)})"
            return False  # rows run one by one, so a failing row fails alone
        took = s.now() - t
        twin = twin_of(job.fn)
        atol = twin.twin.atol if twin else 0.0
        row = first_difference(out, timed.job.sink.output, timed.done, atol)
        if row is not None:  # serial is the reference: the rows run one by one instead
            cal.dropped[cls.name] = (
                f"its row {row} differs from the row function's"
                + (f" by more than atol={atol}" if atol else "")
                + " (serial is the reference; fix the twin, or declare a tolerance with "
                "@prep.rowwise(batched=..., atol=...))"
            )
            return False
        job.sink.output = out
        cal.batched_rows[cls.name] = took / s.n
        s.main.done = s.n
        return True

    @classmethod
    def estimate(cls, measured: Measured, rows: int, cores: int) -> float | None:
        """Its seconds a row, as it ran on the sample (its fixed cost per call spread
        over the rows), if it ran there."""
        per_row = measured.batched_rows.get(cls.name)
        return None if per_row is None else rows * per_row

    def run(self, job: Job) -> Output | None:
        if not isinstance(job.rows, TensorRows):
            raise ConfigError(
                f"executor={self.name!r} works on a batch of tensors, not on a list "
                f"of samples; use map_rows, or another executor"
            )
        twin, what = self.batched(job.fn)
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
        if job.sink.output is None:
            return Output(spec, leaves)
        if job.policy.padding is not None and job.start == 0:
            return Output(spec, leaves)  # the twin padded the batch itself
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
        if not self.pads:
            raise ConfigError(
                "executor='vmap' cannot return ragged rows (every row of a vmap has one "
                "shape); use a per-row executor with pad=, or a twin that pads"
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
    pads = False  # every row of a vmap has one shape

    def batched(self, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str]:
        def call(*columns: Any, **named: Any) -> Any:
            # vmap maps positional inputs only: pass named columns positionally, rename inside
            names, k = list(named), len(columns)
            row = lambda *c: fn(*c[:k], **dict(zip(names, c[k:])))
            return torch.func.vmap(row)(*columns, *named.values())

        return call, f"torch.func.vmap({_name(fn)})"

    def batched_twin(self, fn: Callable[..., Any]) -> Any:
        return None  # vmap of the row function itself (auto checks it before it picks it)

    @classmethod
    def ruled_out(cls, job: Job, processes_allowed: bool) -> str | None:
        if not job.rows.batched:
            return "a list of samples has no batched form"
        return None if len(job.rows) else "no row to try it on"

    @classmethod
    def first_batch(cls, sample: Sampling) -> bool:
        """vmap of the row function, if it works, makes the whole output in one call.

        vmap on a copy of one row first rules out, cheaply and before any row has
        run, the many functions vmap cannot run (``.item()``, data-dependent
        shapes). Serial is then timed on copies of a few rows, vmap runs the whole
        batch, and its first rows must equal serial's bit for bit. Only when that
        fails, or the batch proves too light to be worth it, do those few rows
        run once more, as serial starts over on the batch itself.
        """
        s, job, cal = sample, sample.job, sample.cal
        ex = s.executor(cls.name)
        fn, _ = ex.batched(job.fn)
        try:
            job.rows.take(0, 1).call_batched(fn)  # not timed: a first call can take 100x
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped[cls.name] = why(exc)
            return False
        scratch = s.scratch(min(s.n, max(4, min(32, s.n // 8))))
        s.serial(budget_rows=len(scratch.job.rows), cursor=scratch)
        if s.n * cal.serial_row < MIN_VMAP_WORK:
            cal.dropped[cls.name] = (
                f"the batch takes {s.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"less than trying vmap costs"
            )
            return False
        t = s.now()
        try:
            out = ex.run(job.strict())  # every row (the job starts at 0)
        except Exception as exc:
            cal.dropped[cls.name] = why(exc)
            return False
        took = s.now() - t
        if first_difference(out, scratch.job.sink.output, scratch.done, 0.0) is not None:
            cal.dropped[cls.name] = "its results differ from serial"
            return False
        job.sink.output, cal.batched_rows[cls.name] = out, took / s.n
        s.main.done = s.n
        return True

    @classmethod
    def still_agrees(cls, sample: Sampling) -> bool:
        """Whether vmap of the row function reproduces serial's rows bit for bit."""
        s, job, cal, done = sample, sample.job, sample.cal, sample.main.done
        if job.sink.output is None or done < 2:
            cal.dropped[cls.name] = "needs two measured rows"
            return False
        if done >= s.n:
            return False  # serial ran every row: nothing left for vmap to run
        # copies of up to 8 rows serial computed: a row function that changes its input
        # in place must not change the caller's batch a second time
        k = min(done, 8)
        fn, _ = s.executor(cls.name).batched(job.fn)
        try:  # not timed: a first vmap call in a process can take 100x a later one
            spec, leaves = flatten(job.rows.take(0, k).call_batched(fn))
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped[cls.name] = why(exc)
            return False
        agrees = same_rows(spec, leaves, job.sink.output, k)
        if not agrees:
            cal.dropped[cls.name] = "its results differ from serial"
        return agrees

    def run(self, job: Job) -> Output | None:
        try:
            return super().run(job)
        except PrepError:
            raise
        except Exception as exc:
            error = _vmap_error(job, exc)
            if error is exc:
                raise
            raise error from exc


def _vmap_error(job: Job, exc: Exception) -> Exception:
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
        f"executor='vmap' cannot run {_name(job.fn)}: torch.func.vmap raised "
        f"{type(exc).__name__}: {reason}. The function runs on a single row, but vmap runs "
        f"all rows as one traced batch, so it cannot read values (.item(), int(row[0]), a "
        f"Python if on data) nor make shapes that depend on them. Use executor='auto' "
        f"(it tries vmap and falls back), a per-row executor ('serial', 'threads', "
        f"'processes'), or give the function a batched twin with @prep.rowwise"
    )


def first_difference(out: Output | None, ref: Output | None, k: int, atol: float) -> int | None:
    """The first of rows ``0:k`` where ``out`` differs from ``ref`` (serial's), in
    structure, shape, dtype or value (within ``atol``); None where they agree."""
    if out is None or ref is None:
        return None if ref is None else 0
    if out.spec != ref.spec:
        return 0
    for i in range(k):
        for got, want in zip(out.buffers, ref.buffers):
            if not same(got[i], want[i], atol):
                return i
    return None


def same_rows(spec: Any, leaves: list[torch.Tensor], ref: Output, k: int) -> bool:
    """Whether a batched form's first ``k`` rows (``spec``, ``leaves``) equal the
    rows serial wrote into ``ref``, in structure, shape, dtype and every value, by
    prep's one rule (``trust.same``: NaN where serial has NaN is equal)."""
    return spec == ref.spec and all(same(leaf, buf[:k]) for leaf, buf in zip(leaves, ref.buffers))


def why(exc: BaseException) -> str:
    """An exception in a few words, for ``explain``: its type and first line."""
    text = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
