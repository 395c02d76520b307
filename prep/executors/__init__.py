"""The executor registry: a name -> class table, never an if/elif on names."""

from __future__ import annotations

from ..errors import ConfigError
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

# auto measures the executors above and runs one of them; it imports this package's
# modules, so it is registered last
from ..auto import AutoExecutor  # noqa: E402

REGISTRY[AutoExecutor.name] = AutoExecutor


def executor_class(name: str) -> type[Executor]:
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        choices = ", ".join(repr(n) for n in REGISTRY)
        raise ConfigError(f"executor={name!r} is not one of {choices}") from None


__all__ = [
    "REGISTRY",
    "Executor",
    "Job",
    "available_cores",
    "executor_class",
    "in_worker_process",
    "resolve_workers",
    "threads_per_worker",
]
