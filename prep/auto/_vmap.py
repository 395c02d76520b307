"""The two checks auto makes on ``torch.func.vmap`` of a row function: that it runs
without torch's slow fallback, and that it reproduces serial's rows bit for bit."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .._structure import Output


def same_rows(spec: Any, leaves: list[torch.Tensor], ref: Output, k: int) -> bool:
    """Whether a batched form's first ``k`` rows (``spec``, ``leaves``) equal the
    rows serial wrote into ``ref``, bit for bit, in structure, shape and dtype."""
    return spec == ref.spec and all(
        leaf.shape == buf[:k].shape and leaf.dtype == buf.dtype and torch.equal(leaf, buf[:k])
        for leaf, buf in zip(leaves, ref.buffers)
    )


def why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:80] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_fallback_lock = threading.Lock()


@contextlib.contextmanager
def no_vmap_fallback() -> Iterator[None]:
    """vmap's slow path (a loop over the rows for ops without a batching rule) raises
    instead, for the bit-for-bit check. torch's switch is process-wide: one check at
    a time, and the previous setting is restored."""
    functorch = getattr(torch._C, "_functorch", None)
    enabled = getattr(functorch, "_is_vmap_fallback_enabled", None)
    switch = getattr(functorch, "_set_vmap_fallback_enabled", None)
    if enabled is None or switch is None:  # another torch: the timing shows a slow vmap
        yield
        return
    with _fallback_lock:
        before = enabled()
        switch(False)
        try:
            yield
        finally:
            switch(before)
