"""``prep run --explain``: what the run will do, and why, without writing anything.

    the plan in one sentence      whole shards on workers, or rows spread out (plan.py)
    torch threads                 what prep sets in each worker, and in this process
    jobs                          shards in flight, and what holds them (processes, threads)
    each shard's rows             the executor, as asked or as auto measured it
    what was measured             per form, on the first shard

The executor a shard actually ran is in its progress line and its manifest entry
(``executor``): auto may choose differently for a later shard than for the first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._explanation import Explanation
from ..api import explain
from ..core.rows import rows_of
from ..errors import ShardError
from ..executors import PROCESS_THREADS, available_cores, threads_per_worker
from ..pool import Pool
from .config import RunConfig
from .dask import LOCAL_WORKERS
from .local import LOCAL_JOBS, check_parallel, plan_run
from .plan import ShardPlan
from .shards import find_shards, load_shard
from .task import ShardTask, shard_batch

__all__ = ["explain_cluster", "explain_run", "plan_lines"]


def explain_run(
    inputs: Sequence[Any], config: RunConfig, parallel: str = "auto", jobs: int | None = None
) -> str:
    """What ``prep run`` would do with ``inputs`` here, for ``--explain``: the plan in one
    sentence first, the threads prep sets, the jobs, then how each shard's rows run
    (``--executor`` as given, or auto's calibration on the first shard)."""
    check_parallel(config, parallel)
    shards = find_shards(inputs)
    config.check_first_shard(shards[0].path, shard_errors=True)  # as its run would say
    tasks = [ShardTask(s, Path("."), config) for s in shards]
    plan = plan_run(config, tasks, parallel)
    lines = [plan.sentence(), *plan_lines(plan, config, jobs, len(shards)), *plan.details]
    lines += [f"{shards[0].path}:", f"row options: {config.row_flags()}"]
    if plan.mode == "rows" and config.executor == "auto":
        lines.append(str(explain_first_shard(inputs, config)[1]))
    return "\n".join(lines)


def explain_cluster(
    inputs: Sequence[Any], config: RunConfig, cluster: str, jobs: int | None = None
) -> str:
    """What ``prep run --cluster`` would do: where the shards go, and how their rows run."""
    shards = find_shards(inputs)
    if cluster == "local":
        n = jobs or min(available_cores(), LOCAL_WORKERS)
        where = (
            f"cluster: a LocalCluster of {n} worker processes here, one thread each, "
            f"{threads_per_worker(n)} torch thread(s) each (cores / workers); "
            f"{jobs or n} shard(s) in flight"
        )
    else:
        flight = f"{jobs} shard(s)" if jobs else "one shard per worker thread"
        where = f"cluster: shards go to the Dask scheduler at {cluster}; {flight} in flight"
    lines = [f"{where}; {len(shards)} shard(s) to do"]
    if config.executor != "auto":
        lines.append(f"each shard's rows: {config.executor} on its Dask worker (--executor)")
    else:
        lines.append(
            "each shard's rows: auto on its Dask worker, which measures for itself; here, on "
            "the first shard:"
        )
    lines += [f"{shards[0].path}:", f"row options: {config.row_flags()}"]
    if config.executor == "auto":
        lines.append(str(explain_first_shard(inputs, config)[1]))
    return "\n".join(lines)


def plan_lines(plan: ShardPlan, config: RunConfig, jobs: int | None, shards: int) -> list[str]:
    """Under ``plan``: what prep sets for torch's intra-op threads, the shards in flight
    (``jobs``: ``--jobs``) and what holds them, and how each shard's rows run."""
    if plan.mode == "shards":
        n = jobs or 2 * plan.workers
        why = "--jobs" if jobs else "2 per worker, so each has its next shard queued"
        how = "measured" if config.executor == "auto" else "--executor"
        return [
            f"torch threads: {plan.threads} in each of the {plan.workers} worker processes "
            f"(cores / workers, so workers x threads <= cores; the DataLoader sets 1); "
            f"this process only hands out shards",
            f"jobs: {min(n, shards)} of the {shards} shard(s) in flight at once on "
            f"{plan.workers} worker processes ({n}: {why})",
            f"each shard's rows: {plan.form} in its worker process ({how})",
        ]
    if config.executor != "auto":
        rows = f"each shard's rows: {config.executor}, from this process (--executor)"
    else:
        rows = (
            "each shard's rows: auto, from this process: it measures on the first shard "
            "(below) and may choose again on a later one; each shard's progress line and "
            "manifest entry say what ran it"
        )
    return [
        f"torch threads: this process keeps its own ({torch.get_num_threads()}) for the rows; "
        f"a row executor's worker processes get {PROCESS_THREADS} each (as a DataLoader's)",
        f"jobs: {jobs or LOCAL_JOBS} shard(s) in flight, threads of this process "
        f"({'--jobs' if jobs else 'the default'}): one computes while the others load or "
        f"save; more only hold more shards in memory",
        rows,
    ]


def explain_first_shard(
    inputs: Iterable[str | os.PathLike[str]], config: RunConfig
) -> tuple[Path, Explanation]:
    """The first shard under ``inputs`` and what ``executor="auto"`` measured and chose on it.

    The function of ``config`` is calibrated on that shard's batch, as
    :func:`prep.explain` does (``prep run --explain``); nothing is written.
    ``print()`` the :class:`~prep.Explanation` for a few readable lines. With
    row-level options (``pad``, ``on_row_error``...) or ``setup`` the whole shard
    runs through an ``auto`` pool with them, and the pool's explanation is
    returned: it then describes the run as it will be.

    >>> import tempfile, prep.run
    >>> data = tempfile.mkdtemp()
    >>> _ = prep.run.make_shards(data, shards=1, rows=8, seq=6, dim=2)
    >>> config = prep.run.RunConfig("prep.ops:side_context_row", {"max_len": 3})
    >>> path, why = prep.run.explain_first_shard([data], config)
    >>> path.name, why.choice in prep.EXECUTORS
    ('shard-00000.pt', True)
    """
    config.check_rows()
    first = find_shards(inputs)[0].path  # find_shards raises ConfigError when there are none
    tensors = load_shard(first, trust_pickle=config.trust_pickle)
    batch, rows = shard_batch(tensors, config.columns, first)
    config.check_call(list(batch) if isinstance(batch, dict) else None, first)
    if rows == 0:
        raise ShardError(f"{first}: has 0 rows, so there is nothing to measure")
    fn = config.bound_fn()
    options = config.row_options().with_(device=None)
    if options.policy.plain and not config.setup:
        return first, explain(fn, batch, workers=config.workers)
    with Pool("auto", config.workers, setup=config.setup_fn()) as pool:
        pool.run(fn, rows_of(batch), options)
        return first, pool.explain()
