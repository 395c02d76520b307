"""What prep keeps: things a pool makes by name on first use and keeps until it
closes (its executors, ``_warm``), and tables that keep their newest entries
(:func:`keep_newest`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .errors import ConfigError

__all__ = ["Kept", "keep_newest"]


def keep_newest(table: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """``table[key] = value``, as its newest entry (a dict keeps insertion order), and
    the oldest entries dropped past ``limit``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]


class _Closes(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=_Closes)


class Kept(Generic[T]):
    """``make(name)`` once per name, kept; all of them closed by :meth:`close`."""

    def __init__(self, make: Callable[[str], T]) -> None:
        self._make = make
        self._kept: dict[str, T] = {}
        self._lock = threading.RLock()  # reentrant: making one may ask for another
        self.closed = False

    def get(self, name: str) -> T:
        """The one of ``name`` (a ConfigError once closed)."""
        with self._lock:
            if self.closed:
                raise ConfigError("the pool is closed; create a new prep.Pool")
            made = self._kept.get(name)
            if made is None:
                made = self._kept[name] = self._make(name)
            return made

    def made(self) -> list[T]:
        """Those made so far."""
        with self._lock:
            return list(self._kept.values())

    def close(self) -> None:
        """Close every one made here. It is safe to call this several times."""
        with self._lock:
            self.closed = True
            made, self._kept = self._kept, {}
        for one in made.values():
            one.close()
