"""Each variant's first call, checked against serial's; later calls that raise, recorded.

A variant fails (a finding, not a crash) when it raises or when its result
differs from the serial executor's; see :func:`check` and :class:`Guard`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core.output import flatten
from ..errors import VmapUnsupported

#: refusals that are expected, not findings: a cell with one is skipped, with the reason
EXPECTED = (VmapUnsupported,)

__all__ = ["Guard", "check", "leaves", "status_of", "text"]


def check(
    call: Callable[[], Any], reference: Any, rows: int, timed: list[float] | None = None
) -> str:
    """Call once; the error text if it raised or its result differs from serial's, else ''.
    The call's own seconds (not the comparison's) are appended to ``timed``."""
    try:
        t0 = time.perf_counter()
        result = call()
        if timed is not None:
            timed.append(time.perf_counter() - t0)
    except Exception as exc:
        return text(exc)
    if reference is None:
        return ""
    got, want = leaves(result), leaves(reference)
    if len(got) != len(want) or not all(_same(g, w[:rows]) for g, w in zip(got, want)):
        return "its result differs from the serial executor's"
    return ""


class Guard:
    """A variant that records its first exception instead of raising it mid-timing."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.error = ""

    def __call__(self) -> None:
        if self.error:
            return
        try:
            self.call()
        except Exception as exc:
            self.error = text(exc)


def leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a Tensor, tuple or dict (a dict's in key order, so two dicts with
    the same keys line up); none for anything else."""
    if isinstance(value, Mapping):
        value = {k: value[k] for k in sorted(value)}
    try:
        return flatten(value)[1]
    except TypeError:
        return []


def status_of(error: str, expected: tuple[type[Exception], ...] = EXPECTED) -> str:
    """A variant's cell status for the error text :func:`check` gave: ``skipped`` where
    prep refused what it is known not to do (one of ``expected``: vmap of a function that
    reads values), with the reason; ``failed`` for anything else (a finding)."""
    refused = any(error.startswith(f"{cls.__name__}:") for cls in expected)
    return "skipped" if refused else "failed"


def text(exc: BaseException) -> str:
    """An exception as a cell's note: its type and message."""
    return f"{type(exc).__name__}: {exc}".strip()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        # intra-op thread counts differ between executors, so sums may round differently
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)
    return torch.equal(a, b)
