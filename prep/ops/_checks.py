"""The argument checks of :mod:`prep.ops.side_context`, one copy for its three forms.

The batched op, its row twin and the benchmarks' loop baseline (the repository's
``benchmarks.baselines.side_context_loop``) all check their arguments here, so a
bad argument reads the same whichever form gets it.
"""

from __future__ import annotations

import operator
from typing import Literal

import torch
from torch import Tensor

from ..core.pad_options import Number

Side = Literal["left", "right"]

__all__ = [
    "Number",
    "Side",
    "check_length",
    "check_lengths",
    "check_options",
    "check_out",
    "check_tensors",
]


def check_tensors(inputs: object, mask: object, rank: int, what: str) -> None:
    """``inputs`` is ``[B, L, *F]`` (``rank`` 2) or ``[L, *F]`` (1), ``mask`` its ``[B, L]``."""
    if not isinstance(inputs, Tensor):
        raise TypeError(f"{what} must be a Tensor, got {type(inputs).__name__}")
    if inputs.dim() < rank:
        dims = "[B, L, *F]" if rank == 2 else "[L, *F]"
        raise ValueError(
            f"{what} has shape {tuple(inputs.shape)} ({inputs.dim()} dims), "
            f"expected {dims}: at least {rank} dims"
        )
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a Tensor, got {type(mask).__name__}")
    lead = tuple(inputs.shape[:rank])
    if tuple(mask.shape) != lead:
        dims = "[B, L]" if rank == 2 else "[L]"
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected {dims} = {list(lead)} to match {what}"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(
            f"mask has dtype {mask.dtype}, expected bool or an integer dtype; "
            f"pass mask != 0 (or mask.bool())"
        )
    if mask.device != inputs.device:
        raise ValueError(
            f"mask is on {mask.device} but {what} on {inputs.device}; "
            f"move mask with .to({what}.device)"
        )


def check_options(side: object, max_len: object, pad_value: object, dtype: torch.dtype) -> int:
    """Check ``side``, ``max_len`` and ``pad_value``; return ``max_len`` as an int."""
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r} is not 'left' or 'right'")
    if isinstance(max_len, bool):
        raise TypeError(f"max_len={max_len!r} is a bool, expected an int >= 0")
    try:
        max_len = operator.index(max_len)  # type: ignore[arg-type]  # raises for a non-int
    except TypeError:
        raise TypeError(
            f"max_len={max_len!r} is a {type(max_len).__name__}, expected an int >= 0"
        ) from None
    if max_len < 0:
        raise ValueError(f"max_len={max_len} is negative, expected an int >= 0")
    if not isinstance(pad_value, (int, float, bool)):
        raise TypeError(
            f"pad_value={pad_value!r} is a {type(pad_value).__name__}, expected a Python number"
        )
    exact = not (dtype.is_floating_point or dtype.is_complex)  # an integer or bool dtype
    if exact and (pad_value != int(pad_value) or (dtype == torch.bool and pad_value not in (0, 1))):
        need = "False or True" if dtype == torch.bool else "an integer"
        raise ValueError(f"pad_value={pad_value!r} cannot be stored in {dtype} inputs; pass {need}")
    return max_len


def check_lengths(lengths: object, inputs: Tensor) -> Tensor:
    """``lengths`` as int64 ``[B]`` on the inputs' device; the range check syncs on CUDA."""
    B, L = inputs.shape[:2]
    if not isinstance(lengths, Tensor):
        raise TypeError(
            f"lengths must be a Tensor of shape [B] = [{B}] or None, got {type(lengths).__name__}"
        )
    if tuple(lengths.shape) != (B,):
        raise ValueError(
            f"lengths has shape {tuple(lengths.shape)}, expected [B] = [{B}] to match inputs"
        )
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths has dtype {lengths.dtype}, expected an integer dtype")
    if lengths.device != inputs.device:
        raise ValueError(
            f"lengths is on {lengths.device} but inputs on {inputs.device}; "
            f"move it with .to(inputs.device)"
        )
    if B and bool(((lengths < 0) | (lengths > L)).any()):
        lo, hi = int(lengths.min()), int(lengths.max())
        raise ValueError(
            f"lengths has values in [{lo}, {hi}], outside [0, L] = [0, {L}]; "
            f"each length counts the valid positions of its row"
        )
    return lengths.long()


def check_out(out: object, shape: tuple[int, ...], inputs: Tensor) -> Tensor:
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a Tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(
            f"out has shape {tuple(out.shape)}, expected [B, max_len, *F] = {list(shape)}"
        )
    if out.dtype != inputs.dtype or out.device != inputs.device:
        raise ValueError(
            f"out is {out.dtype} on {out.device}, expected {inputs.dtype} on "
            f"{inputs.device} like inputs"
        )
    if torch.is_grad_enabled() and inputs.requires_grad:
        raise ValueError(
            "out= cannot record autograd history, and inputs requires grad; "
            "call without out= to get gradients, or under torch.no_grad()"
        )
    return out


def check_length(length: object, L: int) -> int:
    """``length`` as an int in ``[0, L]`` (``L`` if None)."""
    if length is None:
        return L
    if isinstance(length, Tensor):
        if length.dim() != 0 or length.dtype.is_floating_point or length.dtype == torch.bool:
            raise ValueError(
                f"length is a {length.dtype} tensor of shape "
                f"{tuple(length.shape)}, expected a 0-d integer tensor or an int"
            )
        length = int(length)
    elif isinstance(length, bool) or not isinstance(length, int):
        raise TypeError(
            f"length={length!r} is a {type(length).__name__}, "
            f"expected an int, a 0-d integer tensor or None"
        )
    if not 0 <= length <= L:
        raise ValueError(f"length={length} is outside [0, L] = [0, {L}]")
    return length
