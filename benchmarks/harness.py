"""The comparison harness behind ``python -m benchmarks``: every executor, side by side.

    Grid ─▶ start-up probe: a fresh prep.Pool per executor x workers, first call vs warm
         ─▶ for each workload x rows: the batch (made once) and serial's result
             └▶ for each workers: a group of variants
                  one checked call per variant (raises, or differs from serial: failed)
                  auto's first call on a fresh pool, timed alone (calibration included),
                  then each peer's on a fresh pool of its tool (start-up included)
                  interleaved repeats (prep.bench.interleaved) ─▶ one Cell per variant
         ─▶ Results: winners, auto vs best, peers vs prep, environment; report.py and
            plots.py draw it

Nothing here aborts the run: a workload whose batch cannot be made, or a variant
that raises, becomes failed cells carrying the error text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prep import api
from prep._system import info
from prep.bench.timing import Timing, interleaved
from prep.bench.verify import Guard, check, status_of, text
from prep.core.rowwise import twin_of
from prep.pool import Pool

from .baselines import loop_stack, nbytes, plain_joblib
from .cell_text import group_line
from .grid import AUTO, AUTO_FIRST, FIRST_CALLS, LOOP, PEER_WORKLOADS, PLAIN_JOBLIB, POOLS, Grid
from .libraries import call, is_samples, unavailable
from .peers import PEERS, PeerGroup, first_call, session
from .results import Cell, Results, Startup
from .workloads import Workload, noop

__all__ = ["run"]

#: plain joblib ships the whole batch with every row: above this batch size it is skipped,
_NAIVE_SKIP_BYTES = 64 * 2**20
#: and below it, timed on only as many rows as ship this many bytes per call, then scaled
_NAIVE_SHIP_BYTES = 256 * 2**20

#: where the harness says how far it got: one line at a time (print, a logger, a list)
Say = Callable[[str], None]


def run(
    grid: Grid | None = None,
    *,
    out: str | Path | None = None,
    progress: Say | None = None,
    peers: bool | Sequence[str] = False,
) -> Results:
    """Time every executor of ``grid`` on every workload, rows and workers; see :class:`Grid`.

    With ``out`` the table, ``results.json``, ``report.md`` and the PNGs are
    written there too; ``progress`` gets one line per group as it finishes.
    ``peers=True`` times every peer of :mod:`benchmarks.peers` beside them (a list:
    those), on the real libraries' workloads too where ``grid`` is not given.
    It ends with :func:`prep.shutdown`, closing ``map_rows``' warm pools; every
    peer's pool is closed with its group.

    >>> from benchmarks.grid import Grid
    >>> res = run(Grid(workloads=("noop",), executors=("serial", "threads"), rows=(8,),
    ...                workers=(2,), repeat=1))
    >>> [c.executor for c in res.cells]
    ['serial', 'threads']
    """
    grid = _with_peers(grid, peers)
    say = progress or (lambda line: None)
    began = time.perf_counter()
    load_before = _load()
    cells: list[Cell] = []
    try:
        with warnings.catch_warnings(), session() if grid.peers else contextlib.nullcontext():
            # joblib says so on every call with n_jobs=1, where the timeout has nothing to bound
            warnings.filterwarnings("ignore", "The backend class 'SequentialBackend'", UserWarning)
            startup = _startup(grid, say)
            for workload in grid.resolved():
                for rows in grid.rows:
                    cells += _workload_rows(workload, rows, grid, startup, say)
    finally:
        api.shutdown()  # the warm pools the bench started: no worker outlives it
    prep_info = info(max(grid.workers))
    environment = {**prep_info, "load_avg_start": load_before, "load_avg_end": _load()}
    results = Results(
        environment=environment,
        grid=grid.to_dict(),
        workloads={w.name: w.about for w in grid.resolved()},
        startup=startup,
        cells=cells,
        wall_s=time.perf_counter() - began,
    )
    results.mark_winners()
    if out is not None:
        from .report import write  # report imports this package's results, not harness

        write(results, Path(out), note=say)
    return results


def _with_peers(grid: Grid | None, peers: bool | Sequence[str]) -> Grid:
    """``grid`` (default: :class:`Grid`, with the library workloads if peers are asked
    for) with the peers ``peers`` names (True: all of them; False: the grid's own)."""
    names = tuple(PEERS) if peers is True else tuple(peers or ())
    if grid is None:
        return Grid(workloads=PEER_WORKLOADS, peers=names) if names else Grid()
    return dataclasses.replace(grid, peers=names) if names else grid


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return None


# ---------------------------------------------------------------- start-up


def _startup(grid: Grid, say: Say) -> list[Startup]:
    """A fresh ``prep.Pool``'s first call vs its warm calls, on 64 no-op rows."""
    found = []
    for name in (n for n in POOLS if n in grid.executors):
        for workers in grid.workers:
            found.append(_probe(name, workers))
            s = found[-1]
            say(f"start-up {name} workers={workers}: " + (s.error or f"{s.first_call_s:.3f} s"))
    return found


def _probe(name: str, workers: int) -> Startup:
    rows = torch.randn(64, 8)
    pool = Pool(name, workers=workers)
    try:
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            pool.map_rows(noop, rows)
            times.append(time.perf_counter() - t0)
    except Exception as exc:  # a pool that cannot start is a finding, not a crash
        return Startup(name, workers, None, None, text(exc))
    finally:
        pool.close()
    return Startup(name, workers, times[0], statistics.median(times[1:]))


# ---------------------------------------------------------------- one workload x rows


def _workload_rows(
    workload: Workload, rows: int, grid: Grid, startup: list[Startup], say: Say
) -> list[Cell]:
    names = _names(workload, grid)
    status, error = "skipped", unavailable(workload)
    if not error:
        try:
            batch = workload.batch(rows)
        except Exception as exc:
            status, error = "failed", f"the batch factory failed: {text(exc)}"
    if error:
        say(f"{workload.name} rows={rows}: {status.upper()} ({error})")
        return [
            Cell(workload.name, rows, w, n, status, note=error) for w in grid.workers for n in names
        ]
    reference: Any = None
    # if serial raises, its cell says so; the other variants then go unchecked
    with contextlib.suppress(Exception):
        reference = _mapper(workload)(workload.fn, batch, executor="serial", timeout=grid.timeout)
    sizes = (nbytes(batch), nbytes(reference))
    cells: list[Cell] = []
    for workers in grid.workers:
        group = _group(
            _Group(workload, batch, rows, workers, grid, reference, sizes), names, startup
        )
        cells += group
        say(group_line(group))
    del batch, reference
    gc.collect()  # big batches: free them before the next one is made
    return cells


def _names(workload: Workload, grid: Grid) -> list[str]:
    """The variants run for this workload, in the grid's order (first calls first), peers last."""
    names = []
    for name in grid.executors:
        if name == "vectorized" and twin_of(workload.fn) is None:
            continue  # no batched twin: nothing to vectorize
        if name in ("vectorized", "vmap") and is_samples(workload):
            continue  # a list of samples has no batched form
        if name == AUTO:
            names.append(AUTO_FIRST)
        names.append(name)
    for peer in grid.peers:
        names += [first_call(peer), peer]
    return names


def _mapper(workload: Workload) -> Callable[..., Any]:
    """``map_samples`` for a workload whose batch is a list of samples, else ``map_rows``."""
    return api.map_samples if is_samples(workload) else api.map_rows


@dataclass
class _Group:
    """One workload at one rows-per-batch and workers, and the cells found so far."""

    workload: Workload
    batch: Any
    rows: int
    workers: int
    grid: Grid
    reference: Any  # serial's result, to check the others against (None: unchecked)
    sizes: tuple[int, int]  # bytes of the batch, and of serial's result
    cells: dict[str, Cell] = field(default_factory=dict)

    def put(self, name: str, status: str, note: str) -> None:
        self.cells[name] = Cell(
            self.workload.name, self.rows, self.workers, name, status, note=note
        )


def _group(g: _Group, names: list[str], startup: list[Startup]) -> list[Cell]:
    """One Cell per variant in ``names``; auto runs on a fresh ``prep.Pool`` of its own, and
    each peer on a fresh pool of its tool, all closed when the group is done."""
    with contextlib.ExitStack() as stack:
        auto_pool = None
        if AUTO in names:
            auto_pool = Pool(AUTO, workers=g.workers, timeout=g.grid.timeout)
            stack.callback(auto_pool.close)
        peers = PeerGroup(g.grid.peers, g.workload, g.batch, g.workers)
        stack.callback(peers.close)
        variants, naive_rows = _variants(g, names, auto_pool)
        for name in list(variants):
            if name == AUTO:
                continue
            # each variant's first call is untimed (it warms pools and caches) and checked
            error = check(
                variants[name], g.reference, naive_rows if name == PLAIN_JOBLIB else g.rows
            )
            if error:
                g.put(name, status_of(error), error)  # vmap refusing a function is expected
                del variants[name]
        firsts = _first_calls(g, variants, peers)
        timings = _timed(g, variants)
        serial = timings["serial"].median if "serial" in timings else None
        for name, timing in timings.items():
            scale = g.rows / naive_rows if name == PLAIN_JOBLIB else 1.0
            note = ""
            if scale != 1.0:
                note = (
                    f"timed on the first {naive_rows} rows (each row ships the whole "
                    f"{g.sizes[0] / 2**20:.1f} MB batch), scaled to {g.rows}"
                )
            g.cells[name] = _cell(g, name, timing, scale, serial, note)
        for name, seconds in firsts.items():
            g.cells[name] = _cell(
                g, name, Timing(seconds, seconds, seconds, (seconds,)), 1.0, serial, ""
            )
            g.cells[name].spread = None  # one call: no spread to speak of
        if auto_pool is not None:
            _note_choice(g, auto_pool)
    for cell in g.cells.values():
        cell.add_breakdown(serial, g.sizes, startup, g.cells)
    return [g.cells[n] for n in names if n in g.cells]


def _first_calls(
    g: _Group, variants: dict[str, Callable[[], Any]], peers: PeerGroup
) -> dict[str, float]:
    """The first calls, each timed alone and checked: auto's on its fresh pool, then each
    peer's, its pool's start-up included. Their seconds, by first-call name; a peer that
    passes joins ``variants``, one that fails is two failed cells.

    A fresh pool has calibrated nothing and started nothing: auto's first call is its
    true first call. It runs after the others' untimed first calls, so what a process
    pays once (vmap's or a twin's first call) falls on no variant.
    """
    calls = {AUTO_FIRST: variants[AUTO]} if AUTO in variants else {}
    calls |= {first_call(name): run for name, run in peers.calls().items()}
    for name, reason in peers.skipped.items():
        g.put(name, "skipped", reason)
    firsts: dict[str, float] = {}
    for name, run in calls.items():
        timed: list[float] = []
        error = check(run, g.reference, g.rows, timed)
        warm = FIRST_CALLS[name]
        if error:
            g.put(name, "failed", error)
            if warm != AUTO:  # auto's warm calls are timed regardless, as ever
                g.put(warm, "failed", error)
            continue
        firsts[name] = timed[0]
        variants.setdefault(warm, run)
    return firsts


def _variants(
    g: _Group, names: list[str], auto_pool: Pool | None
) -> tuple[dict[str, Callable[[], Any]], int]:
    """A zero-argument call per variant of prep's, and the rows plain joblib is timed on."""
    w, batch, workers, timeout = g.workload, g.batch, g.workers, g.grid.timeout
    samples = is_samples(w)
    variants: dict[str, Callable[[], Any]] = {}
    naive_rows = g.rows
    for name in names:
        if name in FIRST_CALLS or name in PEERS:
            continue  # timed by _first_calls, peers on their own pools
        if name == AUTO and auto_pool is not None:
            variants[name] = lambda: call(auto_pool, w, batch)
        elif name == PLAIN_JOBLIB:
            naive_rows, reason = _naive_plan(g.rows, g.sizes[0])
            if reason:
                g.put(name, "skipped", reason)
                continue
            variants[name] = functools.partial(
                plain_joblib, w.fn, batch, workers, naive_rows, samples=samples
            )
        elif name == LOOP:
            variants[name] = lambda: loop_stack(w.fn, batch, samples=samples)
        else:
            variants[name] = functools.partial(
                _mapper(w), w.fn, batch, executor=name, workers=workers, timeout=timeout
            )
    return variants, naive_rows


def _timed(g: _Group, variants: dict[str, Callable[[], Any]]) -> dict[str, Timing]:
    """Interleaved repeats of the variants; one that raises midway becomes a failed cell."""
    guards = {name: Guard(call) for name, call in variants.items()}
    timings = interleaved(guards, repeat=g.grid.repeat, warmup=0) if guards else {}
    for name, guard in guards.items():
        if guard.error:
            g.put(name, "failed", guard.error)
            del timings[name]
    return timings


def _note_choice(g: _Group, pool: Pool) -> None:
    """Add what auto chose (its latest calibration's choice) to its cells' notes."""
    choices = pool.choices()
    if not choices:
        return
    for name in (AUTO, AUTO_FIRST):
        cell = g.cells.get(name)
        if cell is not None and cell.status == "ok":
            cell.note = f"picked {choices[-1].choice}" + (f"; {cell.note}" if cell.note else "")


def _naive_plan(rows: int, batch_bytes: int) -> tuple[int, str]:
    """Rows to time plain joblib on, and why it is skipped ('' if it is not)."""
    if batch_bytes > _NAIVE_SKIP_BYTES:
        return 0, (
            f"skipped: the batch is {batch_bytes / 2**20:.0f} MB > "
            f"{_NAIVE_SKIP_BYTES / 2**20:.0f} MB, and every row would pickle all of it"
        )
    return max(1, min(rows, _NAIVE_SHIP_BYTES // max(batch_bytes, 1))), ""


# ---------------------------------------------------------------- figures of a cell


def _cell(
    g: _Group, name: str, timing: Timing, scale: float, serial: float | None, note: str
) -> Cell:
    median = timing.median * scale
    rows = g.rows
    return Cell(
        g.workload.name,
        rows,
        g.workers,
        name,
        "ok",
        median_s=median,
        low_s=timing.low * scale,
        high_s=timing.high * scale,
        spread=timing.spread,
        samples_s=[s * scale for s in timing.samples],
        rows_per_s=rows / median if median > 0 else math.inf,
        speedup=serial / median if serial and median > 0 else None,
        estimated=scale != 1.0,
        note=note,
    )
