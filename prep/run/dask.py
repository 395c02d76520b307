"""Shards as tasks on a Dask distributed cluster (the optional ``prep[dask]`` extra).

Each :class:`~prep.run.task.ShardTask` is submitted as ``run_shard(task)``; the
worker reads the input and writes the output itself, so every worker must see
the input and output paths as the driver does (a shared filesystem: NFS, a
cluster filesystem, or one machine). The entry comes back to the driver, which
alone appends to the manifest. Workers must be able to import prep and the
``--fn`` module.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
from typing import Any

from ..errors import ConfigError
from ..executors import available_cores, threads_per_worker
from .task import ShardTask, run_shard

INSTALL = "pip install 'prep[dask]'"
#: worker processes of ``--cluster local`` when --jobs is not given: a few, to
#: leave memory for their shards (each worker holds one shard at a time)
LOCAL_WORKERS = 4


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


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
            self.client.run(_set_threads, threads_per_worker(n))
        else:
            try:
                self.client = Client(address, timeout=15)
            except (OSError, TimeoutError) as exc:
                raise ConfigError(
                    f"cannot reach a Dask scheduler at --cluster {address!r} ({exc}); pass "
                    f"tcp://HOST:PORT of a running scheduler, or 'local'"
                ) from None
        self.slots = jobs or max(1, sum(self.client.nthreads().values()))
        self._futures: list[Any] = []

    def submit(self, task: ShardTask, done: queue.SimpleQueue[Any]) -> None:
        def finished(future: Any) -> None:  # runs in a Dask client thread
            try:
                outcome: Any = future.result()
            except BaseException as exc:  # the worker's exception, rebuilt here
                outcome = exc
            done.put((task, outcome))

        future = self.client.submit(run_shard, task, pure=False)
        self._futures = [f for f in self._futures if not f.done()]
        self._futures.append(future)
        future.add_done_callback(finished)

    def abandon(self) -> None:
        """Cancel the tasks in flight; a cluster we started is shut down with them.

        A task already running on an external cluster may still finish and
        write its output; without a manifest entry, ``--resume`` redoes it.
        """
        try:
            self.client.cancel(self._futures, force=True)
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
