"""``pad=`` and ``pad_to=`` as the user gives them, checked, and resolved per leaf of a
row's result (the padded output itself is ``_padding``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Number = bool | int | float


@dataclass(frozen=True)
class Padding:
    """``pad=`` and ``pad_to=`` as given; :meth:`leaves` resolves them per leaf."""

    pad: Any = None  # a number, or a structure like the result's of numbers
    to: Any = None  # a shape, or a structure like the result's of shapes (None: the longest)

    def __post_init__(self) -> None:
        check_pad(self.pad)
        check_pad_to(self.to)

    def leaves(self, kind: str, keys: Sequence[str], n: int) -> list[tuple[Number, Any]]:
        """(pad value, fixed size or None) of each of a result's ``n`` leaves; ``kind``
        and ``keys`` are the result's structure (tensor, tuple, dict)."""
        values = _per_leaf(self.pad, kind, keys, n, "pad", scalar=_is_number)
        sizes = _per_leaf(self.to, kind, keys, n, "pad_to", scalar=_is_shape)
        return list(zip(values, sizes))

    def describe(self) -> str:
        text = f"pad={self.pad!r}"
        return text + (f", pad_to={self.to!r}" if self.to is not None else "")


def check_pad(pad: Any) -> None:
    if pad is None or _is_number(pad):
        return
    values = pad.values() if isinstance(pad, Mapping) else pad
    if isinstance(pad, (Mapping, tuple, list)) and all(_is_number(v) for v in values):
        return
    raise TypeError(
        f"pad={pad!r} is not a number, nor a dict or tuple of numbers like the row "
        f"function's result; e.g. pad=0, or pad={{'ids': 1, 'mask': False}}"
    )


def check_pad_to(to: Any) -> None:
    if to is None or _is_shape(to):
        return
    values = to.values() if isinstance(to, Mapping) else to
    if isinstance(to, (Mapping, tuple, list)) and all(v is None or _is_shape(v) for v in values):
        return
    raise TypeError(
        f"pad_to={to!r} is not a shape (a tuple of sizes >= 0), nor a dict or tuple of "
        f"shapes like the row function's result; e.g. pad_to=(3, 224, 224)"
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float))


def _is_shape(v: Any) -> bool:
    return isinstance(v, (tuple, list, torch.Size)) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v
    )


def _per_leaf(given: Any, kind: str, keys: Sequence[str], n: int, name: str, scalar: Any) -> list:
    if given is None or scalar(given):
        return [None if given is None else (tuple(given) if name == "pad_to" else given)] * n
    if kind == "dict" and isinstance(given, Mapping):
        missing = [k for k in keys if k not in given]
        if missing:
            raise ValueError(
                f"{name}={given!r} has no value for {missing}; give every key of the "
                f"row function's result {list(keys)}, or one value for all"
            )
        values = [given[k] for k in keys]
    elif kind == "tuple" and isinstance(given, (tuple, list)) and len(given) == n:
        values = list(given)
    else:
        raise ValueError(
            f"{name}={given!r} does not match the row function's result (a {kind} of {n} "
            f"tensors); give one value for all of them, or one per result"
        )
    return [tuple(v) if name == "pad_to" and v is not None else v for v in values]
