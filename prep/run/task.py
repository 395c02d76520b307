"""One shard's work, wherever it runs (a thread of ``prep run``, or a Dask worker).

    ShardTask ─▶ stat ─▶ load_shard (weights_only) ─▶ the batch (dict, or --columns tuple)
              ─▶ map_rows(fn, batch, row options) ─▶ result dict (out / out0.. / its keys,
                 each with NAME_lengths after it under --pad; see :mod:`prep.run.rows`)
              ─▶ save_shard (temp, fsync, rename) ─▶ manifest entry (returned, not written;
                 with the failed rows under --on-row-error fill/skip, and the output's layout)

The folder's fsync, which makes the rename durable, is the driver's, once for a group
of shards, before it writes their manifest lines. A shard of 0 rows has no row to
show its output: it is written as 0 rows in the layout (names, dtypes, row shapes)
of a shard already done, which the driver gives its task; without one it is
:class:`NoRows`, which the driver holds back until another shard is done.

Everything a task needs travels in it (paths, the function's *name*, its
arguments), so it pickles small; the function is imported where it runs.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import mmap
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._version import __version__
from ..core.rows import rows_of
from ..errors import Cancelled, ConfigError, NoRows, OutOfSpace, RowError, ShardError
from ..executors import call_failure, traits_of
from ..pool import SHARED, Pool
from ..registry import in_caller
from .calls import load_fn
from .config import RunConfig
from .manifest import SCHEMA
from .rows import failed_rows, with_lengths
from .save import Unsealed, save_shard, seal_files
from .shards import ShardFile, load_shard
from .temps import Temps

__all__ = [
    "IN_WORKER",
    "Layout",
    "NoRows",
    "ShardTask",
    "each",
    "halt_workers",
    "layout_of",
    "run_shard",
    "run_shards_on_worker",
    "slice_rows",
    "worker_form",
]

#: executors a shard worker may run its rows with: those that run in its thread, with no
#: workers of their own (auto runs serial there, the reference, so that no worker
#: calibrates on its own)
IN_WORKER = in_caller()


#: an output's layout: each saved tensor's name -> (dtype, the shape of one row)
Layout = Mapping[str, tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class ShardTask:
    """One shard to process: everything a thread or a Dask worker needs."""

    source: ShardFile
    out: Path  # the output folder
    config: RunConfig
    layout: Layout | None = None  # a done shard's, for an output of 0 rows


def layout_of(tensors: Mapping[str, Tensor]) -> dict[str, list[Any]]:
    """The output's :data:`Layout`, as its manifest entry records it (JSON: lists)."""
    return {k: [str(t.dtype).removeprefix("torch."), list(t.shape[1:])] for k, t in tensors.items()}


def shard_batch(
    tensors: dict[str, Tensor], columns: tuple[str, ...] | None, path: Path
) -> tuple[Any, int]:
    """The shard as a ``map_rows`` batch (a dict, or a tuple in ``columns`` order) and its rows."""
    missing = [c for c in columns or () if c not in tensors]
    if missing:
        raise ShardError(
            f"{path}: has no column {', '.join(map(repr, missing))}; it has "
            f"{', '.join(map(repr, tensors))}; pick others with --columns"
        )
    chosen = tensors if columns is None else {c: tensors[c] for c in columns}
    rows = {name: (t.shape[0] if t.dim() else None) for name, t in chosen.items()}
    if None in rows.values() or len(set(rows.values())) != 1:
        sizes = ", ".join(f"{n}: {r if r is not None else '0-d'}" for n, r in rows.items())
        raise ShardError(
            f"{path}: the columns must share dim 0 (one entry per row), got {sizes}; "
            f"pick the row-aligned ones with --columns"
        )
    batch = tuple(chosen.values()) if columns is not None else chosen
    return batch, len(next(iter(chosen.values())))


def _named(result: Any, spec: str) -> dict[str, Tensor]:
    """The function's result as the output shard's dict: ``out``, ``out0..`` or its own keys."""
    if isinstance(result, Tensor):
        return {"out": result}
    if isinstance(result, (tuple, list)) and all(isinstance(t, Tensor) for t in result):
        return {f"out{i}": t for i, t in enumerate(result)}
    if isinstance(result, Mapping) and all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in result.items()
    ):
        return dict(result)
    raise TypeError(
        f"--fn {spec} returned a {type(result).__name__}; to be saved it must return a "
        f"Tensor, a tuple of Tensors or a dict of str -> Tensor"
    )


