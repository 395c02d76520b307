"""The concrete executors, by name: a name -> class table, never an if/elif on names.

``auto``, which measures these and runs one of them, sits a layer above them; the
table of every executor a user can name, auto included, is :mod:`prep.registry`."""

from __future__ import annotations

from ._base import (
    Executor,
    Job,
    available_cores,
    in_worker_process,
    resolve_workers,
    threads_per_worker,
)
from .joblib_loky import JoblibExecutor
from .processes import ProcessExecutor
from .serial import SerialExecutor
from .threads import ThreadExecutor
from .vectorized import VectorizedExecutor, VmapExecutor

REGISTRY: dict[str, type[Executor]] = {
    cls.name: cls
    for cls in (
        SerialExecutor,
        ThreadExecutor,
        ProcessExecutor,
        JoblibExecutor,
        VectorizedExecutor,
        VmapExecutor,
    )
}


__all__ = [
    "REGISTRY",
    "Executor",
    "Job",
    "available_cores",
    "in_worker_process",
    "resolve_workers",
    "threads_per_worker",
]
