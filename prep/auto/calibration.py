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

import time
import types
from collections.abc import Callable
from typing import Any

import torch

from .._rows import Rows
from .._rowwise import unwrap_partial
from ._explain import describe
from ._figures import KEEP, Figures

#: an executor never run whose prediction is within this factor of the choice's figure
#: is tried on one whole batch
TRIAL = 1.5
#: a measured alternative must beat the current choice by this much to replace it
HYSTERESIS = 1.05


class Calibration(Figures):
    """The figures of one signature (:class:`~prep.auto._figures.Figures`), and every
    decision auto takes from them."""

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
        )
        for name in ("serial_row", "process_start", "thread_speedup"):
            if isinstance(entry.get(name), (int, float)):
                setattr(cal, name, float(entry[name]))
        cal.choice = entry["choice"] if entry["choice"] in cal.candidates() else cal.best()
        # each figure was a whole batch's in the run that wrote it: none is tried again
        # (two batches each would cost a short program more than calibrating); the
        # choice's own batches are timed, and it moves when they run off
        cal.trials = dict.fromkeys(cal.predicted, 2)
        return cal

    # ------------------------------------------------------------ decisions

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

    def plan_server(self, cost: float, rows: int) -> bool:
        """Whether to start prep's forkserver (in the background) before this batch.

        It runs in a process of its own. While the best executor is serial on one
        core, the other cores are idle and it costs nothing: it starts at once. While
        another executor keeps every core busy, it takes about ``cost`` seconds of
        their time, so it starts by the rent-or-buy rule of :meth:`plan_start`."""
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