def run_shard(
    task: ShardTask,
    pool: Pool | None = None,
    cancel: threading.Event | None = None,
    temps: Temps | None = None,
    compute: threading.Lock | None = None,
    checked: set[tuple[str, ...]] | None = None,
    seal: Callable[[Unsealed], None] | None = None,
) -> dict[str, Any]:
    """Process one shard and return its manifest entry (the manifest is the caller's).

    ``pool`` runs the rows (else the config's executor); ``cancel`` is checked between
    the steps; ``temps`` tracks the temporary file; ``compute``, held while the rows run,
    keeps shards in threads from computing at once; ``checked``: column names the function
    is known to take (this shard's added); ``seal``: see :func:`save_shard`."""
    started = time.monotonic()
    config, src = task.config, task.source
    before = _stat(src.path)
    tensors = load_shard(src.path, trust_pickle=config.trust_pickle)
    batch, rows = shard_batch(tensors, config.columns, src.path)
    checked = set() if checked is None else checked
    if config.columns is None and tuple(batch) not in checked:
        config.check_call(list(batch), src.path)  # the row's tensors go by their names
        checked.add(tuple(batch))
    fn = config.bound_fn()
    if rows == 0:
        tensors, failures, ran = _no_rows(task)
    else:
        if config.device is not None and torch.device(config.device).type != "cpu":
            # compute where the result is wanted: the batched twin then runs on the GPU
            batch = each(batch, lambda t: t.to(config.device))
        with compute or contextlib.nullcontext():
            _check(cancel, src)
            result, ran = _map(fn, batch, rows, config, pool, src)
        _check(cancel, src)
        tensors, failures = _outputs(result, config)
    if _stat(src.path) != before:  # with mmap the data was read during the call
        raise ShardError(f"{src.path}: changed while it was read; rerun once it is complete")
    kept = rows - len(failures["failed_rows"]) if config.on_row_error == "skip" else rows
    dest, rel = src.output(task.out, config.format)
    sha, size = save_shard(tensors, dest, config.format or src.format, temps, False, seal)
    return {
        "schema": SCHEMA,
        "input": src.rel,
        "input_size": before[0],
        "input_mtime_ns": before[1],
        "output": rel,
        "output_size": size,
        "output_sha256": sha,
        "rows": kept,
        "input_rows": rows,
        "layout": layout_of(tensors),
        **config.recipe(),
        **ran,
        **failures,
        "prep": __version__,
        "torch": torch.__version__,
        "seconds": round(time.monotonic() - started, 6),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def worker_form(executor: str) -> str:
    """What a whole-shard worker runs rows with for ``executor``, where nothing was
    measured: the executor itself if it needs no process of its own, else serial."""
    return executor if executor in IN_WORKER else "serial"  # the reference


def _no_rows(task: ShardTask) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, str]]:
    """A 0-row shard's output, in the layout its task carries; :class:`NoRows` if none."""
    if task.layout is None:
        raise NoRows(
            f"{task.source.path}: has 0 rows, and no shard of this run was done to show the "
            f"output's names, dtypes and row shapes; run it together with shards that have "
            f"rows (it is then written with 0 rows in their layout), or leave it out"
        )
    tensors = {k: torch.empty((0, *shape), dtype=getattr(torch, dtype)) for k, (dtype, shape) in
               task.layout.items()}  # fmt: skip
    empty: dict[str, Any] = {"failed_rows": [], "row_errors": []}
    failed = empty if task.config.on_row_error != "raise" else {}
    return tensors, failed, {}


#: one byte shared with the shard workers forked from this process: set, they start no
#: other shard (the disk is full); made at import, so every fork of it shares the page
_HALT = mmap.mmap(-1, 1)


def halt_workers(halt: bool = True) -> None:
    """Tell the forked shard workers to start no other shard (``False``: clear it, for a
    new run). Workers from prep's forkserver do not share it."""
    _HALT[0] = int(halt)


def run_shards_on_worker(tasks: list[ShardTask]) -> list[Any]:
    """:func:`run_shard` on each of ``tasks`` in turn, in a shard worker process (``prep
    run``'s shards in parallel), each outcome its manifest entry or its error as
    :func:`~prep.executors.call_failure` sends it: one call for several small shards. The
    rows run with the config's executor if it needs no process of its own (serial for
    auto), on this worker's share of the cores, and ``--setup`` once per worker; a shard
    reached after :func:`halt_workers` is not started (:class:`~prep.errors.Cancelled`)."""
    checked: set[tuple[str, ...]] = set()
    temps = Temps()
    outcomes: list[Any] = []
    sealing: list[tuple[int, Unsealed]] = []  # outputs to fsync and rename, by shard

    def seal(file: Unsealed) -> None:
        sealing.append((len(outcomes), file))

    later = seal if len(tasks) > 1 else None  # one shard alone seals its own at once
    stop = False  # a full disk, or a setting no shard can run with: the rest not started
    try:
        for task in tasks:
            try:
                if _HALT[0] or stop:
                    raise Cancelled(f"{task.source.path}: not started, the run stopped")
                pool = _worker_pool(worker_form(task.config.executor), task.config.setup)
                outcomes.append(run_shard(task, pool, None, temps, None, checked, later))
            except Exception as exc:  # the shard's own error; the others still run
                outcomes.append(call_failure(exc))
                stop |= isinstance(exc, (OutOfSpace, ConfigError))
    except BaseException:  # SystemExit in a row: the call fails whole, its files go
        temps.abandon()
        raise
    # the call's outputs fsynced together, then renamed, before the call returns
    errors = seal_files([file for _, file in sealing])
    for (i, _), error in zip(sealing, errors):
        if error is not None:
            outcomes[i] = call_failure(error)
    return outcomes


