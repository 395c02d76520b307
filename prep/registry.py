"""Every executor a user can name: the concrete ones (:mod:`prep.executors`) and
``auto``, which measures them and runs one. auto sits a layer above the executors
it measures, so the whole table is made here, above both.

Two tables, both by name, so that no caller branches on a name: :data:`EXECUTORS`,
the classes (``prep.EXECUTORS``), and the way a pool makes each one, given the
pool's other warm executors (auto shares them: a pool that runs ``auto`` and then
``processes`` starts one process pool, not two)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .auto import AutoExecutor
from .errors import ConfigError
from .executors import REGISTRY as CONCRETE
from .executors import Executor

#: the default executor's name: the one that measures the others and picks
AUTO = AutoExecutor.name
#: what runs instead, inside a DataLoader worker (a daemonic process may not have
#: children), of an executor that needs processes
IN_WORKERS = "threads"

#: the executor of a name, as a pool holds it warm
ExecutorOf = Callable[[str], Executor]

#: name -> executor class, ``auto`` last (read-only: ``prep.EXECUTORS``)
EXECUTORS: Mapping[str, type[Executor]] = MappingProxyType(
    {**CONCRETE, AutoExecutor.name: AutoExecutor}
)


def _concrete(cls: type[Executor]) -> Callable[[int, ExecutorOf], Executor]:
    return lambda workers, warm: cls(workers)


def _auto(workers: int, warm: ExecutorOf) -> Executor:
    return AutoExecutor(workers, executors=warm)


#: name -> how a pool makes that executor
_MAKERS: dict[str, Callable[[int, ExecutorOf], Executor]] = {
    **{name: _concrete(cls) for name, cls in CONCRETE.items()},
    AutoExecutor.name: _auto,
}


def executor_class(name: str) -> type[Executor]:
    """The class of the executor named ``name``; a ConfigError naming the choices."""
    try:
        return EXECUTORS[name]
    except (KeyError, TypeError):
        choices = ", ".join(repr(n) for n in EXECUTORS)
        raise ConfigError(f"executor={name!r} is not one of {choices}") from None


def make(name: str, workers: int, warm: ExecutorOf) -> Executor:
    """A new executor named ``name`` of ``workers`` workers; ``warm`` gives the pool's
    executor of another name (auto measures and runs those): a name the caller resolved
    (``executor_class``)."""
    return _MAKERS[name](workers, warm)


__all__ = ["AUTO", "EXECUTORS", "IN_WORKERS", "executor_class", "in_caller", "make"]


def in_caller() -> tuple[str, ...]:
    """The executors that run every row in the calling thread (``Executor.traits.in_caller``)."""
    return tuple(name for name, cls in EXECUTORS.items() if cls.traits.in_caller)
