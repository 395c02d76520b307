"""How ``prep run`` finds ``--fn`` and ``--setup``, and what their signatures ask of a shard.

``--fn`` is ``MODULE:FUNCTION`` (importable, or a module in the current folder) or
``PATH/TO/FILE.py:FUNCTION``: the file's folder goes on ``sys.path`` and the file is
imported by its name, so that worker processes (which get this ``sys.path``) import
the same module by name.

A row of a dict shard calls ``fn(**columns, **args)`` (``state=`` too with ``--setup``).
When that call cannot bind, :func:`call_mismatch` says whose fault it is::

    the function takes state=, no --setup     -> ConfigError naming --setup
    an --arg the function does not take       -> ConfigError naming --arg
    a required argument no column gives        -> ShardError naming the file and column
    a column the function does not take        -> ShardError naming the file and --columns

so a shard that lacks a column fails alone, as a file problem (exit code 1, the
file named), and a setting that cannot work on any shard stops the run (exit 2).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._imports import load_callable
from ..core.checks import call_problem
from ..errors import ConfigError, PrepError, ShardError

__all__ = ["call_mismatch", "load_fn", "no_setup"]


def load_fn(spec: str, flag: str = "--fn") -> Callable[..., Any]:
    """Import ``module:function`` or ``path/to/file.py:function`` for ``flag``: a ``.py``
    path's folder is put on ``sys.path`` (once) and the file is imported by its module
    name."""
    module, sep, name = spec.partition(":")
    if not sep or not (module.endswith(".py") or "/" in module or os.sep in module):
        return load_callable(spec, flag)
    path = Path(module)
    example = f"{flag} {path.stem if path.suffix == '.py' else 'mymodule'}:{name or 'fn'}"
    if path.suffix != ".py" or not path.is_file():
        what = "is not a .py file" if path.is_file() else "does not exist"
        raise ConfigError(
            f"{flag} {spec!r}: {module!r} {what} (looked in {os.getcwd()}); "
            f"give the path of a Python file, e.g. {flag} ./rows.py:{name or 'fn'}, or a "
            f"module name without .py, e.g. {example}"
        )
    if not path.stem.isidentifier():
        raise ConfigError(
            f"{flag} {spec!r}: the file name {path.name!r} cannot be imported as a module; "
            f"rename it to letters, digits and underscores, e.g. rows.py"
        )
    known = sys.modules.get(path.stem)
    where = getattr(known, "__file__", None)
    if where is not None and Path(where).resolve() != path.resolve():
        raise ConfigError(
            f"{flag} {spec!r}: a module named {path.stem!r} is already imported from {where}, "
            f"so {path} would not be the one run; rename the file"
        )
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return load_callable(f"{path.stem}:{name}", flag)


def no_setup(spec: str) -> ConfigError:
    """The error for ``--fn`` that takes ``state=`` where no ``--setup`` gives it."""
    return ConfigError(
        f"--fn {spec} takes per-worker state as state=, and no --setup gives it; pass "
        f"--setup MODULE:FUNCTION, a function that builds the state (called once in each "
        f"worker)"
    )


def call_mismatch(
    fn: Callable[..., Any],
    spec: str,
    names: Sequence[str],
    given: Mapping[str, Any],
    setup: str | None,
    path: Path | None = None,
) -> PrepError | None:
    """The error for a row call ``fn(**names, **given)`` that cannot bind, or None
    (see the module docstring); ``path`` is the shard the names are from."""
    problem = call_problem(fn, 0, names, **given)
    if problem is None:  # it binds, or its signature is unknown
        return None
    params = inspect.signature(fn).parameters
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [
        p.name
        for p in params.values()
        if p.kind in keyword and p.default is p.empty and p.name not in names
        and p.name not in given
    ]  # fmt: skip
    if "state" in missing and not setup:
        return no_setup(spec)
    unknown = [k for k in given if k not in params and k != "state" and not takes_any]
    if unknown:
        return ConfigError(
            f"--fn {spec} has no parameter {', '.join(map(repr, unknown))}; drop "
            f"--arg {unknown[0]}=..., or pass one of its parameters: {', '.join(params)}"
        )
    where = f"{path}: " if path is not None else ""
    has = ", ".join(map(repr, names)) or "no columns"
    if missing:
        cols = ", ".join(map(repr, missing))
        return ShardError(
            f"{where}has no column {cols}, which --fn {spec} takes (the shard has {has}); "
            f"add it to the shard, or give the function a value with --arg {missing[0]}=VALUE"
        )
    extra = [c for c in names if c not in params and not takes_any]
    if extra:
        return ShardError(
            f"{where}has a column {', '.join(map(repr, extra))} that --fn {spec} does not "
            f"take (it takes {', '.join(params)}); name the columns to pass, in its order, "
            f"with --columns"
        )
    return ConfigError(
        f"--fn {spec} cannot be called as prep run calls it on a row of {has}: {problem}; "
        f"pass its other arguments with --arg NAME=VALUE, and choose the row's tensors with "
        f"--columns"
    )
