"""Where a stream's loop is, to resume from: the batches handed to it, and the state of
the source (``batches``) as the producer pulled the last of them.

A prefetching stream reads ahead of the loop, so the source's own ``state_dict()``,
read when the loop saves, counts batches the loop never saw, and a resume from it
skips them silently. So the producer reads the source's state as it pulls each
batch, and that state travels with the batch; the one the loop holds is the one of
the last batch it was handed::

    producer thread                                 consumer (the training loop)
    batch k = next(source)                          takes batch k
    state k = source.state_dict()  ── with k ──▶    position: k + 1 batches, state k

A source without ``state_dict()`` (a list, a generator) has only the count, and
only its owner can skip what was handed over (``itertools.islice``).
"""

from __future__ import annotations

import copy
from typing import Any

from ..errors import ConfigError

__all__ = ["Position", "resume"]


def stateful(source: Any) -> bool:
    return callable(getattr(source, "state_dict", None))


class Position:
    """Batches handed over, counted from ``start``, and the state of ``source`` (or of
    ``iterator``, whichever has a ``state_dict()``; neither: the count alone) as the
    last of them was pulled."""

    def __init__(self, source: Any, iterator: Any, start: int = 0) -> None:
        self._source = source if stateful(source) else iterator if stateful(iterator) else None
        self.batches = start
        self.source = self.pulled()  # before any pull: where a resume starts

    def pulled(self) -> Any:
        """The source's state now (a copy: the source may change what it returned);
        None without one. Called by the producer as it pulls each batch."""
        if self._source is None:
            return None
        return copy.deepcopy(self._source.state_dict())

    def handed(self, source: Any) -> None:
        """The loop was handed a batch whose pull left the source in ``source``."""
        self.batches += 1
        self.source = source

    def state_dict(self) -> dict[str, Any]:
        """``{"batches": n}``, and ``"source"``: the source's state after its last batch
        handed over, where it has one."""
        if self._source is None:
            return {"batches": self.batches}
        return {"batches": self.batches, "source": self.source}


def resume(source: Any, state: Any) -> int:
    """Load ``state`` (a stream's ``state_dict()``) into ``source``, before it is
    iterated; the batches already handed over, from which the stream counts on."""
    if not isinstance(state, dict) or not isinstance(state.get("batches"), int):
        raise ConfigError(
            f"state={state!r:.80} is not a stream's state_dict() (a dict with 'batches' "
            f"and, for a source with its own state, 'source'); pass what "
            f"stream.state_dict() returned"
        )
    if "source" not in state:
        n = state["batches"]
        raise ConfigError(
            f"this state is a plain iterator's: only the count of batches handed over "
            f"({n}), and prep cannot move an iterator; skip them yourself and pass no "
            f"state=: pool.imap(fn, itertools.islice(batches, {n}, None))"
        )
    load = getattr(source, "load_state_dict", None)
    if not callable(load):
        raise ConfigError(
            f"state= holds the state of a source with state_dict(), but batches is a "
            f"{type(source).__name__} without load_state_dict(); pass a source of the kind "
            f"it was saved from (a StatefulDataLoader, a torchdata.nodes.Loader), not an "
            f"iterator over one"
        )
    load(state["source"])
    return state["batches"]
