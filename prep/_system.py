"""What this machine offers prep: cores, threads per worker, /dev/shm, CUDA."""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from ._version import __version__
from .executors import PROCESS_THREADS, available_cores, start_method, threads_per_worker
from .executors.processes import shm_free


def info(workers: int | None = None) -> dict[str, Any]:
    """Facts that decide which executor can win here, as a dict.

    ``threads_per_process`` is what each worker process of a pool (``processes``,
    ``joblib``) sets for torch's intra-op pool and OMP/MKL/OpenBLAS: one, whatever
    the worker count, as the caller runs torch beside them. ``threads_per_worker`` is
    what each thread of a ``threads`` pool of ``workers`` sets for itself (and each of
    ``prep run``'s shard workers), so that workers x threads never exceeds the cores.
    """
    cores = available_cores()
    workers = workers or cores
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    cuda = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "prep": _version(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "python": platform.python_version(),
        "gil_enabled": gil,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "start_method": start_method(),
        "workers": workers,
        "threads_per_worker": threads_per_worker(workers),
        "threads_per_process": PROCESS_THREADS,
        "shm_free_bytes": shm_free(),
        "cuda_devices": cuda,
    }


def _version() -> str:
    return __version__
