"""Your row function on every executor of the registry and, with ``peers``, on a
``multiprocessing.Pool`` and a ``DataLoader`` with workers: what ``prep bench`` runs.

    Race(rows, workers, repeat, executors, peers, timeout).run(fn, factory)
      for each rows per batch: the batch, made once by factory(rows); serial's result
        ─▶ each variant's first call, untimed (it starts pools, calibrates auto) and
           checked against serial's: one that raises or differs fails; one that prep
           refuses, saying why (vmap of a function that reads values, vectorized
           without a batched twin), is skipped
        ─▶ interleaved repeats of the others (prep.bench.interleaved): median, spread
      ─▶ one Cell per rows and variant; report() is the table, broken() the rows
         whose batch or serial run failed

auto runs warm (its first call calibrates) and is judged against the fastest,
not a contender. Every pool is closed before ``run`` returns: the peers' after
their rows, ``map_rows``' warm ones by :func:`prep.shutdown`.

>>> import torch
>>> from prep.bench import Race
>>> race = Race(rows=(4,), workers=1, repeat=1, executors=("serial", "threads"))
>>> [(c.variant, c.status) for c in race.run(torch.neg, lambda rows: torch.ones(rows, 2))]
[('serial', 'ok'), ('threads', 'ok')]
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import api
from ..errors import ConfigError, ExecutorUnavailable, VmapUnsupported
from ..executors import available_cores
from ..registry import AUTO, EXECUTORS
from .peers import PEERS, PeerRows, session
from .timing import Timing, interleaved, ms, table, times
from .verify import Guard, check, status_of, text

__all__ = ["REFERENCE", "REFUSALS", "Cell", "Race", "broken", "is_count", "label", "report"]

#: the executor every other variant must match, timed in every race
REFERENCE = "serial"
#: what prep raises when it will not run a function on an executor, saying why: a
#: skipped cell, not a finding (vectorized without a twin raises a plain ConfigError)
REFUSALS: tuple[type[Exception], ...] = (ConfigError, ExecutorUnavailable, VmapUnsupported)


def is_count(value: object) -> bool:
    """Whether ``value`` is a positive int (a bool is not one, though Python says it is an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Cell:
    """One variant at one rows per batch: its times, or why it has none.

    ``status`` is ``ok``, ``failed`` (``note`` has the error: a finding) or
    ``skipped`` (``note`` has prep's reason for refusing it).
    """

    rows: int
    variant: str
    status: str
    timing: Timing | None = None
    note: str = ""


@dataclass(frozen=True)
class Race:
    """What ``prep bench`` times: which executors (serial always: it is the reference),
    the peers or not, at which rows per batch and workers, how many interleaved repeats;
    ``timeout`` bounds each call of a prep executor (None, as in ``map_rows``)."""

    rows: tuple[int, ...] = (16, 64, 256)
    workers: int = field(default_factory=available_cores)
    repeat: int = 5
    executors: tuple[str, ...] = tuple(EXECUTORS)
    peers: bool = False
    timeout: float | None = None

    def __post_init__(self) -> None:
        rows = self.rows
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
            raise ConfigError(f"Race(rows={rows!r}) needs a list of row counts; e.g. (16, 64)")
        bad = [n for n in rows if not is_count(n)]
        if bad:
            raise ConfigError(f"rows {bad} are not positive integers; e.g. rows=(16, 64)")
        object.__setattr__(self, "rows", tuple(rows))
        for name in ("workers", "repeat"):
            value = getattr(self, name)
            if not is_count(value):
                raise ConfigError(f"{name}={value!r} is not a positive integer; e.g. {name}=2")
        names = self.executors
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise ConfigError(f"Race(executors={names!r}) needs a list of executor names")
        unknown = [n for n in names if n not in EXECUTORS]
        if unknown:
            raise ConfigError(
                f"executors {', '.join(map(repr, unknown))} unknown; "
                f"choose from {', '.join(EXECUTORS)}"
            )
        object.__setattr__(self, "executors", tuple(dict.fromkeys((REFERENCE, *names))))
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"timeout={self.timeout!r} must be > 0 seconds, or None")

    def variants(self) -> tuple[str, ...]:
        """The executors, then the peers (with ``peers``), in the order they are reported."""
        return (*self.executors, *(PEERS if self.peers else ()))

    def run(
        self,
        fn: Callable[..., Any],
        factory: Callable[[int], Any],
        progress: Callable[[str], None] | None = None,
    ) -> list[Cell]:
        """A Cell per rows and variant; ``progress`` gets a line as each rows is done."""
        cells: list[Cell] = []
        try:
            with session() if self.peers else contextlib.nullcontext():
                for rows in self.rows:
                    found = self._rows(fn, factory, rows)
                    if progress is not None:
                        progress(_progress_line(found))
                    cells += found
        finally:
            api.shutdown()  # the warm pools map_rows started: no worker outlives the race
        return cells

    def _rows(self, fn: Callable[..., Any], factory: Callable[[int], Any], rows: int) -> list[Cell]:
        try:
            batch = factory(rows)
        except Exception as exc:
            note = f"the batch factory failed: {text(exc)}"
            return [Cell(rows, name, "failed", note=note) for name in self.variants()]
        reference = None
        with contextlib.suppress(Exception):  # serial's own first call says why it failed
            reference = api.map_rows(fn, batch, executor=REFERENCE, timeout=self.timeout)
        done: dict[str, Cell] = {}
        with contextlib.ExitStack() as pools:
            calls = self._calls(fn, batch, pools)
            for name, call in list(calls.items()):
                error = check(call, reference, rows)
                if error:
                    done[name] = Cell(rows, name, status_of(error, REFUSALS), note=error)
                    del calls[name]
            guards = {name: Guard(call) for name, call in calls.items()}
            timings = interleaved(guards, repeat=self.repeat, warmup=0) if guards else {}
        for name, guard in guards.items():
            failed = Cell(rows, name, "failed", note=guard.error)
            done[name] = failed if guard.error else Cell(rows, name, "ok", timings[name])
        return [done[name] for name in self.variants()]

    def _calls(
        self, fn: Callable[..., Any], batch: Any, pools: contextlib.ExitStack
    ) -> dict[str, Callable[[], Any]]:
        """A call of no arguments per variant; each peer's pool is closed with ``pools``."""
        calls: dict[str, Callable[[], Any]] = {
            name: functools.partial(
                api.map_rows, fn, batch, executor=name, workers=self.workers, timeout=self.timeout
            )
            for name in self.executors
        }
        rows = PeerRows(fn, samples=False, keywords=isinstance(batch, dict))
        for name in PEERS if self.peers else ():
            pool = PEERS[name].pool(rows, self.workers)
            pools.callback(pool.close)
            calls[name] = functools.partial(pool.run, batch)
        return calls


