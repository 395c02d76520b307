"""The batched forms auto tries: a twin (``vectorized``) or ``torch.func.vmap`` of the
row function, each kept only if it reproduces serial's rows (bit for bit, or within
the twin's declared ``atol``).

Whether vmap runs an op through torch's slow fallback (a loop over the rows for an
op without a batching rule) is left to the timing, on purpose: torch's switch that
makes the fallback raise (``torch._C._functorch._set_vmap_fallback_enabled``) is one
global flag of the process, not of a thread, so flipping it for a check would make a
``torch.func.vmap`` the user runs in another thread meanwhile raise. The fallback
gives the same rows, only slower, and auto measures every candidate it keeps."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..core.output import Output, flatten
from ..core.rowwise import twin_of
from ..core.trust import same
from ._sample import Sample

#: seconds of serial work for a whole batch below which vmap is not tried: a first
#: vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


class BatchedForms:
    """A twin or vmap on one sample: run first, checked against serial, timed."""

    def __init__(self, sample: Sample) -> None:
        self.s = sample

    def twin_first(self) -> bool:
        """The first batch of a function with a twin: the twin makes the whole output
        (no copy), the row function runs on copies of a few rows into a scratch
        output, to time serial and to check the twin against; so the row function
        still runs at most once a row of the batch."""
        s, job = self.s, self.s.job
        # copies: a row function that changes its row in place must not change the
        # rows the twin then reads
        timed = s.scratch(min(s.n, 4))
        s.serial(budget_rows=4, cursor=timed)
        t = s.now()
        try:
            out = s.get("vectorized").run(job.strict())
        except Exception as exc:
            if not job.policy.per_row_errors:
                raise  # the twin's own error, as executor="vectorized" would raise it
            s.cal.dropped["vectorized"] = f"it failed on this batch ({why(exc)})"
            return False  # rows run one by one, so a failing row fails alone
        took = s.now() - t
        twin = twin_of(job.fn)
        atol = twin.twin.atol if twin else 0.0
        row = first_difference(out, timed.job.sink.output, timed.done, atol)
        if row is not None:  # serial is the reference: the rows run one by one instead
            s.cal.dropped["vectorized"] = (
                f"its row {row} differs from the row function's"
                + (f" by more than atol={atol}" if atol else "")
                + " (serial is the reference; fix the twin, or declare a tolerance with "
                "@prep.rowwise(batched=..., atol=...))"
            )
            return False
        job.sink.output = out
        s.cal.vectorized_row = took / s.n
        s.main.done = s.n
        return True

    def vmap_first(self) -> bool:
        """The first batch of a function without a twin: ``vmap`` of it, if it works,
        makes the whole output in one call; False (and nothing written) if not.

        vmap on a copy of one row first rules out, cheaply and before any row has
        run, the many functions vmap cannot run (``.item()``, data-dependent
        shapes). Serial is then timed on copies of a few rows, vmap runs the whole
        batch, and its first rows must equal serial's bit for bit. Only when that
        fails, or the batch proves too light to be worth it, do those few rows
        run once more, as serial starts over on the batch itself.
        """
        s, job, cal = self.s, self.s.job, self.s.cal
        ex = s.get("vmap")
        fn, _ = ex.batched(job.fn)
        try:
            job.rows.take(0, 1).call_batched(fn)  # not timed: a first call can take 100x
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped["vmap"] = why(exc)
            return False
        scratch = s.scratch(min(s.n, max(4, min(32, s.n // 8))))
        s.serial(budget_rows=len(scratch.job.rows), cursor=scratch)
        if s.n * cal.serial_row < MIN_VMAP_WORK:
            cal.dropped["vmap"] = (
                f"the batch takes {s.n * cal.serial_row * 1e3:.2f} ms serially: "
                f"less than trying vmap costs"
            )
            return False
        t = s.now()
        try:
            out = ex.run(job.strict())  # every row (the job starts at 0)
        except Exception as exc:
            cal.dropped["vmap"] = why(exc)
            return False
        took = s.now() - t
        if first_difference(out, scratch.job.sink.output, scratch.done, 0.0) is not None:
            cal.dropped["vmap"] = "its results differ from serial"
            return False
        job.sink.output, cal.vmap_row = out, took / s.n
        s.main.done = s.n
        return True

    def vmap_agrees(self) -> bool:
        """Whether vmap of the row function reproduces serial's rows bit for bit."""
        s, job, cal, done = self.s, self.s.job, self.s.cal, self.s.main.done
        if job.sink.output is None or done < 2:
            cal.dropped["vmap"] = "needs two measured rows"
            return False
        if done >= s.n:
            return False  # serial ran every row: nothing left for vmap to run
        # copies of up to 8 rows serial computed: a row function that changes its input
        # in place must not change the caller's batch a second time
        k = min(done, 8)
        fn, _ = s.get("vmap").batched(job.fn)
        try:  # not timed: a first vmap call in a process can take 100x a later one
            spec, leaves = flatten(job.rows.take(0, k).call_batched(fn))
        except Exception as exc:  # any failure just removes the candidate
            cal.dropped["vmap"] = why(exc)
            return False
        agrees = same_rows(spec, leaves, job.sink.output, k)
        if not agrees:
            cal.dropped["vmap"] = "its results differ from serial"
        return agrees

    def run_rest(self, name: str) -> None:
        """The batched form on all rows left, in one call: seconds per row (its fixed
        cost per call spread over them; the lower of this batch's and the one before)."""
        s = self.s
        left, t = s.main.left, s.now()
        if left:
            s.main.run(s.get(name), s.n)
        per_row = (s.now() - t) / left if left else math.inf
        per_row = min(per_row, self.prior_row(name) or math.inf)
        setattr(s.cal, f"{name}_row", per_row if per_row < math.inf else None)

    def prior_row(self, name: str) -> float | None:
        """The batch before's figure of a batched form (seconds a row), if any."""
        return getattr(self.s.prior, f"{name}_row", None) if self.s.prior else None

    def won_outright(self, per_row: float | None = None) -> bool:
        """Whether a batched form beats serial by more than the cores could: no pool
        divides serial time by more than its cores, so the pools need no measuring."""
        s, cal = self.s, self.s.cal
        best = per_row or min(x for x in (cal.vectorized_row, cal.vmap_row, math.inf) if x)
        if best * s.cores >= cal.serial_row:
            return False
        cal.dropped["threads, processes"] = (
            f"a batched form is over {s.cores}x faster than serial, more than {s.cores} cores give"
        )
        return True


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
    prep's one rule (``_trust.same``: NaN where serial has NaN is equal)."""
    return spec == ref.spec and all(same(leaf, buf[:k]) for leaf, buf in zip(leaves, ref.buffers))


def why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["MIN_VMAP_WORK", "BatchedForms", "first_difference", "same_rows", "why"]
