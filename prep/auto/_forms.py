"""auto's models of the batched forms (an executor that makes every row in one call):
the row function's batched twin (``vectorized``), ``torch.func.vmap`` of it, and
``torch.compile`` of that (``compiled``, a form with a start: its compile). Each is
kept only if it reproduces serial's rows (bit for bit, or within the declared
``atol``)."""

from __future__ import annotations

import time
import weakref
from typing import Any, ClassVar

import torch

from ..core.output import Output, flatten
from ..core.rows import TensorRows
from ..core.rowwise import atol_of, twin_of
from ..core.trust import same
from ..errors import ExecutorUnavailable
from ..executors import Executor, Job, vmap_of
from ._cost import CostModel, Measured, Sampling

#: seconds of serial work for a whole batch below which auto does not try vmap: a
#: first vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


#: seconds auto counts a compile as costing until one was measured in this interpreter:
#: inductor's cold compile of a small row function on a 2-core machine (8.6-11 s,
#: docs/benchmarks.md; 1.5-2.3 s from its disk cache)
COMPILE_PRIOR = 10.0
#: rows a compiled form is checked on against serial's, when it compiles
CHECK_ROWS = 8

#: the longest compile (with its first call) each compiled executor took here
_COMPILES: weakref.WeakKeyDictionary[Executor, float] = weakref.WeakKeyDictionary()

#: why auto does not weigh a batched form under seed=
SEEDED = "seed=: one batched call cannot seed each row's draws"


class VectorizedModel(CostModel):
    """The twin the user wrote (``@prep.rowwise``)."""

    name = "vectorized"

    @classmethod
    def ruled_out(cls, job: Job) -> str | None:
        # before vmap in the registry: auto tries the first batched form not ruled out,
        # and a twin the user wrote comes first
        if job.rows.seeds is not None:
            return SEEDED
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
        atol = atol_of(job.fn)  # the twin's (one @prep.rowwise sets both)
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
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        """Its seconds a row, as it ran on the sample (its fixed cost per call spread
        over the rows), if it ran there."""
        per_row = cal.batched_rows.get(cls.name)
        return None if per_row is None else rows * per_row


class VmapModel(VectorizedModel):
    """vmap of the row function: vectorized without writing a twin."""

    name = "vmap"

    @classmethod
    def ruled_out(cls, job: Job) -> str | None:
        if job.rows.seeds is not None:
            return SEEDED
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
        fn, _ = vmap_of(job.fn)
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
        fn, _ = vmap_of(job.fn)
        try:  # not timed: a first vmap call in a process can take 100x a later one
            spec, leaves = flatten(job.rows.take(0, k).call_batched(fn))
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped[cls.name] = why(exc)
            return False
        agrees = same_rows(spec, leaves, job.sink.output, k)
        if not agrees:
            cal.dropped[cls.name] = "its results differ from serial"
        return agrees


class CompiledModel(CostModel):
    """``torch.compile`` of vmap of the row function: a batched form whose compile is a
    start, which auto rents or buys as it does a process pool's (``rent_or_buy``).

    Weighed only where vmap of the row function ran on the sample and gave serial's
    rows (a function vmap cannot run, compiled, cannot run either). What it takes once
    compiled cannot be known without compiling it: until a batch has run on it, it is
    counted at 0 s, the most it could save, so that auto compiles once the batches so
    far took as long as the compile costs (:data:`COMPILE_PRIOR` until one compile was
    measured here). A program whose work on a function is shorter than a compile never
    compiles it; one that goes on pays at most about twice the best in hindsight.
    Its compile runs on copies of the first rows left, which must then equal serial's
    (within ``@prep.rowwise(atol=...)``): a form that differs, or does not compile, is
    dropped with the reason. Once it ran, its batches are its figure, as any executor's.
    """

    name = "compiled"
    rent_or_buy = True
    prepare_failed: ClassVar[str] = "its compiled form is not used"

    @classmethod
    def ruled_out(cls, job: Job) -> str | None:
        return VmapModel.ruled_out(job)

    @classmethod
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        if VmapModel.name not in cal.batched_rows or VmapModel.name in cal.dropped:
            return None
        return 0.0  # at best: its batches measure it (``Figures.figure``)

    @classmethod
    def start_cost(cls, ex: Executor) -> float | None:
        """The longest compile ``ex`` took here (a function it had compiled already takes
        milliseconds, which says nothing of the next one), else ``COMPILE_PRIOR``."""
        return _COMPILES.get(ex) or COMPILE_PRIOR

    @classmethod
    def prepare(cls, ex: Executor, job: Job) -> float:
        """Compile the form on copies of up to ``CHECK_ROWS`` rows left (its batch
        dimension dynamic: the batches reuse it) and hold its rows to serial's on
        other copies; the seconds that took. :class:`~prep.errors.ExecutorUnavailable`
        where it cannot compile or gives other values."""
        rows, at = job.rows, job.start
        k = min(CHECK_ROWS, len(rows) - at)
        if not isinstance(rows, TensorRows) or k < 1:
            raise ExecutorUnavailable("there is no batch of tensors to compile it on")
        copies = [rows.take(at, at + k) for _ in range(2)]
        mine, ref = (Job.new(job.fn, r.replace(r.columns)) for r in copies)
        t = time.perf_counter()
        try:
            out = ex.run(mine)
        except Exception as exc:
            raise ExecutorUnavailable(f"it did not compile here ({why(exc)})") from exc
        took = time.perf_counter() - t
        _COMPILES[ex] = max(took, _COMPILES.get(ex, 0.0))
        try:
            ref.run_range(0, k)
        except Exception as exc:  # serial, the reference, fails where it ran: not the same
            raise ExecutorUnavailable(f"a row it made fails under serial ({why(exc)})") from exc
        atol = atol_of(job.fn)
        row = first_difference(out, ref.sink.output, k, atol)
        if row is not None:
            raise ExecutorUnavailable(
                f"its row {at + row} differs from the row function's"
                + (f" by more than atol={atol}" if atol else "")
                + " (serial is the reference, and fused loops may reorder floating-point "
                "operations: declare what you accept with @prep.rowwise(atol=...))"
            )
        return took


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


__all__ = [
    "CHECK_ROWS",
    "COMPILE_PRIOR",
    "MIN_VMAP_WORK",
    "CompiledModel",
    "VectorizedModel",
    "VmapModel",
]
