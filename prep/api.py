"""``map_rows``, ``map_samples``, ``explain`` and ``shutdown``: the public face of the
executors, with the warm pools ``map_rows`` keeps between calls (:class:`prep.Pool`,
in :mod:`prep.pool`, is the one you hold yourself).

Data flows one way (one batch's trip is :func:`prep._batch.run`)::

    batch ──rows_of──▶ Rows ──executor.run──▶ Output (CPU, pinned if bound for CUDA)
                                                  │
                       out= (given) ◀──copy_──────┤ (only when out= lives elsewhere)
                       result ◀──.to(device, non_blocking)──┘
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._batch import Returns, run
from ._checks import check_device, check_fn, check_row_call, check_timeout
from ._policy import Policy, ResultCheck
from ._rows import Rows, rows_of, samples_of
from ._state import Binder, WithState
from .auto import AutoExecutor, Calibration, Calibrator, Sample
from .executors import Executor, Job, in_worker_process, resolve_workers
from .registry import EXECUTORS as REGISTRY
from .registry import executor_class

AUTO = "auto"

_warm: dict[tuple[str, int], Executor] = {}
_binders: dict[Callable[[], Any], Binder] = {}
_warm_lock = threading.RLock()
_warned_fallback = False

__all__ = ["AUTO", "explain", "in_worker_process", "map_rows", "map_samples", "shutdown"]


def _choose(executor: str) -> str:
    """The executor to run here: one that starts processes cannot inside a DataLoader
    worker (daemonic processes may not have children), so threads run instead."""
    global _warned_fallback
    if not REGISTRY[executor].needs_processes or not in_worker_process():
        return executor
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(
            f"executor={executor!r} cannot start a process pool inside a DataLoader "
            f"worker (daemonic processes may not have children); using "
            f"'threads' in this worker instead",
            RuntimeWarning,
            stacklevel=5,  # the caller of map_rows / Pool.map_rows
        )
    return "threads"


def _check_name(executor: str) -> str:
    executor_class(executor)
    return executor


def _warm_executor(name: str, workers: int) -> Executor:
    key = (name, workers if REGISTRY[name].per_row else 1)
    with _warm_lock:
        ex = _warm.get(key)
        if ex is None:
            if name == AUTO:  # auto shares the warm pools of map_rows
                ex = AutoExecutor(workers, executors=lambda n: _warm_executor(n, workers))
            else:
                ex = REGISTRY[name](workers)
            _warm[key] = ex
        return ex


def shutdown() -> None:
    """Close the warm pools that ``map_rows`` keeps between calls (also run at exit),
    and the per-worker states their ``setup=`` made."""
    with _warm_lock:
        pools = list(_warm.values())
        _warm.clear()
        binders = list(_binders.values())
        _binders.clear()
    for ex in pools:
        ex.close()
    for binder in binders:
        binder.close()


def _bound(fn: Callable[..., Any], setup: Callable[[], Any] | None) -> Callable[..., Any]:
    """``fn`` given ``state=`` from the warm states of ``setup`` (one store per setup)."""
    if setup is None:
        return fn
    with _warm_lock:
        binder = _binders.get(setup)
        if binder is None:
            binder = _binders[setup] = Binder(setup)
    return binder.bind(fn)


atexit.register(shutdown)


def _forget_inherited_pools() -> None:
    # a forked child (a DataLoader worker, say) inherits the parent's pool objects, whose
    # threads and processes it does not have: it must start its own
    global _warm_lock
    _warm.clear()
    _binders.clear()
    _warm_lock = threading.RLock()


os.register_at_fork(after_in_child=_forget_inherited_pools)


def _module_call(
    executor: str,
    fn: Callable[..., Any],
    rows: Rows,
    workers: int | None,
    *,
    device: Any,
    timeout: Any,
    setup: Callable[[], Any] | None = None,
    **options: Any,
) -> Any:
    n_workers = resolve_workers(workers)
    dev, limit = check_device(device), check_timeout(timeout)
    ex = _warm_executor(_choose(_check_name(executor)), n_workers)
    return _call(ex, _bound(fn, setup), rows, device=dev, timeout=limit, **options)


def _call(
    ex: Executor,
    fn: Callable[..., Any],
    rows: Rows,
    *,
    device: torch.device | None,
    timeout: float | None,
    out: Any = None,
    pad: Any = None,
    pad_to: Any = None,
    on_error: str = "raise",
    fill: Any = None,
    return_lengths: bool = False,
    return_valid: bool = False,
    return_errors: bool = False,
    progress: bool = False,
) -> Any:
    check_fn(fn, None, "map_rows", "batch")  # a Pool's calls come here only
    if isinstance(fn, WithState):  # setup=: the function itself, given state= too
        check_row_call(fn.fn, rows, state=True)
    else:
        check_row_call(fn, rows)
    policy = Policy.of(pad, pad_to, on_error, fill)
    returns = Returns(return_lengths, return_valid, return_errors)
    if policy.per_row_errors:  # a bad result (None, another dtype) then fails its row only
        rows = rows.checking(ResultCheck(policy.padding is not None, out))
    return run(
        ex, fn, rows, out=out, device=device, timeout=timeout, policy=policy, returns=returns,
        progress=progress,
    )  # fmt: skip


def map_rows(
    fn: Callable[..., Any],
    batch: Any,
    *,
    executor: str = AUTO,
    workers: int | None = None,
    device: Any = None,
    out: Any = None,
    timeout: float | None = None,
    pad: Any = None,
    pad_to: Any = None,
    return_lengths: bool = False,
    on_error: str = "raise",
    fill: Any = None,
    return_valid: bool = False,
    return_errors: bool = False,
    setup: Callable[[], Any] | None = None,
    progress: bool = False,
) -> Any:
    """Run ``fn`` on every row of ``batch`` and stack the results into one output.

    ``batch`` is a Tensor (``fn(row)``), a tuple/list of Tensors with equal dim 0
    (``fn(*row)``) or a dict of Tensors (``fn(**row)``). ``fn`` returns a
    Tensor, a tuple or a dict of Tensors; the result has the same structure with
    a new leading dim of one entry per row, written in place (no list, no
    ``torch.stack``). ``executor`` is one of ``serial``, ``threads``,
    ``processes``, ``joblib``, ``vectorized``, ``vmap`` or ``auto``; ``auto``
    measures ``fn`` on the first rows of the first batch of each signature and
    picks the executor it predicts fastest (see :func:`explain`).
    ``out=`` is filled and returned instead of allocating; ``device=`` is where
    the result lands (from pinned memory, ``non_blocking``, for CUDA). Pools for
    ``threads``/``processes``/``joblib`` stay warm between calls; see
    :func:`shutdown`. Results carry no autograd history, whatever the executor
    (this is preprocessing): a batch that requires grad is read detached, and a
    twin that returns its input returns the batch itself.

    Ragged rows: with ``pad=`` (a number, or one per result like ``{"ids": 0,
    "mask": False}``) rows may differ in size; each is padded at the end of every
    dim to the batch's largest, or to ``pad_to=`` (a shape, or one per result).
    ``return_lengths=True`` also returns each row's size (int64 ``[B]`` for 1-D
    rows, ``[B, dims]`` else). Bad rows: ``on_error="fill"`` fills a failed
    row with ``fill=`` (default: the pad value, else 0), ``"skip"`` leaves it
    out; either warns once, and ``return_valid=True`` also returns a bool ``[B]``
    mask of the rows that succeeded, ``return_errors=True`` a dict of each failed
    row's ``RowError``. With return flags the call returns ``(out, lengths, valid,
    errors)``, those asked for, in that order.

    Per-worker state: with ``setup=`` (a function of no arguments) each worker
    calls it once, where it runs (once per thread under ``threads``, once per
    process under ``processes``/``joblib``), and ``fn`` receives the result as the
    keyword ``state=``. States stay warm with their pools; ``close()`` is called
    on them when their worker stops. ``progress=True`` shows a tqdm bar of rows
    on a terminal (nothing elsewhere).

    >>> import torch, prep
    >>> prep.map_rows(lambda r: r.flip(0), torch.arange(6).view(2, 3), executor="threads")
    tensor([[2, 1, 0],
            [5, 4, 3]])
    >>> prep.map_samples(torch.arange, [2, 4, 1], pad=-1, executor="serial")
    tensor([[ 0,  1, -1, -1],
            [ 0,  1,  2,  3],
            [ 0, -1, -1, -1]])
    """
    check_fn(fn, batch, "map_rows", "batch")
    return _module_call(
        executor, fn, rows_of(batch), workers, device=device, timeout=timeout, out=out,
        pad=pad, pad_to=pad_to, return_lengths=return_lengths, on_error=on_error,
        fill=fill, return_valid=return_valid, return_errors=return_errors, setup=setup,
        progress=progress,
    )  # fmt: skip


def map_samples(
    fn: Callable[[Any], Any],
    samples: Sequence[Any],
    *,
    executor: str = AUTO,
    workers: int | None = None,
    device: Any = None,
    out: Any = None,
    timeout: float | None = None,
    pad: Any = None,
    pad_to: Any = None,
    return_lengths: bool = False,
    on_error: str = "raise",
    fill: Any = None,
    return_valid: bool = False,
    return_errors: bool = False,
    setup: Callable[[], Any] | None = None,
    progress: bool = False,
) -> Any:
    """Like :func:`map_rows`, over a list of arbitrary samples: ``fn(sample)`` for each."""
    check_fn(fn, samples, "map_samples", "samples")
    return _module_call(
        executor, fn, samples_of(samples), workers, device=device, timeout=timeout,
        out=out, pad=pad, pad_to=pad_to, return_lengths=return_lengths, on_error=on_error,
        fill=fill, return_valid=return_valid, return_errors=return_errors, setup=setup,
        progress=progress,
    )  # fmt: skip


def explain(
    fn: Callable[..., Any],
    batch: Any,
    *,
    workers: int | None = None,
    pad: Any = None,
    pad_to: Any = None,
    on_error: str = "raise",
    fill: Any = None,
) -> Calibration:
    """Calibrate ``auto`` on ``batch`` and return what it measured, predicted and chose.

    Only the rows calibration needs are computed (all of them where a batched
    twin or vmap runs the rest at once). ``pad=``, ``pad_to=``, ``on_error=`` and
    ``fill=`` are :func:`map_rows`'s: they change what auto may choose, and the
    first line shows them. ``print()`` the result for a few
    readable lines; its fields (``predicted``, ``choice``, ...) are there for code.

    >>> import torch, prep
    >>> cal = prep.explain(lambda r: r * 2, torch.ones(64, 3))
    >>> lines = str(cal).splitlines()  # one sentence first, then the figures
    >>> lines[0].startswith(f"{cal.choice}: "), lines[1][:14], lines[-1][:9]
    (True, 'auto: 64 rows,', '  choice:')
    """
    rows = batch if isinstance(batch, Rows) else rows_of(batch)
    if len(rows) == 0:
        raise ValueError("the batch has 0 rows: there is nothing to measure")
    n_workers = resolve_workers(workers)
    job = Job(fn, rows, policy=Policy.of(pad, pad_to, on_error, fill))
    get = lambda name: _warm_executor(name, n_workers)  # noqa: E731
    return Calibrator(Sample(job, get, n_workers, not in_worker_process())).run()