@functools.cache
def _worker_pool(executor: str, setup: str | None) -> Pool:
    """This worker process's Pool for ``executor`` and ``--setup``, made once, so that
    setup= runs once a worker."""
    return Pool(executor, 1, setup=load_fn(setup, "--setup") if setup else None)


#: a batched form (vmap, a twin) runs a whole-shard worker's rows this many bytes of
#: input at a time: its intermediates are a slice's, not a second and third shard; and
#: the plan measures on at most a slice of the first shard's rows, so that a light row
#: does not make it compute (and hold) half a gigabyte shard again
SLICE_BYTES = 8 << 20


def _map(
    fn: Callable[..., Any],
    batch: Any,
    rows: int,
    config: RunConfig,
    pool: Pool | None,
    src: ShardFile,
) -> tuple[Any, dict[str, str]]:
    """``map_rows`` on the shard, through ``pool`` if there is one, with the row options;
    and the entry's fields that say what ran the rows (:func:`ran_with`)."""
    options = config.shard_options(src.rel)
    try:
        if pool is None:
            pool = SHARED.pool(config.executor, config.workers, config.setup_fn())
        step = slice_rows(batch, rows)
        if traits_of(pool.executor).per_row or not options.policy.plain or step >= rows:
            return pool.run(fn, rows_of(batch), options), ran_with(pool)
        # the first slice shows the output; the others are written into it in place
        first = pool.run(fn, rows_of(each(batch, itemgetter(slice(step)))), options)
        if not all(isinstance(t, Tensor) for t in leaves(first)):  # _outputs says why
            return first, ran_with(pool)
        out = each(first, lambda t: t.new_empty((rows, *t.shape[1:])))
        for whole, head in zip(leaves(out), leaves(first)):
            whole[:step].copy_(head)
        for start in range(step, rows, step):
            part = itemgetter(slice(start, min(rows, start + step)))
            pool.run(fn, rows_of(each(batch, part)), options.with_(out=each(out, part)))
        return out, ran_with(pool)
    except RowError as exc:
        if config.on_row_error == "raise":
            raise
        # under fill/skip a row's error stays its own: only a shard where every row
        # failed gets here, with no row to show the output's shape
        raise ShardError(
            f"{src.path}: all {rows} rows failed (--on-row-error {config.on_row_error}), "
            f"so there is no output to save; the first, {exc.__cause__ or exc}"
        ) from exc


def slice_rows(batch: Any, rows: int) -> int:
    """Rows in :data:`SLICE_BYTES` of the shard's input (at least one)."""
    return max(1, rows * SLICE_BYTES // max(1, sum(t.nbytes for t in leaves(batch))))


def leaves(x: Any) -> list[Any]:
    """The tensors of a batch or a result (a tensor, a tuple or list, or a dict of them)."""
    if isinstance(x, Mapping):
        return list(x.values())
    return list(x) if isinstance(x, (tuple, list)) else [x]


def each(x: Any, f: Callable[[Tensor], Tensor]) -> Any:
    """``f`` on each tensor of a batch or a result, in the same container."""
    if isinstance(x, Mapping):
        return {k: f(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(map(f, x))
    return f(x)


def ran_with(pool: Pool) -> dict[str, str]:
    """``{"executor": what ran the rows}``, with ``"executor_asked": "auto"`` where auto
    chose it (its latest choice for the function: a shard's rows all run with one)."""
    if pool.executor != "auto":
        return {"executor": pool.executor}
    choices = pool.choices()
    return {"executor": choices[-1].choice if choices else "auto", "executor_asked": "auto"}


def _outputs(result: Any, config: RunConfig) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors to save (with their lengths under --pad) and the entry's failed-row
    fields (under --on-row-error fill/skip; none otherwise)."""
    out, lengths, valid, errors = config.unpack(result)
    tensors = _named(out, config.fn)
    if lengths is not None:
        tensors = with_lengths(tensors, _named(lengths, config.fn))
    return tensors, failed_rows(valid, errors) if valid is not None else {}


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ShardError(f"{path}: the file disappeared before it was read") from None
    return st.st_size, st.st_mtime_ns


def _check(cancel: threading.Event | None, src: ShardFile) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{src.path}: the run was abandoned")
