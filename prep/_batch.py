"""One batch, start to end: rows -> executor -> output -> device, and what the call
returns (the output, and the lengths and valid mask it was asked for). Every entry
comes here (``map_rows``, a Pool's calls and streams, ``Collate``, ``prep run``),
each having checked that the row function is one (``core.checks.check_fn``).

Failed rows (``on_error='fill'``/``'skip'``) are filled as they fail, wherever
they ran; a call that had any warns once; ``'skip'`` then keeps the valid rows,
in input order (one copy of what remains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._progress import RowProgress
from .core.checks import check_row_call
from .core.options import Options, Returns
from .core.output import Output, Result
from .core.padding import given_padded
from .core.policy import Failures, Policy, ResultCheck
from .core.rows import Rows
from .core.rowwise import twin_of
from .core.seeding import Seeding, takes_rng
from .core.state import WithState
from .core.trust import check_named
from .errors import ConfigError, RowError
from .executors import Executor, Job, copy_rows


@dataclass
class Batch:
    """One batch between :func:`start` and :func:`finish`: the job an executor runs,
    and what the call returns beside its output."""

    job: Job
    given: Output | None  # out=, as the call gave it
    options: Options
    bar: RowProgress | None = None
    #: where the batch is in a stream: (its number, rows before it), for warnings
    place: tuple[int, int] | None = None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def start(
    fn: Callable[..., Any],
    rows: Rows,
    options: Options,
    ex: Executor,
    place: tuple[int, int] | None = None,
) -> Batch:
    """The job of ``fn`` over ``rows`` with ``options``, for ``ex`` to run (a stream
    starts it when it submits the batch, and finishes it when the loop takes it;
    ``place``: where it is in the stream)."""
    rng = options.seed is not None and takes_rng(fn)
    if isinstance(fn, WithState):  # setup=: the function itself, given state= too
        check_row_call(fn.fn, rows, state=True, rng=rng)
    else:
        check_row_call(fn, rows, rng=rng)
    if options.seed is not None:  # each row's draws seeded for it, on a per-row executor
        check_seeded(ex)
        rows = rows.seeding(Seeding(options.seed, rng, shared=ex.traits.shares_generators))
    n, policy, device = len(rows), options.policy, options.device
    if policy.per_row_errors:  # a bad result (None, another dtype) then fails its row only
        rows = rows.checking(ResultCheck(policy.padding is not None, options.out))
    given = _given(options.out, n, policy)
    pin = device is not None and device.type == "cuda" and rows.device.type == "cpu"
    bar = RowProgress(n) if options.progress else None
    advance = bar.advance if bar is not None else None
    staging = _staging(given, rows, device)
    job = Job.new(fn, rows, staging, options.timeout, policy=policy, pin=pin, progress=advance)
    return Batch(job, given, options, bar, place)


def run(
    ex: Executor,
    fn: Callable[..., Any],
    rows: Rows,
    options: Options,
    place: tuple[int, int] | None = None,
) -> Any:
    """``fn`` over ``rows`` through ``ex``, as ``map_rows`` returns it with ``options``:
    a stream of one batch (``place``: where it is in a stream of more)."""
    batch = start(fn, rows, options, ex, place)
    try:
        if len(rows) == 0 and batch.given is not None:
            result: Output | None = batch.given
        else:
            result = ex.run(batch.job)
    finally:
        batch.close()
    return finish(batch, result, ex)


def finish(batch: Batch, result: Output | None, ex: Executor) -> Any:
    """What the call returns once ``ex`` (whose workers ran the batch) made ``result``:
    held to serial on a function's first batch, failed rows warned of, the output
    in ``out=`` or on the device."""
    job, options = batch.job, batch.options
    n, policy = len(job.rows), job.policy
    if result is None:
        raise _no_shape(n, job.sink.failures, policy)
    check_named(  # serial is the reference: the first batch of each function, once
        ex, job.fn, job.rows, result, other_interpreter=ex.traits.needs_processes,
        twin=_twin(ex, job.fn), failed=job.sink.failures.rows(),
    )  # fmt: skip
    result.finish()
    if job.sink.failures:
        job.sink.failures.warn(n, policy, batch.place)
    return _returned(job, result, batch.given, options.device, options.returns)


def check_seeded(ex: Executor | type[Executor]) -> None:
    """``seed=`` on ``ex``: one that runs rows one by one, in processes or in this one
    (on threads, whose rows share the global generators, they are watched, not seeded:
    ``core.seeding`` says why)."""
    if not ex.traits.per_row:
        raise ConfigError(
            f"seed= seeds each row's random draws, but executor={ex.name!r} makes every row "
            f"in one batched call, which cannot be seeded row by row; use executor='auto', "
            f"'serial' or 'processes'"
        )


def _twin(ex: Executor, fn: Callable[..., Any]) -> Any:
    """The batched twin ``ex`` called in place of ``fn`` (None: it called ``fn``)."""
    return twin_of(fn) if ex.traits.calls_twin else None


def _staging(given: Output | None, rows: Rows, device: torch.device | None) -> Output | None:
    """Where the executor writes: ``out=`` itself, or a buffer on the batch's device
    (pinned when a CUDA copy follows) that is copied into ``out=`` at the end."""
    home = rows.device
    if given is None or all(b.device == home for b in given.buffers):
        return given
    if home.type != "cpu":
        raise ConfigError(
            f"out= lives on {given.buffers[0].device} but the batch on {home}; move one of them"
        )
    return given.like(pin=device is not None and device.type == "cuda", device="cpu")


def _returned(
    job: Job, result: Output, given: Output | None, device: torch.device | None, returns: Returns
) -> Any:
    """What the call returns: the output in ``out=`` or on ``device``, and the lengths,
    valid mask and errors asked for (``on_error='skip'`` keeps the valid rows)."""
    n, policy = len(job.rows), job.policy
    lengths = result.lengths() if returns.lengths else None  # the rows' own, as written
    if given is not None and result is not given:
        result = copy_rows(given, result)
    valid = torch.ones(n, dtype=torch.bool)
    if job.sink.failures:
        valid[job.sink.failures.rows()] = False
    if policy.on_error == "skip" and job.sink.failures:
        keep = valid.nonzero().flatten()
        result = Output(result.spec, [b.index_select(0, keep.to(b.device)) for b in result.buffers])
        lengths = _select(lengths, keep) if lengths is not None else None
    out_value = _to(result, device)
    errors = dict(sorted(job.sink.failures.errors.items()))
    asked = ((lengths, returns.lengths), (valid, returns.valid), (errors, returns.errors))
    extra = [x for x, wanted in asked if wanted]
    return (out_value, *extra) if extra else out_value


def _given(out: Any, n: int, policy: Policy) -> Output | None:
    if out is None:
        return None
    if policy.padding is None:
        return Output.given(out, n)
    return given_padded(out, n, policy.padding)


def _to(result: Output, device: torch.device | None) -> Result:
    if device is None:
        return result.result()
    return result.spec.unflatten(
        [
            b if b.device == device else b.to(device, non_blocking=b.is_pinned())
            for b in result.buffers
        ]
    )


def _select(lengths: Any, keep: Tensor) -> Any:
    if isinstance(lengths, Tensor):
        return lengths.index_select(0, keep)
    if isinstance(lengths, dict):
        return {k: v.index_select(0, keep) for k, v in lengths.items()}
    return tuple(v.index_select(0, keep) for v in lengths)


def _no_shape(n: int, failures: Failures, policy: Policy) -> BaseException:
    if failures:
        first = min(failures.errors)
        err = RowError(
            first,
            f"every one of the {n} rows failed (on_error={policy.on_error!r}), so no row "
            f"result shows the output's shape; pass out= (a preallocated result) to get "
            f"it filled anyway. The first, row {first}: {failures.errors[first]}",
        )
        err.__cause__ = failures.errors[first]
        return err
    return ValueError(
        "the batch has 0 rows, so no row result shows the output's shape; "
        "pass out= (a preallocated result with 0 rows), or give the "
        "function a batched twin with @prep.rowwise"
    )


__all__ = ["Batch", "finish", "run", "start"]
