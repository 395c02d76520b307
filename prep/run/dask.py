"""Shards as tasks on a Dask distributed cluster (the optional ``prep[dask]`` extra).

Each :class:`~prep.run.task.ShardTask` is submitted as ``run_shard(task)``; the
worker reads the input and writes the output itself, so every worker must see
the input and output paths as the driver does (a shared filesystem: NFS, a
cluster filesystem, or one machine). The entry comes back to the driver, which
alone appends to the manifest. Workers must be able to import prep and the
``--fn`` module.

A scheduler that dies ends the run at once, not after Dask's 15 s of reconnecting:
the client cancels every future in flight with the reason
``"scheduler-connection-lost"``; the first such callback (an event, not a poll) puts
:class:`ClusterLost` on the driver's done queue, and the driver raises it. The
shards in flight get no manifest line, so ``--resume`` redoes them; the client is
closed without asking the dead scheduler for anything (``prep run`` exits 1 with
one line naming the address).
"""

from __future__ import annotations

import logging
import queue
import shutil
import tempfile
from typing import Any

import torch

from ..errors import ClusterLost, ConfigError
from ..executors import available_cores, threads_per_worker
from .task import ShardTask, run_shard

__all__ = ["LOCAL_WORKERS", "DaskBackend"]

INSTALL = "pip install 'prep[dask]'"
#: worker processes of ``--cluster local`` when --jobs is not given: a few, to
#: leave memory for their shards (each worker holds one shard at a time)
LOCAL_WORKERS = 4


#: why a future was cancelled when its client lost the scheduler (distributed's words)
LOST = "scheduler-connection-lost"
#: seconds given to closing a client whose scheduler is gone (it asks nothing of it)
_CLOSE_LOST = 2
#: the logger whose INFO is a traceback when the scheduler's connection closes, which
#: the run says in one line of its own: muted to warnings while the backend lives
_COMMS = "distributed.batched"


def _mute(names: list[str], level: int) -> dict[str, int]:
    """Raise each logger in ``names`` to ``level``; returns their levels before."""
    before = {}
    for name in names:
        logger = logging.getLogger(name)
        before[name] = logger.level
        logger.setLevel(max(level, logger.level))
    return before


class DaskBackend:
    """Runs tasks on the scheduler at ``address``, or on a fresh ``LocalCluster`` for "local"."""

    def __init__(self, address: str, jobs: int | None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError(
                f"--cluster needs Dask distributed, an optional extra that is not installed; "
                f"install it with: {INSTALL}"
            ) from None
        self._cluster: Any = None
        self._scratch: str | None = None
        if address == "local":
            n = jobs or min(available_cores(), LOCAL_WORKERS)
            # the workers' scratch folder is ours, removed on close: by default Dask
            # leaves a dask-scratch-space folder in the temp folder behind
            self._scratch = tempfile.mkdtemp(prefix="prep-dask-")
            import dask.config

            # the scheduler here and the workers (local_directory) both make their
            # scratch folders in it
            with dask.config.set({"temporary-directory": self._scratch}):
                self._cluster = LocalCluster(
                    n_workers=n,
                    processes=True,
                    threads_per_worker=1,
                    dashboard_address=None,
                    local_directory=self._scratch,
                )
            self.client: Any = Client(self._cluster)
            # n workers x torch's default (all cores) would oversubscribe the machine
            self.client.run(torch.set_num_threads, threads_per_worker(n))
        else:
            try:
                self.client = Client(address, timeout=15)
            except (OSError, TimeoutError) as exc:
                raise ConfigError(
                    f"cannot reach a Dask scheduler at --cluster {address!r} ({exc}); pass "
                    f"tcp://HOST:PORT of a running scheduler, or 'local'"
                ) from None
        self.slots = jobs or max(1, sum(self.client.nthreads().values()))
        self.per_call = 1
        self.address = address if address != "local" else str(self.client.scheduler.address)
        self._futures: list[Any] = []
        self.lost = False  # set by the first future cancelled for a lost scheduler
        #: Dask's loggers' levels before this backend muted them (put back by close)
        self._muted = _mute([_COMMS], logging.WARNING)

    def submit(self, tasks: list[ShardTask], done: queue.SimpleQueue[Any]) -> None:
        (task,) = tasks  # one a call (per_call)
        if self.lost or self.client.status not in ("running", "newly-created"):
            done.put((task, self._lost()))
            return

        def finished(future: Any) -> None:  # runs in a Dask client thread
            try:
                outcome: Any = future.result()
            except BaseException as exc:  # the worker's exception, rebuilt here
                outcome = exc
                if getattr(exc, "reason", None) == LOST or self.client.status != "running":
                    outcome = self._lost()
            done.put((task, outcome))

        future = self.client.submit(run_shard, task, pure=False)
        self._futures = [f for f in self._futures if not f.done()]
        self._futures.append(future)
        future.add_done_callback(finished)

    def _lost(self) -> ClusterLost:
        if not self.lost:
            self.lost = True
            # the client's reconnecting, and its end when closed, would log tracebacks and
            # "failed to reconnect after 15 s" under the run's one line: muted until closed
            loggers = [
                n for n in logging.root.manager.loggerDict if n.split(".")[0] == "distributed"
            ]
            for name, level in _mute(loggers, logging.CRITICAL).items():
                self._muted.setdefault(name, level)  # the level before any muting
        return ClusterLost(
            f"lost the Dask scheduler at --cluster {self.address} in the middle of the run; "
            f"the shards in flight are not recorded: once a scheduler runs there, rerun with "
            f"--resume to finish"
        )

    def abandon(self) -> None:
        """Cancel the tasks in flight; a cluster we started is shut down with them.

        A task already running on an external cluster may still finish and
        write its output; without a manifest entry, ``--resume`` redoes it.
        With the scheduler lost there is nothing to cancel: the client only closes.
        """
        try:
            if not self.lost:
                self.client.cancel(self._futures, force=True)
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.client.close(timeout=_CLOSE_LOST if self.lost else None)
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        finally:
            for name, level in self._muted.items():
                logging.getLogger(name).setLevel(level)
            self._muted.clear()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
