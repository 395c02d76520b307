"""Importing ``module:name`` given on the command line, with errors that say what to fix."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

__all__ = ["load_callable"]


def load_callable(spec: str, flag: str = "--fn") -> Callable[..., Any]:
    """Import ``module:attribute`` (the attribute may be dotted), as ``flag`` asked for it."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{flag} {spec!r} is not MODULE:NAME; e.g. {flag} mypkg.rows:clean_row")
    # `prep bench --fn mymodule:f` should find mymodule.py in the folder it runs from
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{flag} {spec!r}: cannot import module {module!r} ({exc}); is it installed, "
            f"or in the current folder?"
        ) from exc
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{flag} {spec!r}: module {module!r} has no {name!r}") from None
    if not callable(obj):
        raise ConfigError(f"{flag} {spec!r} is a {type(obj).__name__}, expected a function")
    return obj
