"""A row function's identity across interpreters: its name, a digest of its code, and
stable stand-ins for the values bound to it (``functools.partial`` arguments, closure
cells, defaults). Two objects with one identity compute the same thing; a function
bound to a value without a stable stand-in (a lock, a model object) has none.

:func:`key` is the function's key within this process: its identity where it has
one, else the ids of the function and what is bound to it. Every place that asks
"is this the function I saw?" asks it: auto's choices
(:func:`prep.auto.calibration.signature`), the checks of :mod:`prep.core.trust` (a fresh
``functools.partial`` or lambda each batch is still the function already checked);
auto's wisdom keys its files by :func:`identity` alone, as ids mean nothing in
another interpreter.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from .._kept import keep_newest
from .rowwise import unwrap_partial

__all__ = ["identity", "key"]

#: how deep bound arguments are followed into functions and containers
DEPTH = 4
#: functions whose key is kept by id (each kept alive, so that its id is not reused)
KEEP = 256

_keys: dict[int, tuple[Any, Any]] = {}
_lock = threading.Lock()


def _code(code: types.CodeType) -> str:
    """A digest of what a code object does (not where it sits in its file)."""
    h = hashlib.sha256(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_argcount, code.co_flags)).encode())
    for const in code.co_consts:
        h.update(_code(const).encode() if isinstance(const, types.CodeType) else _const(const))
    return h.hexdigest()


def _const(value: Any) -> bytes:
    if isinstance(value, frozenset):  # its repr's order follows the salted str hash
        return repr(sorted(map(repr, value))).encode()
    return repr(value).encode()


def _value(v: Any, depth: int) -> Any:
    """A stable stand-in for a value bound to the function; None where there is none."""
    if depth > DEPTH:
        return None
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    if isinstance(v, torch.Tensor):  # the figures depend on shapes, not values
        return f"tensor{tuple(v.shape)}{v.dtype}{v.device.type}"
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if isinstance(v, (tuple, list)):
        items = [_value(x, depth + 1) for x in v]
        return None if None in items else [type(v).__name__, *items]
    if isinstance(v, dict):
        pairs = [(str(k), _value(x, depth + 1)) for k, x in v.items()]
        return None if any(x is None for _, x in pairs) else ["dict", *sorted(pairs)]
    if isinstance(v, types.ModuleType):
        return f"module {v.__name__}"
    if isinstance(v, type):
        return f"type {v.__module__}.{v.__qualname__}"
    if callable(v):
        return identity(v, depth + 1)
    return None


def identity(fn: Callable[..., Any], depth: int = 0) -> Any:
    """The function's identity across interpreters: name, code digest and bound
    values; None where something bound to it has no stable stand-in."""
    inner = getattr(fn, "fn", None)
    store = getattr(fn, "store", None)
    if inner is not None and store is not None:  # a function given state= by setup=
        setup = getattr(store, "setup", None)
        parts = [identity(inner, depth + 1), identity(setup, depth + 1) if setup else None]
        return None if None in parts else ["with setup", *parts]
    base, args, kwargs = _unwrap(fn)
    bound = [_value(a, depth + 1) for a in args]
    bound += [_value({k: v}, depth + 1) for k, v in sorted(kwargs.items())]
    name = f"{getattr(base, '__module__', None)}.{getattr(base, '__qualname__', None)}"
    code = getattr(base, "__code__", None)
    if code is None:  # a builtin (torch.neg) is its name; a callable object is not known
        return ["builtin", name, *bound] if isinstance(base, types.BuiltinFunctionType) else None
    cells = [_value(c.cell_contents, depth + 1) for c in getattr(base, "__closure__", None) or ()]
    defaults = _value(list(getattr(base, "__defaults__", None) or ()), depth + 1)
    kwdefaults = _value(dict(getattr(base, "__kwdefaults__", None) or {}), depth + 1)
    parts = [name, _code(code), *bound, *cells, defaults, kwdefaults]
    return None if None in parts else parts


def key(fn: Callable[..., Any]) -> Any:
    """``fn``'s key within this process: its :func:`identity` where it has one (so a
    fresh lambda or partial of the same code and values is the same function), else
    the ids of the function and what is bound to it. Kept by id for the next call
    (the function kept alive with it, so that no other object takes its id)."""
    with _lock:
        hit = _keys.get(id(fn))
        if hit is not None and hit[0] is fn:
            return hit[1]
    who = identity(fn)
    made = ("identity", json.dumps(who)) if who is not None else ("ids", _ids(fn))
    with _lock:
        keep_newest(_keys, id(fn), (fn, made), KEEP)
    return made


def _unwrap(fn: Callable[..., Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``fn`` without its partials (:func:`unwrap_partial`), and a method without its
    object, which is bound to it as an argument is (``obj.method`` is a new object at
    every access)."""
    base, args, kwargs = unwrap_partial(fn)
    if isinstance(base, types.MethodType):
        return base.__func__, (base.__self__, *args), kwargs
    return base, args, kwargs


def _ids(fn: Callable[..., Any]) -> Any:
    base, args, kwargs = _unwrap(fn)
    return (id(base), tuple(map(_id, args)), tuple(sorted((k, _id(v)) for k, v in kwargs.items())))


def _id(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), str(v.device))
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return (type(v).__qualname__, id(v))
