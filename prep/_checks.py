"""Checks of the arguments users give, where they give them, with errors that say the fix."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from .errors import ConfigError


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
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(
            f"timeout={timeout!r} is not a positive number of seconds; pass e.g. "
            f"timeout=30, or None for no limit"
        )
    return None if math.isinf(timeout) else timeout


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
