"""Shards in threads of this process, each thread slot with its own :class:`prep.Pool`."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

from ..pool import Pool
from .config import RunConfig
from .task import ShardTask, run_shard
from .temps import Temps

__all__ = ["LocalBackend"]


class LocalBackend:
    """``jobs`` shards at once in daemon threads, each slot with its own ``prep.Pool``."""

    def __init__(self, config: RunConfig, jobs: int) -> None:
        self.slots = jobs
        self._pools: list[Pool] = [
            Pool(config.executor, config.workers, config.device, setup=config.setup_fn())
            for _ in range(jobs)
        ]
        self._free: queue.SimpleQueue[Pool] = queue.SimpleQueue()
        for pool in self._pools:
            self._free.put(pool)
        self._cancel = threading.Event()
        self._temps = Temps()
        self._threads: list[threading.Thread] = []

    def submit(self, task: ShardTask, done: queue.SimpleQueue[Any]) -> None:
        def work() -> None:
            pool = self._free.get()
            try:
                outcome: Any = run_shard(task, pool, self._cancel, self._temps)
            except BaseException as exc:  # reported by the driver, never lost in a thread
                outcome = exc
            finally:
                self._free.put(pool)
            done.put((task, outcome))

        # daemon: a thread stuck in a long row loop must not keep an interrupted run alive
        t = threading.Thread(target=work, name=f"prep-shard:{task.source.rel}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def abandon(self, grace: float = 5.0) -> None:
        """Stop at the next step; remove temporary files; stop process workers mid-row."""
        self._cancel.set()
        self._temps.abandon()  # from here on no temp file is created or renamed into place
        for pool in self._pools:
            pool.close()
        deadline = time.monotonic() + grace
        for t in self._threads:
            # a Ctrl-C inside start() can leave one not started: nothing to wait for
            with contextlib.suppress(RuntimeError):
                t.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        for t in self._threads:
            t.join()
        for pool in self._pools:
            pool.close()
