"""The concrete executors, by name: a name -> class table, never an if/elif on names;
and the workers they run on, which streams and ``prep run`` submit to as well
(``ProcessBatches``, ``ThreadBatches``: ``submit -> Ticket``).

``auto``, which measures these and runs one of them, sits a layer above them; the
table of every executor a user can name, auto included, is :mod:`prep.registry`.
What this package exports is all that other packages may import of it: its
private modules are its own (``.importlinter`` holds every package to that)."""

from __future__ import annotations

from ._base import (
    PROCESS_THREADS,
    Executor,
    Traits,
    available_cores,
    copy_rows,
    in_worker_process,
    resolve_workers,
    threads_per_worker,
)
from ._batches import ProcessBatches, starts_at_once
from ._daemons import on_intra_op_threads
from ._job import BLOCK, Job
from ._messages import Chunk, Failure
from ._parts import Parts
from ._shapes import PART_WORK, Known
from ._spawn import fork_is_safe, server_running, start_costs, start_method, warm_up
from ._ticket import Call, Load, Part, Ticket, Whole, wait_any
from ._transport import describe_fn, pickle_fn, shm_fits, shm_free
from ._worker import call_error, call_failure
from ._worker import identity as noop_row
from .compiled import CompiledExecutor
from .joblib_loky import JoblibExecutor
from .processes import ProcessExecutor
from .serial import SerialExecutor
from .threads import ThreadExecutor
from .vectorized import VectorizedExecutor, VmapExecutor, vmap_of

REGISTRY: dict[str, type[Executor]] = {
    cls.name: cls
    for cls in (
        SerialExecutor,
        ThreadExecutor,
        ProcessExecutor,
        JoblibExecutor,
        VectorizedExecutor,
        VmapExecutor,
        CompiledExecutor,
    )
}


def traits_of(name: str) -> Traits:
    """The traits of the executor of that name (the defaults for a name not in the
    registry), without making one."""
    return REGISTRY[name].traits if name in REGISTRY else Traits()


__all__ = [
    "BLOCK",
    "REGISTRY",
    "Call",
    "Chunk",
    "CompiledExecutor",
    "Executor",
    "Failure",
    "Job",
    "Known",
    "Load",
    "ProcessBatches",
    "PART_WORK",
    "PROCESS_THREADS",
    "Part",
    "Parts",
    "Ticket",
    "Traits",
    "Whole",
    "available_cores",
    "call_error",
    "call_failure",
    "copy_rows",
    "describe_fn",
    "fork_is_safe",
    "in_worker_process",
    "noop_row",
    "on_intra_op_threads",
    "pickle_fn",
    "resolve_workers",
    "server_running",
    "shm_fits",
    "shm_free",
    "start_costs",
    "start_method",
    "starts_at_once",
    "threads_per_worker",
    "traits_of",
    "vmap_of",
    "wait_any",
    "warm_up",
]
