"""Every executor a user can name: the concrete ones (:mod:`prep.executors`) and
``auto``, which measures them and runs one. auto sits a layer above the executors
it measures, so the whole table is made here, above both."""

from __future__ import annotations

from .auto import AutoExecutor
from .errors import ConfigError
from .executors import REGISTRY as CONCRETE
from .executors import Executor

#: name -> executor class, ``auto`` last
EXECUTORS: dict[str, type[Executor]] = {**CONCRETE, AutoExecutor.name: AutoExecutor}


def executor_class(name: str) -> type[Executor]:
    """The class of the executor named ``name``; a ConfigError naming the choices."""
    try:
        return EXECUTORS[name]
    except (KeyError, TypeError):
        choices = ", ".join(repr(n) for n in EXECUTORS)
        raise ConfigError(f"executor={name!r} is not one of {choices}") from None


__all__ = ["EXECUTORS", "executor_class"]
