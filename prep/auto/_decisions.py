"""Every decision ``auto`` takes for one signature, from its figures alone.

:class:`Decisions` reads and moves a :class:`~prep.auto.Calibration` (the report
a user reads: the figures, the choice, the events), and keeps to itself what only
deciding needs (trial counts, pools warming up, the probe of a pool's first rows,
the last wisdom write). It decides from numbers alone, so the tests feed it
numbers a test chooses:

* :meth:`Decisions.best`: the lowest figure (observed if there is one, else
  predicted); an unobserved pool must be predicted ``POOL_MARGIN`` faster;
* :meth:`Decisions.next_trial`: an executor predicted within ``TRIAL`` of the
  choice and never run is run once, on a whole batch, and judged by its time
  (the calibration's short slices can be wrong, a batch is not);
* :meth:`Decisions.plan_start`: rent or buy an executor that costs a start (a
  process pool: ``CostModel.rent_or_buy``), with its start-up measured on this
  machine: start it once the batches so far would have saved what starting it
  costs (never more than about twice the best in hindsight);
* :meth:`Decisions.drop`: an executor that cannot run here is taken out, with
  the reason (``explain`` prints it).
"""

from __future__ import annotations

import time
from typing import Any

from .._choose import choose
from . import wisdom
from ._figures import KEEP
from .calibration import Calibration

#: an executor never run whose prediction is within this factor of the choice's figure
#: is tried on one whole batch
TRIAL = 1.5
#: a measured alternative must beat the current choice by this much to replace it
HYSTERESIS = 1.05


