"""``map_rows``, ``map_samples`` and ``Pool``: the public face of the executors.

Data flows one way::

    batch ──rows_of──▶ Rows ──executor.run──▶ Output (CPU, pinned if bound for CUDA)
                                                  │
                       out= (given) ◀──copy_──────┤ (only when out= lives elsewhere)
                       result ◀──.to(device, non_blocking)──┘
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._rowwise import twin_of
from ._structure import Output, Result, Rows, SampleRows, TensorRows, rows_of
from .auto import Auto, Calibration, Calibrator
from .errors import ConfigError
from .executors import REGISTRY, Executor, Job, executor_class, resolve_workers

AUTO = "auto"

_warm: dict[tuple[str, int], Executor] = {}
_warm_lock = threading.Lock()
_warned_fallback = False


def in_worker_process() -> bool:
    """True inside a DataLoader worker or any daemonic process (which cannot have children)."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None or multiprocessing.current_process().daemon


def _choose(executor: str, fn: Callable[..., Any], rows: Rows) -> str:
    """The executor to use for this call (``auto`` and nested-pool fallbacks resolved)."""
    global _warned_fallback
    name = executor
    if name == AUTO and len(rows) == 0:  # nothing to measure: the twin if any
        name = "vectorized" if isinstance(rows, TensorRows) and twin_of(fn) else "serial"
    if name in ("processes", "joblib") and in_worker_process():
        if not _warned_fallback:
            _warned_fallback = True
            warnings.warn(
                f"executor={name!r} cannot start a process pool inside a DataLoader "
                f"worker (daemonic processes may not have children); using "
                f"'threads' in this worker instead",
                RuntimeWarning,
                stacklevel=5,  # the caller of map_rows / Pool.map_rows
            )
        name = "threads"
    return name


def _check_name(executor: str) -> str:
    if executor != AUTO:
        executor_class(executor)
    return executor


def _device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device={device!r} is not a torch device ({exc}); pass e.g. 'cpu', 'cuda' or 'cuda:1'"
        ) from None


def _warm_executor(name: str, workers: int | None) -> Executor:
    key = (name, resolve_workers(workers) if REGISTRY[name].per_row else 1)
    with _warm_lock:
        ex = _warm.get(key)
        if ex is None:
            ex = _warm[key] = REGISTRY[name](workers)
        return ex


def shutdown() -> None:
    """Close the warm pools that ``map_rows`` keeps between calls (also run at exit)."""
    with _warm_lock:
        pools = list(_warm.values())
        _warm.clear()
        _autos.clear()
    for ex in pools:
        ex.close()


atexit.register(shutdown)


def _forget_inherited_pools() -> None:
    # a forked child (a DataLoader worker, say) inherits the parent's pool objects, whose
    # threads and processes it does not have: it must start its own
    global _warm_lock
    _warm.clear()
    _autos.clear()
    _warm_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited_pools)


def _batch_device(rows: Rows) -> torch.device:
    if isinstance(rows, TensorRows):
        return rows.columns[0].device
    return torch.device("cpu")


def _run(
    ex: Executor | Callable[[Job], Output],
    fn: Callable[..., Any],
    rows: Rows,
    *,
    out: Any,
    device: torch.device | None,
    timeout: float | None,
) -> Result:
    n = len(rows)
    given = Output.given(out, n) if out is not None else None
    if n == 0:
        if given is not None:
            return given.result()
        if not isinstance(ex, Executor) or ex.per_row:
            raise ValueError(
                "the batch has 0 rows, so no row result shows the output's shape; "
                "pass out= (a preallocated result with 0 rows), or give the "
                "function a batched twin with @prep.rowwise"
            )
    home = _batch_device(rows)
    bound_for_cuda = device is not None and device.type == "cuda" and home.type == "cpu"
    staging = given
    if given is not None and any(b.device != home for b in given.buffers):
        staging = given.like(pin=bound_for_cuda) if home.type == "cpu" else None
        if staging is None:
            raise ConfigError(
                f"out= lives on {given.buffers[0].device} but the batch on {home}; move one of them"
            )
    job = Job(fn, rows, staging, timeout, pin=bound_for_cuda)
    result = ex.run(job) if isinstance(ex, Executor) else ex(job)
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


def _execute(
    executor: str,
    fn: Callable[..., Any],
    rows: Rows,
    *,
    get: Callable[[str], Executor],
    auto: Auto,
    workers: int,
    out: Any,
    device: torch.device | None,
    timeout: float | None,
) -> Result:
    name = _choose(executor, fn, rows)
    if name != AUTO:
        return _run(get(name), fn, rows, out=out, device=device, timeout=timeout)
    allow = not in_worker_process()

    def calibrated(job: Job) -> Output:
        return auto.run(job, get, workers, device, allow)[0]

    return _run(calibrated, fn, rows, out=out, device=device, timeout=timeout)


_autos: dict[int, Auto] = {}


def _module_auto(workers: int) -> Auto:
    with _warm_lock:
        return _autos.setdefault(workers, Auto())


def _module_call(
    executor: str, fn: Callable[..., Any], rows: Rows, workers: int | None, **kw: Any
) -> Result:
    n_workers = resolve_workers(workers)
    return _execute(
        _check_name(executor),
        fn,
        rows,
        get=lambda name: _warm_executor(name, n_workers),
        auto=_module_auto(n_workers),
        workers=n_workers,
        **kw,
    )


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
        executor, fn, rows_of(batch), workers, out=out, device=_device(device), timeout=timeout
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
        device=_device(device),
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
    return Calibrator(job, get, n_workers, not in_worker_process(), prestart=False).run()


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
        self.device = _device(device)
        self.timeout = timeout
        self._executors: dict[str, Executor] = {}
        self._auto = Auto()
        self._closed = False

    def _get(self, name: str) -> Executor:
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
        return _execute(
            self.executor,
            fn,
            rows,
            get=self._get,
            auto=self._auto,
            workers=self.workers,
            out=out,
            device=self.device,
            timeout=self.timeout,
        )

    def explain(self) -> str:
        """What ``auto`` measured and chose for each signature this pool has seen."""
        return "\n\n".join(str(c) for c in self._auto.choices().values()) or "nothing yet"

    def close(self) -> None:
        """Stop the pool's threads or processes. It is safe to call this several times."""
        self._closed = True
        executors, self._executors = self._executors, {}
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
