"""What ``auto`` knows about one signature, and every decision it takes from that.

A :class:`Calibration` holds what was measured (by the calibrator, on the
first batch) and what was observed (every batch auto runs is timed), and
decides from those numbers alone, so the decisions can be tested with
numbers a test chooses:

* :meth:`Calibration.best`: the lowest figure (observed if there is one, else
  predicted); an unobserved pool must be predicted ``POOL_MARGIN`` faster;
* :meth:`Calibration.next_trial`: an executor predicted within ``TRIAL`` of the
  choice and never run is run once, on a whole batch, and judged by its time
  (the calibration's short slices can be wrong, a batch is not);
* :meth:`Calibration.plan_start`: rent or buy a process pool, with its start-up
  measured on this machine: start it once the batches so far would have saved
  what starting it costs (never more than about twice the best in hindsight);
* :meth:`Calibration.drop`: an executor that cannot run here is taken out, with
  the reason (``explain`` prints it).

It is also what ``prep.explain`` returns and ``print`` shows; the cache key of
a choice is :func:`signature`.
"""

from __future__ import annotations

import math
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._rows import Rows
from .._rowwise import unwrap_partial
from ._explain import describe

#: threads or processes are chosen over the rest only when predicted this much faster
#: (the calibration's slices vary by 10-20% on a busy machine); ties go to no pool
POOL_MARGIN = 1.15
POOLS = ("threads", "processes")
#: an executor never run whose prediction is within this factor of the choice's figure
#: is tried on one whole batch
TRIAL = 1.5
#: a measured alternative must beat the current choice by this much to replace it
HYSTERESIS = 1.05
#: observed batch times kept per executor (their median is the figure)
KEEP = 8
#: events kept for ``explain``
EVENTS = 8


