"""``prep run``: every shard through a row function, once, durably, resumably.

    driver (this process)                  a slot: a worker process, a thread here, or Dask
    ─────────────────────                  ─────────────────────────────────────────────────
    find_shards ─▶ drop those the manifest proves done
    plan: whole shards or rows (local)
    submit up to `slots` ShardTasks ──────▶ run_shard: load ─▶ map_rows ─▶ save (fsync)
    done queue ◀──── manifest entry, or the exception ─┘
    hold the entry; commit the group (folders fsynced, lines written, one fsync)
    ─▶ progress ─▶ submit the next                       (prep.run.driver)
    Ctrl-C / SIGTERM ─▶ commit what landed ─▶ abandon the tasks in flight (temp files
    removed) ─▶ re-raise

Locally, :mod:`prep.run.local` runs whole shards on worker processes (each loads,
computes and saves its shard: the DataLoader's shape), or one shard at a time in
this process with its rows spread out by the row executor; :mod:`prep.run.plan`
decides which from the first shard, once per run (``parallel="auto"``). Either
way the work of a shard is :func:`~prep.run.task.run_shard`, as on a cluster.

With ``cluster`` the same tasks go to a Dask scheduler (:mod:`prep.run.dask`); the
workers read and write the files, so they must see the same paths (a shared
filesystem), and the driver alone writes the manifest.

Without ``resume``, an output folder whose manifest has entries is refused:
a second run would otherwise silently mix two runs' outputs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Terminated
from .config import RunConfig
from .driver import Backend, Driver
from .local import check_parallel, local_backend
from .manifest import Manifest, recipe_changes
from .plan import PARALLEL, ShardPlan
from .progress import ShardProgress, Summary
from .shards import find_shards, other_files
from .signals import shielded
from .task import ShardTask
from .temps import remove_stale_temps

__all__ = ["ON_ERROR", "run_shards"]

ON_ERROR = ("stop", "skip")


def _backend(
    config: RunConfig,
    todo: deque[ShardTask],
    jobs: int | None,
    cluster: str | None,
    parallel: str,
) -> tuple[Backend, ShardPlan | None]:
    if cluster is not None:
        from .dask import DaskBackend  # Dask is an optional extra: import only when asked

        return DaskBackend(cluster, jobs), None
    return local_backend(config, list(todo), jobs, parallel)


def _check(config: RunConfig, jobs: int | None, on_error: str, parallel: str) -> None:
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} is not one of {', '.join(map(repr, ON_ERROR))}")
    if parallel not in PARALLEL:
        raise ConfigError(
            f"parallel={parallel!r} is not one of {', '.join(map(repr, PARALLEL))}; 'auto' "
            f"measures the first shard and picks"
        )
    check_parallel(config, parallel)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"jobs={jobs!r} is not a positive integer; pass jobs >= 1")
    config.check()  # every setting, before any file is read or written


def _prepare_out(out: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a folder; pass a folder path")
    target = out.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if target == src or src in target.parents or target in src.parents:
            raise ConfigError(
                f"--out {str(out)!r} and input {str(given)!r} overlap; the outputs would be "
                f"read as inputs (or overwrite them). Use sibling folders, e.g. data/raw and "
                f"data/ready"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {str(out)!r} cannot be created ({exc}); pick another") from exc


def run_shards(
    inputs: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    config: RunConfig,
    *,
    jobs: int | None = None,
    on_error: str = "stop",
    resume: bool = False,
    cluster: str | None = None,
    progress: ShardProgress | None = None,
    parallel: str = "auto",
) -> Summary:
    """Process every shard under ``inputs`` into ``out``; returns the :class:`Summary`.

    ``jobs``: shards in flight (default: 2 a worker process, 2 with rows spread out,
    1 a Dask worker thread). ``parallel``: ``"shards"`` (whole shards on worker
    processes), ``"rows"`` (a shard at a time, its rows spread by the config's
    executor) or ``"auto"`` (:mod:`prep.run.plan`; ``summary.plan`` says which, why).
    After a failed shard (a failing row fails it unless ``config.on_row_error`` keeps
    it), ``on_error="stop"`` lets those in flight finish and starts no more, ``"skip"``
    goes on. ``resume`` skips the shards the manifest proves done. ``cluster``: a Dask
    scheduler's address, or ``"local"``. Ctrl-C and SIGTERM abandon those in flight.

    >>> import tempfile, prep.run
    >>> from prep.run import RunConfig, run_shards
    >>> data, out = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = prep.run.make_shards(data, shards=2, rows=8, seq=6, dim=2)
    >>> config = RunConfig("prep.ops:side_context_row", {"max_len": 3})
    >>> s = run_shards([data], out, config)
    >>> (s.done, s.rows, s.exit_code)
    (2, 16, 0)
    """
    _check(config, jobs, on_error, parallel)
    folder, progress = Path(out), progress or ShardProgress(quiet=True)
    manifest, todo, summary, stale, layouts = _plan(list(inputs), folder, config, resume, progress)
    if not todo:  # all done already: no pool or cluster to start
        progress.start(0, summary.skipped, len(stale))
        progress.finish(summary)
        return summary
    started = time.monotonic()  # the backend first: workers fork while no thread runs
    backend, plan = _backend(config, todo, jobs, cluster, parallel)
    summary.plan = plan.sentence() if plan is not None else ""
    progress.start(len(todo), summary.skipped, len(stale), summary.plan)
    driver = Driver(backend, todo, manifest, on_error, progress, summary, layouts)
    try:
        driver.run()
    except BaseException as exc:  # Ctrl-C, SIGTERM, or the manifest's disk failing
        with shielded():
            driver.commit_held()  # what landed is done: its outputs are in place
            _abandon(backend, exc, len(todo) + len(driver.alone), folder, summary)
        raise
    else:
        backend.close()
        remove_stale_temps(folder)  # a worker that died while writing left its temp behind
    finally:
        summary.seconds = time.monotonic() - started
        with shielded():
            driver.close()  # its commit thread, then the manifest it writes
            progress.finish(summary)
    return summary


def _abandon(
    backend: Backend, exc: BaseException, todo: int, folder: Path, summary: Summary
) -> None:
    """Stop the shards in flight after ``exc``, and count what it left undone."""
    if isinstance(exc, KeyboardInterrupt):
        summary.interrupted = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    summary.not_started = todo
    backend.abandon()
    # a Dask worker's (once a cluster we started is closed), which this process
    # cannot track; a live worker's or another run's are left alone
    remove_stale_temps(folder)


def _plan(
    inputs: list[str | os.PathLike[str]],
    folder: Path,
    config: RunConfig,
    resume: bool,
    progress: ShardProgress,
) -> tuple[Manifest, deque[ShardTask], Summary, list[Path], dict[str, Any]]:
    """The manifest, the shards still to do, the summary so far, the stale temps
    removed and the output layouts of the shards done; what the run will not do as
    asked is said first (files that are not shards, shards redone because the recipe
    changed)."""
    shards = find_shards(inputs)
    config.check_first_shard(shards[0].path)  # before --out is made or any shard runs
    _prepare_out(folder, inputs)
    manifest = Manifest(folder)
    previous = manifest.entries()
    failed = manifest.failures()
    if (previous or failed) and not resume:
        raise ConfigError(
            f"--out {str(folder)!r} holds the manifest of an earlier run ({len(previous)} "
            f"shard(s) done, {len(failed)} failed); pass --resume to finish that run, or "
            f"choose a new --out"
        )
    others = other_files(inputs)
    if others:
        progress.note(_skipped_files(others))
    stale = remove_stale_temps(folder)
    recipe = config.recipe()
    done = {s.rel for s in shards if manifest.is_done(previous.get(s.rel), s, recipe)}
    todo = deque(ShardTask(s, folder, config) for s in shards if s.rel not in done)
    layouts = {rel: previous[rel]["layout"] for rel in done if "layout" in previous[rel]}
    changed = [c for t in todo if t.source.rel in previous for c in
               [recipe_changes(previous[t.source.rel], recipe)] if c]  # fmt: skip
    if changed:
        progress.warn(
            f"the recipe changed since {len(changed)} shard(s) were done "
            f"({'; '.join(changed[0])}): they will be computed again and their outputs "
            f"replaced; to keep them, stop now (Ctrl-C) and choose a new --out"
        )
    summary = Summary(
        shards=len(shards),
        skipped=len(shards) - len(todo),
        manifest=str(manifest.path),
        on_row_error=config.on_row_error,
    )
    return manifest, todo, summary, stale, layouts


def _skipped_files(others: list[Path]) -> str:
    names = ", ".join(str(p) for p in others[:3]) + (", ..." if len(others) > 3 else "")
    text = f"{len(others)} file(s) under the inputs are not .pt or .safetensors shards, "
    text += f"and are skipped: {names}"
    if any(p.suffix == ".pth" for p in others):
        text += "; a .pth file torch.save wrote is a .pt file: rename it to .pt to include it"
    return text
