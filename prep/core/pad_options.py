"""``pad=`` and ``pad_to=`` as the user gives them, checked, and resolved per leaf of a
row's result (the padded output itself is ``_padding``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .output import Spec

Number = bool | int | float


@dataclass(frozen=True)
class Padding:
    """``pad=`` and ``pad_to=`` as given; :meth:`leaves` resolves them per leaf."""

    pad: Any = None  # a number, or a structure like the result's of numbers
    to: Any = None  # a shape, or a structure like the result's of shapes (None: the longest)

    def __post_init__(self) -> None:
        if not _structured(self.pad, _is_number, _is_number):
            raise TypeError(
                f"pad={self.pad!r} is not a number, nor a dict or tuple of numbers like the "
                f"row function's result; e.g. pad=0, or pad={{'ids': 1, 'mask': False}}"
            )
        if not _structured(self.to, _is_shape, lambda v: v is None or _is_shape(v)):
            raise TypeError(
                f"pad_to={self.to!r} is not a shape (a tuple of sizes >= 0), nor a dict or "
                f"tuple of shapes like the row function's result; e.g. pad_to=(3, 224, 224)"
            )

    def leaves(self, spec: Spec) -> list[tuple[Number, Any]]:
        """(pad value, fixed size or None) of each leaf of a result of structure ``spec``."""
        values = _per_leaf(self.pad, spec, "pad", scalar=_is_number)
        sizes = _per_leaf(self.to, spec, "pad_to", scalar=_is_shape)
        return list(zip(values, sizes))

    def describe(self) -> str:
        text = f"pad={self.pad!r}"
        return text + (f", pad_to={self.to!r}" if self.to is not None else "")


def _structured(given: Any, one: Callable[[Any], bool], each: Callable[[Any], bool]) -> bool:
    """Whether ``given`` is None, ``one`` value, or a dict, tuple or list of ``each``."""
    if given is None or one(given):
        return True
    values = given.values() if isinstance(given, Mapping) else given
    return isinstance(given, (Mapping, tuple, list)) and all(each(v) for v in values)


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float))


def _is_shape(v: Any) -> bool:
    return isinstance(v, (tuple, list, torch.Size)) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v
    )


def _per_leaf(given: Any, spec: Spec, name: str, scalar: Any) -> list:
    if given is None or scalar(given):
        return [None if given is None else (tuple(given) if name == "pad_to" else given)] * spec.n
    if spec.kind == "dict" and isinstance(given, Mapping):
        missing = [k for k in spec.keys if k not in given]
        if missing:
            raise ValueError(
                f"{name}={given!r} has no value for {missing}; give every key of the "
                f"row function's result {list(spec.keys)}, or one value for all"
            )
        values = [given[k] for k in spec.keys]
    elif spec.kind == "tuple" and isinstance(given, (tuple, list)) and len(given) == spec.n:
        values = list(given)
    else:
        raise ValueError(
            f"{name}={given!r} does not match the row function's result (a {spec.kind} of {spec.n} "
            f"tensors); give one value for all of them, or one per result"
        )
    return [tuple(v) if name == "pad_to" and v is not None else v for v in values]
