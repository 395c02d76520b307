"""``map_rows``, ``map_samples`` and ``Pool``: the public face of the executors.

Data flows one way::

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

from ._checks import check_device, check_timeout
from ._output import Output, Result
from ._rows import Rows, SampleRows, rows_of
from .auto import AutoExecutor, Calibration, Calibrator
from .errors import ConfigError
from .executors import REGISTRY, Executor, Job, executor_class, in_worker_process, resolve_workers

AUTO = "auto"

_warm: dict[tuple[str, int], Executor] = {}
_warm_lock = threading.RLock()
_warned_fallback = False

__all__ = ["AUTO", "Pool", "explain", "in_worker_process", "map_rows", "map_samples", "shutdown"]


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
    """Close the warm pools that ``map_rows`` keeps between calls (also run at exit)."""
    with _warm_lock:
        pools = list(_warm.values())
        _warm.clear()
    for ex in pools:
        ex.close()


atexit.register(shutdown)


def _forget_inherited_pools() -> None:
    # a forked child (a DataLoader worker, say) inherits the parent's pool objects, whose
    # threads and processes it does not have: it must start its own
    global _warm_lock
    _warm.clear()
    _warm_lock = threading.RLock()


os.register_at_fork(after_in_child=_forget_inherited_pools)


def _run(
    ex: Executor,
    fn: Callable[..., Any],
    rows: Rows,
    *,
    out: Any,
    device: torch.device | None,
    timeout: float | None,
) -> Result:
    """One batch through ``ex``: rows -> executor -> output -> device."""
    n = len(rows)
    given = Output.given(out, n) if out is not None else None
    if n == 0 and given is not None:
        return given.result()
    home = rows.device
    bound_for_cuda = device is not None and device.type == "cuda" and home.type == "cpu"
    staging = given
    if given is not None and any(b.device != home for b in given.buffers):
        staging = given.like(pin=bound_for_cuda) if home.type == "cpu" else None
        if staging is None:
            raise ConfigError(
                f"out= lives on {given.buffers[0].device} but the batch on {home}; move one of them"
            )
    job = Job(fn, rows, staging, timeout, pin=bound_for_cuda)
    result = ex.run(job)
    if result is None:  # 0 rows and no batched twin
        raise ValueError(
            "the batch has 0 rows, so no row result shows the output's shape; "
            "pass out= (a preallocated result with 0 rows), or give the "
            "function a batched twin with @prep.rowwise"
        )
    if given is not None:
        if result is not given:
            for dst, src in zip(given.buffers, result.buffers):
                dst.copy_(src, non_blocking=src.is_pinned())
        return given.result()
    if device is None:
        return result.result()
    return result.spec.unflatten(
        [
            b if b.device == device else b.to(device, non_blocking=b.is_pinned())
            for b in result.buffers
        ]
    )


def _module_call(
    executor: str,
    fn: Callable[..., Any],
    rows: Rows,
    workers: int | None,
    *,
    out: Any,
    device: Any,
    timeout: Any,
) -> Result:
    n_workers = resolve_workers(workers)
    dev, limit = check_device(device), check_timeout(timeout)
    ex = _warm_executor(_choose(_check_name(executor)), n_workers)
    return _run(ex, fn, rows, out=out, device=dev, timeout=limit)


def map_rows(
    fn: Callable[..., Any],
    batch: Any,
    *,
    executor: str = AUTO,
    workers: int | None = None,
    device: Any = None,
    out: Any = None,
    timeout: float | None = None,
) -> Result:
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
    :func:`shutdown`. Results of the per-row executors carry no autograd
    history (this is preprocessing); ``vectorized`` and ``vmap`` return what the
    batched call returns, autograd history included, and a twin that returns its
    input returns the batch itself.

    >>> import torch, prep
    >>> prep.map_rows(lambda r: r.flip(0), torch.arange(6).view(2, 3), executor="threads")
    tensor([[2, 1, 0],
            [5, 4, 3]])
    """
    return _module_call(
        executor, fn, rows_of(batch), workers, out=out, device=device, timeout=timeout
    )


