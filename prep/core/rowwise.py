"""Marking a row function with its batched (vectorized) twin."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .checks import takes_keyword

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__prep_twin__"
#: the row function's own ``atol`` (``@prep.rowwise(atol=...)``): how far its compiled
#: form may be from it
_ATOL = "__prep_atol__"


@dataclass(frozen=True)
class Twin:
    """A row function's batched form.

    ``rename`` maps a row function's keyword name to the batched function's
    (``x`` -> ``inputs``, ``length`` -> ``lengths``), used when columns are
    passed by name.
    """

    batched: Callable[..., Any]
    rename: Mapping[str, str] = field(default_factory=dict)
    #: how far the twin's values may be from the row function's (0: bit for bit)
    atol: float = 0.0


@dataclass(frozen=True)
class BoundTwin:
    """A twin with the arguments a ``functools.partial`` bound to the row function."""

    twin: Twin
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *columns: Any, **named: Any) -> Any:
        named = {self.twin.rename.get(k, k): v for k, v in named.items()}
        return self.twin.batched(*self.args, *columns, **self.kwargs, **named)

    def unknown(self, names: Sequence[str]) -> list[str]:
        """The columns, passed by these names, that the batched function has no
        parameter for (after ``rename``); none where its signature is unknown."""
        return [
            k for k in names if not takes_keyword(self.twin.batched, self.twin.rename.get(k, k))
        ]


def rowwise(
    *,
    batched: Callable[..., Any] | None = None,
    rename: Mapping[str, str] | None = None,
    atol: float = 0.0,
) -> Callable[[F], F]:
    """Mark a row function as having a batched twin, or (``atol=`` alone) as accepting
    that its compiled form differs from it by up to ``atol``.

    ``executor="vectorized"`` then calls ``batched(*columns, **kwargs)`` once
    instead of the row function once per row. A ``functools.partial`` of the
    marked function keeps its twin, with the same bound arguments.

    The twin must compute what the row function computes: ``auto`` uses it only
    after its first rows equal the row function's bit for bit (or within
    ``atol``, for a twin whose floating-point sums run in another order), and
    ``executor="vectorized"`` warns once when they differ.

    ``atol`` also holds for the row function's compiled form (``torch.compile`` of
    ``torch.func.vmap`` of it: executor ``"compiled"``), whose fused loops may
    reorder floating-point operations: ``@prep.rowwise(atol=1e-6)``, without a twin,
    says just that (``auto`` drops a compiled form whose rows differ by more).

    >>> import torch, prep
    >>> def double_all(x):
    ...     return x * 2
    >>> @prep.rowwise(batched=double_all)
    ... def double(row):
    ...     return row * 2
    >>> prep.map_rows(double, torch.ones(3, 2), executor="vectorized").tolist()
    [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
    """
    if batched is not None and not callable(batched):
        raise TypeError(f"rowwise(batched=...) needs a callable, got {batched!r}")
    if batched is None and rename:
        raise TypeError(
            "rowwise(rename=...) maps columns to the twin's parameters: give the twin "
            "too, as rowwise(batched=..., rename=...)"
        )
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0:
        raise TypeError(
            f"rowwise(atol={atol!r}) is not a number >= 0; pass the largest absolute "
            f"difference you accept between the twin's values and the row function's"
        )
    twin = Twin(batched, dict(rename or {}), float(atol)) if batched is not None else None

    def mark(fn: F) -> F:
        if twin is not None:
            setattr(fn, _ATTR, twin)
        setattr(fn, _ATOL, float(atol))
        return fn

    return mark


def unwrap_partial(
    fn: Callable[..., Any],
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """``fn`` with every ``functools.partial`` around it taken off: the function, and
    the positional and keyword arguments the partials bound (outer ones win)."""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        args = fn.args + args
        kwargs = {**fn.keywords, **kwargs}
        fn = fn.func
    return fn, args, kwargs


def twin_of(fn: Callable[..., Any]) -> BoundTwin | None:
    """The batched twin of ``fn`` (looking through ``functools.partial``), or None."""
    fn, args, kwargs = unwrap_partial(fn)
    twin = getattr(fn, _ATTR, None)
    if twin is None:
        return None
    renamed = {twin.rename.get(k, k): v for k, v in kwargs.items()}
    return BoundTwin(twin, args, renamed)


def atol_of(fn: Callable[..., Any]) -> float:
    """How far ``fn``'s compiled form may be from it (``@prep.rowwise(atol=...)``, looking
    through ``functools.partial``): 0.0, bit for bit, unless declared."""
    return float(getattr(unwrap_partial(fn)[0], _ATOL, 0.0))
