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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..executors import available_cores, threads_per_worker
from .config import RunConfig
from .dask import LOCAL_WORKERS
from .local import LOCAL_JOBS, check_parallel, plan_run
from .plan import ShardPlan
from .shards import find_shards
from .task import ShardTask, explain_first_shard

__all__ = ["explain_cluster", "explain_run", "jobs_line", "threads_line"]


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
    lines = [plan.sentence(), threads_line(plan), jobs_line(plan, jobs, len(shards))]
    lines += [rows_line(plan, config), *plan.details]
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
        lines += [f"{shards[0].path}:", f"row options: {config.row_flags()}"]
        return "\n".join(lines)
    lines.append(
        "each shard's rows: auto on its Dask worker, which measures for itself; here, on "
        "the first shard:"
    )
    first, why = explain_first_shard(inputs, config)
    lines += [f"{first}:", f"row options: {config.row_flags()}", str(why)]
    return "\n".join(lines)


def rows_line(plan: ShardPlan, config: RunConfig) -> str:
    """How each shard's rows run under ``plan``."""
    if plan.mode == "shards":
        how = "measured" if config.executor == "auto" else "--executor"
        return f"each shard's rows: {plan.form} in its worker process ({how})"
    if config.executor != "auto":
        return f"each shard's rows: {config.executor}, from this process (--executor)"
    return (
        "each shard's rows: auto, from this process: it measures on the first shard (below) "
        "and may choose again on a later one; each shard's progress line and manifest entry "
        "say what ran it"
    )


def jobs_line(plan: ShardPlan, jobs: int | None, shards: int) -> str:
    """Shards in flight under ``plan`` (``jobs``: ``--jobs``), and what holds them."""
    if plan.mode == "shards":
        n = jobs or 2 * plan.workers
        why = "--jobs" if jobs else "2 per worker, so each has its next shard queued"
        return (
            f"jobs: {min(n, shards)} of the {shards} shard(s) in flight at once on "
            f"{plan.workers} worker processes ({n}: {why})"
        )
    n = jobs or LOCAL_JOBS
    return (
        f"jobs: {n} shard(s) in flight, threads of this process "
        f"({'--jobs' if jobs else 'the default'}): one computes while the others load or "
        f"save; more only hold more shards in memory"
    )


def threads_line(plan: ShardPlan) -> str:
    """What prep sets for torch's intra-op threads under ``plan``, for ``--explain``."""
    if plan.mode == "shards":
        return (
            f"torch threads: {plan.threads} in each of the {plan.workers} worker processes "
            f"(cores / workers, so workers x threads <= cores; the DataLoader sets 1); "
            f"this process only hands out shards"
        )
    return (
        f"torch threads: this process keeps its own ({torch.get_num_threads()}) for the rows; "
        f"a row executor's worker processes get {plan.threads} each (cores / workers)"
    )