def map_samples(
    fn: Callable[[Any], Any],
    samples: Sequence[Any],
    *,
    executor: str = AUTO,
    workers: int | None = None,
    device: Any = None,
    out: Any = None,
    timeout: float | None = None,
) -> Result:
    """Like :func:`map_rows`, over a list of arbitrary samples: ``fn(sample)`` for each."""
    return _module_call(
        executor,
        fn,
        SampleRows(list(samples)),
        workers,
        out=out,
        device=device,
        timeout=timeout,
    )


def explain(fn: Callable[..., Any], batch: Any, *, workers: int | None = None) -> Calibration:
    """Calibrate ``auto`` on ``batch`` and return what it measured, predicted and chose.

    Only the rows calibration needs are computed (all of them where a batched
    twin or vmap runs the rest at once). ``print()`` the result for a few
    readable lines; its fields (``predicted``, ``choice``, ...) are there for code.

    >>> import torch, prep
    >>> print(prep.explain(lambda r: r * 2, torch.ones(64, 3)))  # doctest: +ELLIPSIS
    auto: 64 rows, ... workers; calibrated in ... ms, computing ... of the rows
    ...
      choice: ...
    """
    rows = batch if isinstance(batch, Rows) else rows_of(batch)
    if len(rows) == 0:
        raise ValueError("the batch has 0 rows: there is nothing to measure")
    n_workers = resolve_workers(workers)
    job = Job(fn, rows)
    get = lambda name: _warm_executor(name, n_workers)  # noqa: E731
    return Calibrator(job, get, n_workers, not in_worker_process()).run()


class Pool:
    """A warm executor of one kind, reused across batches; close it when done.

    >>> import torch, prep
    >>> with prep.Pool("threads", workers=2) as pool:
    ...     pool.map_rows(torch.neg, torch.ones(2, 2)).tolist()
    [[-1.0, -1.0], [-1.0, -1.0]]
    """

    def __init__(
        self,
        executor: str = AUTO,
        workers: int | None = None,
        device: Any = None,
        timeout: float | None = None,
    ) -> None:
        self.executor = _check_name(executor)
        self.workers = resolve_workers(workers)
        self.device = check_device(device)
        self.timeout = check_timeout(timeout)
        self._executors: dict[str, Executor] = {}
        self._closed = False
        self._lock = threading.Lock()  # two threads' first calls build one executor
        self._pid = os.getpid()  # a forked child's copy must not close the parent's workers

    def _get(self, name: str) -> Executor:
        with self._lock:
            if self._closed:
                raise ConfigError(f"{self!r} is closed; create a new prep.Pool")
            ex = self._executors.get(name)
            if ex is None:
                ex = self._executors[name] = REGISTRY[name](self.workers)
            return ex

    def map_rows(self, fn: Callable[..., Any], batch: Any, *, out: Any = None) -> Result:
        """:func:`map_rows` with this pool's executor, workers, device and timeout."""
        return self._call(fn, rows_of(batch), out)

    def map_samples(
        self, fn: Callable[[Any], Any], samples: Sequence[Any], *, out: Any = None
    ) -> Result:
        """:func:`map_samples` with this pool's executor, workers, device and timeout."""
        return self._call(fn, SampleRows(list(samples)), out)

    def _call(self, fn: Callable[..., Any], rows: Rows, out: Any) -> Result:
        ex = self._get(_choose(self.executor))
        return _run(ex, fn, rows, out=out, device=self.device, timeout=self.timeout)

    def explain(self) -> str:
        """What ``auto`` measured and chose for each signature this pool has seen."""
        auto = self._executors.get(AUTO)
        return auto.explain() if isinstance(auto, AutoExecutor) else "nothing yet"

    def choices(self) -> list[Calibration]:
        """``auto``'s latest :class:`~prep.auto.Calibration` for each signature this pool
        has seen (its ``.choice`` is the executor it runs); empty for other executors."""
        auto = self._executors.get(AUTO)
        return list(auto.choices().values()) if isinstance(auto, AutoExecutor) else []

    def close(self) -> None:
        """Stop the pool's threads or processes. It is safe to call this several times.
        In a forked child (a DataLoader worker holding a copy of this pool) it only
        forgets them: the workers are the parent's."""
        with self._lock:
            self._closed = True
            executors, self._executors = self._executors, {}
        if os.getpid() != self._pid:
            return
        for ex in executors.values():
            ex.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<prep.Pool executor={self.executor!r} workers={self.workers} "
            f"device={str(self.device) if self.device else None!r} "
            f"timeout={self.timeout} {state}>"
        )
