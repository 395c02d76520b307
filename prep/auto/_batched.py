"""The batched forms auto tries on a first batch: a twin (``vectorized``) or
``torch.func.vmap`` of the row function, and the check that vmap reproduces
serial's rows bit for bit.

Whether vmap runs an op through torch's slow fallback (a loop over the rows for an
op without a batching rule) is left to the timing, on purpose: torch's switch that
makes the fallback raise (``torch._C._functorch._set_vmap_fallback_enabled``) is one
global flag of the process, not of a thread, so flipping it for a check would make a
``torch.func.vmap`` the user runs in another thread meanwhile raise. The fallback
gives the same rows, only slower, and auto measures every candidate it keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._output import Output, flatten
from .._rowwise import twin_of
from .._trust import same
from ..errors import ExecutorUnavailable
from ..executors._base import Executor, Job
from ..executors.vectorized import VmapExecutor

if TYPE_CHECKING:
    from .calibrator import Calibrator

#: seconds of serial work for a whole batch below which vmap is not tried: a first
#: vmap call costs a few hundred microseconds whatever the rows
MIN_VMAP_WORK = 3e-4


def twin_first(c: Calibrator) -> bool:
    """The first batch of a function with a twin: the twin makes the whole output
    (no copy), the row function runs on a few rows into a scratch output, only to
    time serial, so it still runs at most once a row."""
    from .calibrator import Progress

    job = c.job
    # copies: a row function that changes its row in place must not change the
    # rows the twin then reads
    scratch = Job(job.fn, job.rows.take(0, min(c.n, 4)), None, deadline=job.clock)
    timed = Progress(scratch)
    c.serial(budget_rows=4, progress=timed)
    t = c.now()
    try:
        out = c.get("vectorized").run(job.strict())
    except Exception as exc:
        if not job.policy.per_row_errors:
            raise  # the twin's own error, as executor="vectorized" would raise it
        c.cal.dropped["vectorized"] = f"it failed on this batch ({why(exc)})"
        return False  # rows run one by one, so a failing row fails alone
    took = c.now() - t
    twin = twin_of(job.fn)
    row = first_difference(out, scratch.output, timed.done, twin.twin.atol if twin else 0.0)
    if row is not None:  # serial is the reference: the rows run one by one instead
        c.cal.dropped["vectorized"] = (
            f"its row {row} differs from the row function's"
            + (f" by more than atol={twin.twin.atol}" if twin and twin.twin.atol else "")
            + " (serial is the reference; fix the twin, or declare a tolerance with "
            "@prep.rowwise(batched=..., atol=...))"
        )
        return False
    job.output = out
    c.cal.vectorized_row = took / c.n
    c.main.done = c.n
    return True


def vmap_first(c: Calibrator) -> bool:
    """The first batch of a function without a twin: ``vmap`` of it, if it works,
    makes the whole output in one call; False (and nothing written) if not.

    vmap on a copy of one row first rules out, cheaply and before any row has
    run, the many functions vmap cannot run (``.item()``, data-dependent
    shapes). Serial is then timed on copies of a few rows, vmap runs the whole
    batch, and its first rows must equal serial's bit for bit. Only when that
    fails, or the batch proves too light to be worth it, do those few rows
    run once more, as serial starts over on the batch itself.
    """
    from .calibrator import Progress

    job, cal = c.job, c.cal
    ex = _vmap(c)
    fn, _ = ex.batched(job.fn)
    try:
        job.rows.take(0, 1).call_batched(fn)  # not timed: a first call can take 100x more
    except Exception as exc:  # any failure just removes the candidate
        cal.dropped["vmap"] = why(exc)
        return False
    k = min(c.n, max(4, min(32, c.n // 8)))
    scratch = Progress(Job(job.fn, job.rows.take(0, k), None, deadline=job.clock))
    c.serial(budget_rows=k, progress=scratch)
    if c.n * cal.serial_row < MIN_VMAP_WORK:
        cal.dropped["vmap"] = (
            f"the batch takes {c.n * cal.serial_row * 1e3:.2f} ms serially: "
            f"less than trying vmap costs"
        )
        return False
    t = c.now()
    try:
        out = ex.run(job.strict())  # every row (the job starts at 0)
    except Exception as exc:
        cal.dropped["vmap"] = why(exc)
        return False
    took = c.now() - t
    ref, done = scratch.job.output, scratch.done
    if (
        ref is None
        or out is None
        or not same_rows(out.spec, [b[:done] for b in out.buffers], ref, done)
    ):
        cal.dropped["vmap"] = "its results differ from serial"
        return False
    job.output, cal.vmap_row = out, took / c.n
    c.main.done = c.n
    return True


def vmap_agrees(c: Calibrator) -> bool:
    """Whether vmap of the row function reproduces serial's rows bit for bit."""
    job, cal, done = c.job, c.cal, c.done
    if job.output is None or done < 2:
        cal.dropped["vmap"] = "needs two measured rows"
        return False
    if done >= c.n:
        return False  # serial ran every row: nothing left for vmap to run
    # copies of up to 8 rows serial computed: a row function that changes its input
    # in place must not change the caller's batch a second time
    k = min(done, 8)
    fn, _ = _vmap(c).batched(job.fn)
    try:  # not timed: a first vmap call in a process can take 100x a later one
        spec, leaves = flatten(job.rows.take(0, k).call_batched(fn))
    except Exception as exc:  # any failure just removes the candidate
        cal.dropped["vmap"] = why(exc)
        return False
    same = same_rows(spec, leaves, job.output, k)
    if not same:
        cal.dropped["vmap"] = "its results differ from serial"
    return same


def run_tolerant(ex: Executor, job: Job) -> Output | None:
    """``ex.run(job)``; a batched form under ``on_error='fill'``/``'skip'`` runs as one
    strict call, and if that fails the rows run one by one in this thread, so a
    failing row fails alone (a batch with a bad row is no reason to re-calibrate)."""
    if ex.per_row or not job.policy.per_row_errors:
        return ex.run(job)
    try:
        return ex.run(job.strict())
    except ExecutorUnavailable:
        raise
    except Exception:
        job.run_range(job.start, len(job.rows))
        return job.output


def _vmap(c: Calibrator) -> VmapExecutor:
    ex = c.get("vmap")
    assert isinstance(ex, VmapExecutor), f"the vmap executor is a {type(ex).__name__}"
    return ex


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
    rows serial wrote into ``ref``, bit for bit, in structure, shape and dtype."""
    return spec == ref.spec and all(
        leaf.shape == buf[:k].shape and leaf.dtype == buf.dtype and torch.equal(leaf, buf[:k])
        for leaf, buf in zip(leaves, ref.buffers)
    )


def why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
