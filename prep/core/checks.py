"""Checks of the arguments users give, where they give them, with errors that say the fix."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import ConfigError


def check_timeout(timeout: Any) -> float | None:
    """``timeout`` as seconds (None: no limit); a TypeError or ValueError naming it if it
    is not a positive number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout={timeout!r} is a {type(timeout).__name__}, not a number of seconds; "
            f"pass e.g. timeout=30 (an int or float > 0), or None for no limit"
        )
    if not timeout > 0:  # NaN too
        raise ValueError(
            f"timeout={_short(timeout)} is not a positive number of seconds; pass e.g. "
            f"timeout=30, or None for no limit"
        )
    # past TIMEOUT_MAX (about 292 years) threading's waits refuse the number, and an int
    # past any float cannot even be converted: both are no limit at all
    if timeout >= threading.TIMEOUT_MAX:
        return None
    return timeout


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def check_device(device: Any) -> torch.device | None:
    """``device`` as a torch.device (None stays None); a ConfigError if torch cannot
    place tensors there on this machine."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device={device!r} is not a torch device ({exc}); pass e.g. 'cpu', 'cuda' or 'cuda:1'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                f"this torch ({torch.__version__}) is a CPU-only build"
                if torch.version.cuda is None
                else "no GPU is visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})"
            )
            raise ConfigError(
                f"device={device!r}, but torch has no CUDA here: {why}; pass device=None "
                f"(or 'cpu') to keep the result on the CPU, or run on a machine with a GPU "
                f"and a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"device={device!r}, but only {count} CUDA device(s) are visible here "
                f"(cuda:0 to cuda:{count - 1}); pass one of those"
            )
    return dev


# ---------------------------------------------------------------- the row function


def check_fn(fn: Any, data: Any, call: str, data_name: str) -> None:
    """``fn`` must be callable; a ``fn`` that is not, given a callable as ``data_name``,
    is two arguments swapped (``map_rows(batch, fn)``), and the message says so."""
    if callable(fn):
        return
    if callable(data):
        raise TypeError(
            f"{call}() got a {type(fn).__name__} first and a function second: the arguments "
            f"are swapped; call {call}(fn, {data_name}), the row function first"
        )
    kind = type(fn).__name__
    usage = f"{call}(fn, {data_name})" if data is not None else "map_rows(fn, batch)"
    raise TypeError(
        f"fn={_short(fn)} is not a function but {'an' if kind[0] in 'aeiou' else 'a'} "
        f"{kind}; the row function comes first: {usage}"
    )


def signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, or None where Python cannot tell (some builtins, C functions)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def call_problem(
    fn: Callable[..., Any], positional: int = 0, names: Sequence[str] = (), /, **given: Any
) -> str | None:
    """Why ``fn`` cannot be called with ``positional`` arguments, keywords ``names`` and
    ``given`` (torch's words, e.g. "missing a required argument: 'max_len'"), or None
    if it can (or its signature is unknown). Only names are bound: nothing runs.
    Positional-only, so that ``given`` may name ``fn`` (a user's --arg fn=...)."""
    sig = signature(fn)
    if sig is None:
        return None
    try:
        sig.bind(*[None] * positional, **dict.fromkeys(names), **given)
    except TypeError as exc:
        return str(exc)
    return None


def takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (True where its signature is unknown)."""
    sig = signature(fn)
    if sig is None:
        return True
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in sig.parameters.values()
    )


def describe_callable(fn: Any) -> str:
    """A function's name for messages: ``module.qualname``, or its repr."""
    name = getattr(fn, "__qualname__", None)
    if name is None:
        return repr(fn)
    return f"{getattr(fn, '__module__', None) or '?'}.{name}"


def check_row_call(
    fn: Callable[..., Any], rows: Any, state: bool = False, rng: bool = False
) -> None:
    """A TypeError, before any row runs, where ``fn`` cannot take a row of ``rows`` as
    it will be called: ``fn(*columns)``, ``fn(**columns)`` of a dict batch, or
    ``fn(sample)`` (and ``state=`` with ``setup=``, ``rng=`` with ``seed=``). Every row
    would fail alike."""
    positional, names = rows.arguments()
    try:
        problem = _row_call_problem(fn, positional, names, state, rng)
    except TypeError:  # an unhashable callable: checked without the cache
        problem = _row_call_problem.__wrapped__(fn, positional, names, state, rng)
    if problem is None:
        return
    call = ", ".join(["row"] * positional + [f"{k}=..." for k in names])
    raise TypeError(
        f"the row function {describe_callable(fn)} cannot take this batch's rows, each "
        f"called as fn({call}): {problem}; give it one parameter per column (by the "
        f"dict's names for a dict batch), or bind the others with functools.partial"
    )


@functools.lru_cache(maxsize=256)
def _row_call_problem(
    fn: Callable[..., Any], positional: int, names: tuple[str, ...], state: bool, rng: bool
) -> str | None:
    # cached: a signature costs 3-10 us, and a stream calls with the same function and
    # batch layout every batch
    given = {**({"state": None} if state else {}), **({"rng": None} if rng else {})}
    return call_problem(fn, positional, names, **given)
