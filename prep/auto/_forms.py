"""auto's models of the batched forms (an executor that makes every row in one call):
the row function's batched twin (``vectorized``) and ``torch.func.vmap`` of it. Each
is kept only if it reproduces serial's rows (bit for bit, or within the twin's
declared ``atol``)."""

from __future__ import annotations

from typing import Any

import torch

from ..core.output import Output, flatten
from ..core.rowwise import twin_of
from ..core.trust import same
from ..executors import Job, vmap_of
from ._cost import CostModel, Measured, Sampling

#: seconds of serial work for a whole batch below which auto does not try vmap: a
#: first vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


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


__all__ = ["MIN_VMAP_WORK", "VectorizedModel", "VmapModel"]