@dataclass
class Calibration:
    """What ``auto`` measured and observed for one signature, and what it chose."""

    rows: int
    workers: int
    #: the batch's pad= / on_error= options, as explain prints them ("" for none)
    options: str = ""
    #: seconds setup= took here (each new worker pays it once); 0 without setup=
    setup_seconds: float = 0.0
    serial_row: float = math.nan
    #: seconds per row serially with torch on one worker's share of intra-op threads,
    #: and how many cores' worth torch's own threads made serial faster by
    one_thread_row: float | None = None
    serial_cores: float = 1.0
    vectorized_row: float | None = None
    vmap_row: float | None = None
    thread_speedup: float | None = None
    process_dispatch: float | None = None
    #: seconds starting the process pool costs, measured here (None: not known yet)
    process_start: float | None = None
    bytes_per_row: int = 0
    sample: int = 0
    #: seconds a whole batch of ``rows`` rows is predicted to take, per executor (the
    #: process pool's figure is for a started pool: starting it is ``process_start``)
    predicted: dict[str, float] = field(default_factory=dict)
    #: seconds whole batches took, per executor, scaled to ``rows`` rows
    observed: dict[str, list[float]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    choice: str = "serial"
    seconds: float = 0.0
    #: seconds a started process pool would have saved on the batches run so far
    saved_by_processes: float = 0.0
    batches: int = 0
    #: switches, trials, fallbacks and pool starts, in order, for ``explain``
    events: list[str] = field(default_factory=list)
    #: trial batches run per executor (the first warms it up, the second is timed)
    trials: dict[str, int] = field(default_factory=dict)
    #: pools just started, whose next batch is not counted (their workers warm up)
    warming: set[str] = field(default_factory=set)
    #: False: a batched form ran the first batch without winning outright; the next
    #: batch measures the pools against it
    settled: bool = True
    #: the process pool is up and its workers have loaded the function
    processes_ready: bool = False
    #: the dispatch cost was measured on a running pool (else it is assumed)
    dispatch_measured: bool = False
    #: seconds spent checking that rows run in worker processes equal serial's here
    check_seconds: float = 0.0
    #: when the choice was remembered from an earlier interpreter ("" if measured here)
    remembered: str = ""
    #: the remembered choice: a process pool it names is bought at once
    remembered_choice: str = ""
    #: the key of this signature in the wisdom file (None: not remembered)
    wisdom_key: str | None = None
    #: what was last written to the wisdom file, so that a write happens on a change
    written: Any = None
    #: explain already says that the figures were not remembered (a busy machine)
    busy_noted: bool = False

    # ------------------------------------------------------------ wisdom

    @classmethod
    def from_wisdom(cls, entry: dict[str, Any], workers: int, options: str) -> Calibration:
        """A settled calibration from a remembered entry (see :mod:`.wisdom`)."""
        saved = entry.get("saved")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved)) if saved else "?"
        cal = cls(
            rows=entry["rows"],
            workers=workers,
            options=options,
            predicted={k: float(v) for k, v in entry["figures"].items()},
            remembered=when,
            remembered_choice=entry["choice"],
        )
        for name in ("serial_row", "process_start", "thread_speedup"):
            if isinstance(entry.get(name), (int, float)):
                setattr(cal, name, float(entry[name]))
        cal.choice = entry["choice"] if entry["choice"] in cal.candidates() else cal.best()
        return cal

    def to_wisdom(self) -> dict[str, Any]:
        """What a later interpreter needs to start where this one is."""
        return {
            "choice": self.choice,
            "rows": self.rows,
            "figures": {n: self.figure(n) for n in self.predicted},
            "serial_row": self.serial_row if math.isfinite(self.serial_row) else None,
            "process_start": self.process_start,
            "thread_speedup": self.thread_speedup,
        }

    def wisdom_changed(self) -> bool:
        """Whether the choice or what backs it moved since the last write (a new
        choice, an executor measured for the first time, a pool started, or the
        choice's own figure over 2 and 8 batches)."""
        seen = self.observed.get(self.choice, [])
        now = (self.choice, tuple(sorted(self.observed)), self.processes_ready, len(seen) in (2, 8))
        if now == self.written or not self.settled:
            return False
        self.written = now
        return True

    # ------------------------------------------------------------ figures

    def figure(self, name: str) -> float:
        """Seconds a batch of ``rows`` rows takes with ``name``: observed, else predicted."""
        seen = self.observed.get(name)
        return _median(seen) if seen else self.predicted[name]

    def _cost(self, name: str) -> float:
        # an unobserved pool has to save more than measurement noise to take the cores
        margin = POOL_MARGIN if name in POOLS and not self.observed.get(name) else 1.0
        return self.figure(name) * margin

    def candidates(self) -> list[str]:
        """Executors auto may run now (processes only once started and loaded)."""
        return [n for n in self.predicted if n != "processes" or self.processes_ready]

    def best(self) -> str:
        """The candidate with the lowest figure; the current choice stays unless another
        is clearly better (so noise does not make it flap)."""
        names = self.candidates()
        if not names:
            return "serial"
        best = min(names, key=self._cost)
        if self.choice in names and self._cost(self.choice) <= self._cost(best) * HYSTERESIS:
            return self.choice
        return best

    # ------------------------------------------------------------ decisions

    def observe(self, name: str, seconds: float, rows: int) -> None:
        """A batch of ``rows`` rows took ``seconds`` with ``name``; choose again. The first
        batch of a pool just started is not counted: its workers were still importing
        and building what the function caches (a tokenizer, a model)."""
        if name in self.warming:
            self.warming.discard(name)
            return
        seen = self.observed.setdefault(name, [])
        seen.append(seconds * self.rows / max(1, rows))
        del seen[:-KEEP]
        before = self.choice
        self.choice = self.best()
        if self.choice != before:
            self.note(
                f"batch {self.batches}: {before} -> {self.choice} (measured "
                f"{self.figure(self.choice) * 1e3:,.1f} ms a batch against "
                f"{self.figure(before) * 1e3:,.1f} ms)"
            )

    def next_trial(self) -> str | None:
        """An executor to run the next two batches with, to measure it: never run yet,
        and predicted within ``TRIAL`` of the choice's figure. Its first batch is not
        counted: a cold pool's first batch took twice its warm time (torch.stft on
        a fresh thread pool), and such a figure would rule it out for good."""
        if self.choice not in self.predicted or not self.observed.get(self.choice):
            return None  # the choice runs a whole batch first: trials are judged against it
        limit = TRIAL * self.figure(self.choice)
        for name in sorted(self.candidates(), key=self.figure):
            runs = self.trials.get(name, 0)
            if name == self.choice or runs >= 2 or self.observed.get(name):
                continue
            if self.figure(name) <= limit:
                self.trials[name] = runs + 1
                if runs == 0:
                    # its first whole batch warms it up (a pool's threads, FFT plans,
                    # a first vmap call) and is not its figure: the second one is
                    self.warming.add(name)
                return name
        return None

    def processes_would_save(self, rows: int) -> float:
        """Seconds a started process pool would save over the best other executor on
        ``rows`` rows (counted with ``POOL_MARGIN`` until it has been observed)."""
        others = [n for n in self.candidates() if n != "processes"]
        if self.processes_ready or "processes" not in self.predicted or not others:
            return 0.0
        best = min(self._cost(n) for n in others)
        return max(0.0, best - self.predicted["processes"] * POOL_MARGIN) * rows / self.rows

    def _buy_now(self) -> bool:
        # a pool an earlier interpreter chose, with these figures on this machine,
        # is bought at once: the rent-or-buy is for a pool of unknown worth
        return self.remembered_choice == "processes" and "processes" in self.predicted

    def plan_server(self, cost: float, rows: int) -> bool:
        """Whether to start prep's forkserver (in the background) before this batch.

        It runs in a process of its own. While the best executor is serial on one
        core, the other cores are idle and it costs nothing: it starts at once. While
        another executor keeps every core busy, it takes about ``cost`` seconds of
        their time, so it starts by the rent-or-buy rule of :meth:`plan_start`."""
        if self._buy_now():
            return True
        saving = self.processes_would_save(rows)
        if saving <= 0:
            return False
        others = [n for n in self.candidates() if n != "processes"]
        # free while serial runs on one core and nothing else would use more: threads
        # that beat serial (they release the GIL: torch.stft, PIL) would want every core
        one_core = self.serial_cores < 1.5 and (self.thread_speedup or 1.0) < 1.2
        if min(others, key=self._cost) == "serial" and one_core:
            return True
        self.saved_by_processes += saving
        return self.saved_by_processes >= cost

    def plan_start(self, start: float, rows: int) -> bool:
        """Rent or buy: whether to start the process pool before this batch of ``rows``.

        Each batch run without it adds what it would have saved; the pool starts
        once that sum reaches what starting it costs (``start``, measured here). A
        program that stops then has paid at most twice the best in hindsight; one
        that goes on pays nothing more."""
        if self._buy_now():
            return True
        saving = self.processes_would_save(rows)
        if saving <= 0:
            return False
        self.saved_by_processes += saving
        return self.saved_by_processes >= start

    def started_processes(self, seconds: float) -> None:
        """The pool started (and loaded the function) in ``seconds``; it may be chosen."""
        self.processes_ready = True
        self.warming.add("processes")
        before = self.choice
        self.choice = self.best()
        self.note(
            f"batch {self.batches + 1}: processes started in {seconds * 1e3:,.0f} ms "
            f"(measured), as the {self.saved_by_processes * 1e3:,.0f} ms they would have "
            f"saved paid for it" + (f"; {before} -> {self.choice}" if self.choice != before else "")
        )

    def note(self, event: str) -> None:
        """Remember what happened, for ``explain`` (the last few events)."""
        self.events.append(event)
        del self.events[:-EVENTS]

    def drop(self, name: str, reason: str) -> None:
        """``name`` cannot run here: take it out of the candidates, saying why."""
        self.predicted.pop(name, None)
        self.dropped[name] = reason
        if name == "processes":
            self.processes_ready = False
        if self.choice == name:
            self.choice = self.best()

    def __str__(self) -> str:
        return describe(self)


def _median(values: list[float]) -> float:
    # statistics.median costs microseconds a call; auto asks for a few medians a batch
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ---------------------------------------------------------------- signature


def _value_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), str(v.device))
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return (type(v).__qualname__, id(v))


def _fn_key(fn: Callable[..., Any]) -> Any:
    """Ids stay unique only while their objects live: ``Auto`` keeps ``fn`` (and with
    it everything this key names) alive for as long as it keeps the choice."""
    fn, args, kwargs = unwrap_partial(fn)
    if isinstance(fn, types.MethodType):  # ``obj.method`` is a new object at every access
        method: types.MethodType = fn
        fn, args = method.__func__, (method.__self__, *args)
    return (
        id(fn),
        tuple(map(_value_key, args)),
        tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())),
    )


def signature(fn: Callable[..., Any], rows: Rows, pinned: bool, policy: Any = None) -> Any:
    """What a cached choice is valid for (everything but the number of rows); with
    ``pad=`` or ``on_error=`` another choice (they rule batched forms in or out)."""
    return (_fn_key(fn), rows.layout(), pinned, repr(policy))