class Decisions:
    """Chooses for one signature, writing each choice and event into ``cal``."""

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal
        #: trial batches run per executor (the first warms it up, the second is timed)
        self.trials: dict[str, int] = {}
        #: pools just started, whose next batch is not counted (their workers warm up)
        self.warming: set[str] = set()
        #: executors whose workers' rows have been compared with serial's (or could not be)
        self.checked: set[str] = set()
        #: (job, probe): copies of the rows a pool started for, and serial's results
        self.probe: Any = None
        #: the key of this signature in the wisdom file (None: not remembered)
        self.wisdom_key: str | None = None
        #: what backed the choice at the last wisdom write, so that a write happens on a change
        self.written: Any = None
        #: explain already says that the figures were not remembered (a busy machine)
        self.busy_noted = False

    @classmethod
    def from_wisdom(cls, entry: dict[str, Any], workers: int, options: str) -> Decisions:
        """A settled calibration from a remembered entry (see :mod:`.wisdom`)."""
        saved = entry.get("saved")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved)) if saved else "?"
        cal = Calibration(
            rows=entry["rows"],
            workers=workers,
            options=options,
            predicted={k: float(v) for k, v in entry["figures"].items()},
            remembered=when,
        )
        if isinstance(entry.get("serial_row"), (int, float)):
            cal.serial_row = float(entry["serial_row"])
        cal.start, cal.speedup = wisdom.named(entry, "start"), wisdom.named(entry, "speedup")
        decisions = cls(cal)
        cal.choice = entry["choice"] if entry["choice"] in cal.candidates() else decisions.best()
        # each figure was a whole batch's in the run that wrote it: none is tried again
        # (two batches each would cost a short program more than calibrating); the
        # choice's own batches are timed, and it moves when they run off
        decisions.trials = dict.fromkeys(cal.predicted, 2)
        # what is remembered is written already: the choice's own first batches here
        # are no reason to write it again (a short program's batches would wait for it)
        decisions.written = (cal.choice, (cal.choice,), tuple(sorted(cal.started)), False)
        return decisions

    def best(self) -> str:
        """The candidate with the lowest figure; the current choice stays unless another
        is clearly better (so noise does not make it flap)."""
        cal = self.cal
        names = cal.candidates()
        if not names:
            return "serial"
        return choose({n: cal.cost(n) for n in names}, cal.choice, HYSTERESIS).name

    def observe(self, name: str, seconds: float, rows: int) -> None:
        """A batch of ``rows`` rows took ``seconds`` with ``name``; choose again. The first
        batch of a pool just started is not counted: its workers were still importing
        and building what the function caches (a tokenizer, a model)."""
        cal = self.cal
        if name in self.warming:
            self.warming.discard(name)
            return
        seen = cal.observed.setdefault(name, [])
        seen.append(seconds * cal.rows / max(1, rows))
        del seen[:-KEEP]
        before = cal.choice
        cal.choice = self.best()
        if cal.choice != before:
            cal.events.append(
                f"batch {cal.batches}: {before} -> {cal.choice} (measured "
                f"{cal.figure(cal.choice) * 1e3:,.1f} ms a batch against "
                f"{cal.figure(before) * 1e3:,.1f} ms)"
            )

    def next_trial(self) -> str | None:
        """An executor to run the next two batches with, to measure it: never run yet,
        and predicted within ``TRIAL`` of the choice's figure. Its first batch is not
        counted: a cold pool's first batch took twice its warm time (torch.stft on
        a fresh thread pool), and such a figure would rule it out for good."""
        cal = self.cal
        if cal.choice not in cal.predicted or not cal.observed.get(cal.choice):
            return None  # the choice runs a whole batch first: trials are judged against it
        limit = TRIAL * cal.figure(cal.choice)
        for name in sorted(cal.candidates(), key=cal.figure):
            runs = self.trials.get(name, 0)
            if name == cal.choice or runs >= 2 or cal.observed.get(name):
                continue
            if cal.figure(name) <= limit:
                self.trials[name] = runs + 1
                if runs == 0:
                    # its first whole batch warms it up (a pool's threads, FFT plans,
                    # a first vmap call) and is not its figure: the second one is
                    self.warming.add(name)
                return name
        return None

    def plan_warm_up(self, name: str, cost: float, rows: int) -> bool:
        """Whether to warm ``name`` up (in the background) before this batch: what makes
        its start-up known (prep's forkserver, for processes).

        It runs in a process of its own. While the best executor is serial on one
        core, the other cores are idle and it costs nothing: it starts at once. While
        another executor keeps every core busy, it takes about ``cost`` seconds of
        their time, so it starts by the rent-or-buy rule of :meth:`plan_start`."""
        cal = self.cal
        saving = cal.would_save(name, rows)
        if saving <= 0:
            return False
        others = [n for n in cal.candidates() if n != name]
        # free while serial runs on one core and nothing else would use more: a pool
        # that beats serial (threads release the GIL: torch.stft, PIL) would want every core
        one_core = cal.serial_cores < 1.5 and max(cal.speedup.values(), default=1.0) < 1.2
        if min(others, key=cal.cost) == "serial" and one_core:
            return True
        return self._saved(name, saving) >= cost

    def plan_start(self, name: str, start: float, rows: int) -> bool:
        """Rent or buy: whether to start ``name`` before this batch of ``rows``.

        Each batch run without it adds what it would have saved; it starts once that
        sum reaches what starting it costs (``start``, measured here). A program
        that stops then has paid at most twice the best in hindsight; one that goes
        on pays nothing more."""
        saving = self.cal.would_save(name, rows)
        return saving > 0 and self._saved(name, saving) >= start

    def _saved(self, name: str, saving: float) -> float:
        """``saving`` added to what ``name`` would have saved so far; the sum."""
        saved = self.cal.saved
        saved[name] = saved.get(name, 0.0) + saving
        return saved[name]

    def started(self, name: str, seconds: float) -> None:
        """``name`` started (and loaded the function) in ``seconds``; it may be chosen."""
        cal = self.cal
        cal.started.add(name)
        self.warming.add(name)
        before = cal.choice
        cal.choice = self.best()
        cal.events.append(
            f"batch {cal.batches + 1}: {name} started in {seconds * 1e3:,.0f} ms "
            f"(measured), as the {cal.saved.get(name, 0.0) * 1e3:,.0f} ms they would have "
            f"saved paid for it" + (f"; {before} -> {cal.choice}" if cal.choice != before else "")
        )

    def drop(self, name: str, reason: str) -> None:
        """``name`` cannot run here: take it out of the candidates, saying why."""
        cal = self.cal
        cal.predicted.pop(name, None)
        cal.dropped[name] = reason
        cal.started.discard(name)
        if cal.choice == name:
            cal.choice = self.best()

    def wisdom_changed(self) -> bool:
        """Whether the choice or what backs it moved since the last write to wisdom."""
        now = self.cal.backing()
        if now == self.written or not self.cal.settled:
            return False
        self.written = now
        return True


__all__ = ["HYSTERESIS", "TRIAL", "Decisions"]