def label(variant: str) -> str:
    """How a variant reads in the table: a peer by its tool, an executor by its name."""
    peer = PEERS.get(variant)
    return peer.label if peer is not None else variant


def _fastest(cells: Sequence[Cell]) -> Cell | None:
    """The contender with the lowest median (auto is judged against it, not one)."""
    timed = [c for c in cells if c.timing is not None and c.variant != AUTO]
    return min(timed, key=lambda c: c.timing.median if c.timing else 0.0, default=None)


def _progress_line(cells: list[Cell]) -> str:
    best = _fastest(cells)
    line = f"rows={cells[0].rows}: "
    if best is not None and best.timing is not None:
        line += f"fastest {label(best.variant)} {ms(best.timing.median)} ms"
    else:
        line += "no result"
    failed = sum(c.status == "failed" for c in cells)
    return line + (f", {failed} failed" if failed else "")


def broken(cells: Sequence[Cell]) -> list[int]:
    """The rows per batch at which the workload itself failed: its factory or serial raised."""
    return [c.rows for c in cells if c.variant == REFERENCE and c.status == "failed"]


def report(cells: Sequence[Cell]) -> str:
    """The table ``prep bench`` prints: a line per rows and variant, ``*`` on the fastest
    of its rows, each median beside its spread ((max - min) / median) and serial's time
    over it."""
    by_rows: dict[int, list[Cell]] = {}
    for cell in cells:
        by_rows.setdefault(cell.rows, []).append(cell)
    body = []
    for group in by_rows.values():
        best = _fastest(group)
        serial = next((c.timing for c in group if c.variant == REFERENCE and c.timing), None)
        for c in group:
            t = c.timing
            status = "" if c.status == "ok" else c.status.upper() + ": "
            body.append(
                [
                    str(c.rows),
                    ("* " if c is best else "  ") + label(c.variant),
                    ms(t.median) if t else "-",
                    f"{t.spread:.0%}" if t else "-",
                    f"{c.rows / t.median:,.0f}" if t and t.median > 0 else "-",
                    times(serial.median / t.median if serial and t and t.median > 0 else None),
                    status + " ".join(c.note.split()),
                ]
            )
    header = ["rows", "variant", "median ms", "spread", "rows/s", "vs serial", "note"]
    return table(body, header) + f"\n* fastest for its rows ({AUTO} is judged against it)"
