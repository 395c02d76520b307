"""A batch as a stream holds it between submitting it and handing its result over: one
:class:`Delivery`, whatever ran it.

A whole batch waits on one ticket, a split one on a ticket a part, and a batch
already run in the producer's thread (or whose submission failed) on none. Its
result is made from its tickets once they are all done (``finish``: the replies
merged and written as ``map_rows`` returns them), and what that took is reported
(``taken``: the stream's plan learns from it). The tickets are the workers' own
(:class:`~prep.executors.Ticket`): a Delivery adds only the making of the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..executors import Ticket
from . import stats

__all__ = ["Delivery"]


class Delivery:
    """``wait``, ``result`` and ``cancel`` of one batch in a stream (``wait(0)``: whether
    it is done)."""

    def __init__(
        self,
        tickets: list[Ticket],
        finish: Callable[[list[Ticket]], Any],
        taken: Callable[[list[Ticket], float], None] | None = None,
    ) -> None:
        self.tickets, self._finish, self._taken = tickets, finish, taken
        self.ran_for: float | None = None  # seconds it ran in the submitting thread, if it did

    @classmethod
    def ran(cls, call: Callable[[Any], Any], batch: Any) -> Delivery:
        """``call(batch)`` run now, in this thread: its result, or its error, raised
        where the consumer takes this batch."""
        t = stats.clock()
        try:
            value = call(batch)
        except BaseException as exc:
            return cls.failed(exc)
        delivery = cls([], lambda _: value)
        delivery.ran_for = stats.clock() - t
        return delivery

    @classmethod
    def failed(cls, error: BaseException) -> Delivery:
        """A batch whose ``error`` is raised in its place in the order."""

        def throw(tickets: list[Ticket]) -> Any:
            raise error

        return cls([], throw)

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for t in self.tickets:
            if not t.wait(None if end is None else max(0.0, end - time.monotonic())):
                return False
        return True

    def result(self) -> Any:
        """The batch's result, made from its tickets (and what that took, reported)."""
        t = time.perf_counter()
        value = self._finish(self.tickets)
        if self._taken is not None:
            took = time.perf_counter() - t + sum(x.transfer for x in self.tickets)
            self._taken(self.tickets, took)
        return value

    def busy(self, workers: int) -> float:
        """Pool seconds spent on it: its thread's run time where it ran in the submitting
        thread (the pool's executor on all of it), else its workers' seconds over
        ``workers`` (0 for a worker that never said)."""
        if self.ran_for is not None:
            return self.ran_for
        return sum(t.busy or 0.0 for t in self.tickets) / max(1, workers)

    def cancel(self) -> None:
        """Nobody will take it: its tickets are cancelled, what it holds let go."""
        for t in self.tickets:
            t.cancel()
        self._finish, self._taken = (lambda tickets: None), None
