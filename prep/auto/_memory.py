"""auto's side of wisdom (:mod:`.wisdom`, the file): a signature's remembered
decisions taken up as if measured here, and its settled ones written back."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..executors import REGISTRY, Job
from . import wisdom
from ._decisions import Decisions
from .models import model


class Memory:
    """What an auto executor of ``workers`` workers recalls and remembers."""

    def __init__(self, workers: int, lock: threading.Lock) -> None:
        self.workers = workers
        self._lock = lock  # the auto executor's: calibrations are shared by its threads

    def key(self, job: Job) -> str | None:
        """The wisdom key of ``job``'s signature (None: wisdom is off, or the function
        has no stable identity)."""
        if wisdom.location() is None:
            return None  # wisdom off: no key to compute, nothing to remember or say
        options: Any = (job.sink.pin, repr(job.policy))
        return wisdom.key(job.fn, job.rows.layout(), len(job.rows), self.workers, options)

    def recall(self, job: Job, left_out: Mapping[str, str]) -> Decisions | None:
        """Decisions an earlier interpreter remembered for ``job``'s signature, with what
        cannot run here taken out; None when there are none."""
        wkey = self.key(job)
        entry = wisdom.recall(wkey, lambda name: name in REGISTRY)  # auto is not one of them
        if entry is None:
            return None
        d = Decisions.from_wisdom(entry, self.workers, job.policy.describe())
        d.wisdom_key = wkey
        for name in REGISTRY:  # each executor's own word
            if (reason := left_out.get(name) or model(name).ruled_out(job)) is not None:
                d.drop(name, reason)
        return d

    def remember(self, d: Decisions) -> None:
        """Write ``d``'s choice and figures for later interpreters, when they moved and
        the machine is not busy (figures taken while others use the cores would
        mislead later runs; explain says so, once)."""
        cal = d.cal
        with self._lock:
            if d.wisdom_key is None or not d.wisdom_changed():
                return
            busy = wisdom.busy()
            if busy:
                if not d.busy_noted:
                    d.busy_noted = True
                    cal.events.append(f"batch {cal.batches}: not remembered for later runs: {busy}")
                return
            entry = cal.to_wisdom()
        wisdom.remember_later(d.wisdom_key, entry)


__all__ = ["Memory"]
