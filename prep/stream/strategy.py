"""How a stream runs its batches: split each across the workers, or whole batches per worker.

``split`` runs each batch on every worker: through the pool's executor, as
``map_rows`` does, one batch at a time, so each batch ends at a barrier (the
workers idle while the slowest range finishes, then the parent merges and
dispatches the next); on ``processes`` or ``threads``, one part per worker on the
workers, several batches in flight and no barrier (``prep.executors.Parts``). ``whole``
gives each worker whole batches, several in flight, as the DataLoader does: no
barrier, but a batch takes one worker's time for all its rows. ``auto`` measures
both on the stream itself and keeps the faster; :func:`choose_strategy` is that
decision, a pure function of the figures, so that it can be tested with figures
of any machine.

The figures are rates in rows per second, each the median over a few batches:

- ``split``: a batch's rows over the time the pool took to run it; split into
  parts, as whole batches are rated (below), from the parts;
- ``whole``: the rows a second while every worker was building a batch at once,
  from the workers' own start and end times (so a slow consumer does not hide
  it, and threads that take turns at the GIL show as such); where the workers
  never ran together long enough to tell, ``workers`` times one worker's rate
  for processes, and one worker's rate for threads (whether their rows share
  the GIL was not seen, so no sharing is assumed). Capped by the rate at which
  the stream's thread takes finished batches in (receiving the output, padding
  it, moving it to the device), which it does one at a time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._choose import choose
from ..errors import ConfigError
from ..executors import Executor, traits_of
from ..registry import EXECUTORS

__all__ = [
    "STRATEGIES",
    "Arm",
    "StrategyChoice",
    "StrategyFigures",
    "StrategyPlan",
    "check_strategy",
    "choose_strategy",
]

STRATEGIES = ("split", "whole", "auto")
#: whole must beat split by this factor to be chosen (split holds less memory per batch)
MARGIN = 1.05


def _independent(flavour: str) -> bool:
    """Whether the workers of ``flavour`` share no lock (processes; threads share the GIL)."""
    return traits_of(flavour).needs_processes


def check_strategy(strategy: object, kind: type[Executor], workers: int, prefetch: int) -> str:
    """The strategy a stream runs: ``strategy`` checked against the pool, ``auto``
    reduced to ``split`` where whole batches cannot help."""
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy={strategy!r} is not one of {', '.join(map(repr, STRATEGIES))}; "
            f"'split' runs each batch across all workers, 'whole' gives each worker whole "
            f"batches (as a DataLoader does), 'auto' measures both on the stream"
        )
    flavours, executor = kind.traits.stream_workers, kind.name
    if strategy == "whole" and not flavours:
        some = " or ".join(repr(n) for n, c in EXECUTORS.items() if c.traits.stream_workers)
        raise ConfigError(
            f"strategy='whole' gives each worker whole batches, but executor={executor!r} "
            f"has no workers to give them to; use executor={some}, or strategy='split'"
        )
    if strategy == "whole" and prefetch == 0:
        raise ConfigError(
            "strategy='whole' keeps several batches in flight, but prefetch=0 runs each "
            "batch in your loop's thread; pass prefetch >= 1 (two per worker keep every "
            "worker busy), or strategy='split'"
        )
    if strategy == "auto" and (not flavours or prefetch < 2 or workers < 2):
        return "split"  # nothing to gain: one worker, or no batches in flight to share
    assert isinstance(strategy, str)
    return strategy


@dataclass(frozen=True)
class StrategyFigures:
    """What a stream measured, in rows per second (None: not measured)."""

    workers: int
    split: float | None = None  # a batch split across the workers
    whole_worker: float | None = None  # one worker building a whole batch
    whole_take: float | None = None  # the stream's thread taking a finished batch in
    whole_together: float | None = None  # all the workers building batches at once
    independent: bool = True  # workers that share no lock (processes, not threads)

    @property
    def whole_built(self) -> float | None:
        """The rate at which the workers build whole batches: as seen while they all ran
        at once, else one worker's rate scaled where the workers are independent."""
        if self.whole_worker is None:
            return None
        if self.whole_together is not None:
            return self.whole_together
        return self.whole_worker * (self.workers if self.independent else 1)

    @property
    def whole(self) -> float | None:
        """The stream's rate with whole batches: as built, capped by the taking."""
        built = self.whole_built
        if built is None or self.whole_take is None:
            return None
        return min(built, self.whole_take)


@dataclass(frozen=True)
class StrategyChoice:
    strategy: str
    reason: str
    flavour: str = ""  # what builds the whole batches, where the strategy is whole


def choose_strategy(f: StrategyFigures, flavour: str = "") -> StrategyChoice:
    """``whole`` if its rate beats ``split``'s by ``MARGIN``, else ``split``;
    ``flavour`` names what built the whole batches (and is the choice's)."""
    whole, split = f.whole, f.split
    if whole is None:
        return StrategyChoice("split", "whole batches were not measured")
    on = f" on {flavour}" if flavour else ""
    who = flavour or "workers"
    if f.whole_together is not None:
        built = f"as {f.workers} {who} built batches at once"
    elif f.independent:
        built = f"{f.workers} x one worker's {f.whole_worker:,.0f}"
    else:
        built = f"one worker's {f.whole_worker:,.0f}: the {who} were never seen running together"
    detail = f"{built}; taken in at up to {f.whole_take:,.0f} rows/s"
    if split is None:
        return StrategyChoice(
            "whole", f"whole batches{on}: {whole:,.0f} rows/s ({detail})", flavour
        )
    seconds = {"split": _per_row(split), "whole": _per_row(whole)}
    if choose(seconds, "split", MARGIN).name == "whole":  # seconds a row, each way
        return StrategyChoice(
            "whole",
            f"whole batches{on}: {whole:,.0f} rows/s ({detail}), {whole / split:.2f}x "
            f"splitting each batch ({split:,.0f} rows/s)",
            flavour,
        )
    return StrategyChoice(
        "split",
        f"splitting each batch: {split:,.0f} rows/s; whole batches{on}: {whole:,.0f} rows/s "
        f"({detail}), under {MARGIN:.2f}x that",
    )


def _per_row(rate: float) -> float:
    return 1 / rate if rate > 0 else math.inf


def choose_among(figures: dict[str, StrategyFigures]) -> StrategyChoice:
    """The fastest whole flavour of ``figures`` (flavour -> its figures, each with the
    same split rate) against split, by :func:`choose_strategy`; the others named."""
    rated = {k: f for k, f in figures.items() if f.whole is not None}
    if not rated:
        return StrategyChoice("split", "whole batches were not measured")
    best = max(rated, key=lambda k: rated[k].whole or 0.0)
    choice = choose_strategy(rated[best], best if len(figures) > 1 else "")
    others = [f"on {k}: {f.whole:,.0f} rows/s" for k, f in rated.items() if k != best]
    if not others:
        return choice
    return StrategyChoice(
        choice.strategy, f"{choice.reason}; whole batches {', '.join(others)}", choice.flavour
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def together(spans: list[tuple[float, float, int]], workers: int) -> float | None:
    """Rows a second while at least ``workers`` of ``spans`` (``(start, end, rows)`` of
    each batch, on one clock) ran at once: each batch's rows spread evenly over its
    span, the rows built in those stretches over their length. None when they add up
    to less than half a batch's median span (too little to tell)."""
    if len(spans) < workers:
        return None
    edges = sorted({t for s, e, _ in spans for t in (s, e)})
    seconds = rows = 0.0
    for a, b in zip(edges, edges[1:]):
        running = [n / (e - s) for s, e, n in spans if s <= a and e >= b and e > s]
        if len(running) >= workers:
            seconds += b - a
            rows += sum(running) * (b - a)
    if seconds <= 0 or seconds < 0.5 * statistics.median(e - s for s, e, _ in spans):
        return None
    return rows / seconds


@dataclass
class Arm:
    """What one way of running a stream's batches measured: split, or whole batches on
    one flavour of workers. Rates are rows a second."""

    submitted: int = 0  # batches sent this way
    taken: int = 0  # of those, taken in by the stream
    batch_rates: list[float] = field(default_factory=list)  # a batch run at once (split)
    worker_rates: list[float] = field(default_factory=list)  # one worker, a batch or part
    take_rates: list[float] = field(default_factory=list)  # the stream taking them in
    # (start, end, rows) of each batch or part as its worker saw it (time.monotonic)
    spans: list[tuple[float, float, int]] = field(default_factory=list)

    def figures(self, workers: int, split: float | None, independent: bool) -> StrategyFigures:
        """Its figures, as whole batches are rated (``split``: the split rate beside)."""
        return StrategyFigures(
            workers,
            split,
            _median(self.worker_rates),
            _median(self.take_rates),
            together(self.spans, workers),
            independent,
        )

    def note(self, rows: int, busy: float | None, take: float, span: Any) -> None:
        """A batch (or part) of ``rows``: its worker's ``busy`` seconds and ``span``, and
        the stream's ``take`` seconds to take it in; where measurable."""
        if not busy or take <= 0:
            return
        self.worker_rates.append(rows / busy)
        self.take_rates.append(rows / take)
        if span is not None:
            self.spans.append((span[0], span[1], rows))


@dataclass
class StrategyPlan:
    """Which strategy each batch of one stream takes. Fixed, or ``auto``: batches
    split, untimed, while any flavour's workers start; then a few split (the first
    one untimed: auto's calibration, a pool's start), then
    whole batches on each of ``flavours`` in turn (the first ``workers`` of each
    untimed: each worker's start and setup=), then :func:`choose_among` on the
    medians, kept for the rest of the stream. A pool keeps one plan per function and
    options across its streams, so a trial that a short stream left unfinished goes
    on in the next one, and an epoch loop pays it once."""

    strategy: str
    workers: int
    flavours: tuple[str, ...] = ("processes",)  # what may build whole batches
    SPLIT_TRIAL = 3
    #: whole batches timed on each flavour before the choice (after ``workers``)
    whole_trial: ClassVar[int] = 3
    split: Arm = field(default_factory=Arm)
    whole: dict[str, Arm] = field(default_factory=dict)  # by flavour
    choice: StrategyChoice | None = None
    streams: int = 0  # the streams it has planned
    flavour: str = ""  # what builds the next whole batch
    timed: bool = True  # whether the batch of the last next() counts towards the trial
    starting: int = 0  # batches split, untimed, while workers started

    def __post_init__(self) -> None:
        self.flavour = self.flavours[0]
        self.whole = {f: Arm() for f in self.flavours}

    def measuring(self) -> bool:
        """Whether ``auto``'s trial is on (every flavour's workers must be ready first)."""
        return self.strategy == "auto" and self.choice is None

    def _tried(self, flavour: str) -> bool:
        return len(self.whole[flavour].worker_rates) >= self.whole_trial

    def trial_flavour(self) -> str:
        """The first flavour whose timed batches are not all taken in (else the last).
        Taken, not submitted: the next flavour's workers start (a process each) only
        once this one's figures are in, so that the start is not in them."""
        return next((f for f in self.flavours if not self._tried(f)), self.flavours[-1])

    def next(self, ready: bool = True) -> str:
        """The strategy of the next batch submitted ("split" or "whole"; :attr:`flavour`
        says what builds a whole one). While any flavour's workers are not ``ready``
        (prep's forkserver starting in the background: seconds of a core), ``auto``
        splits and times nothing (:attr:`timed` is False): the stream never waits for
        a trial, and no figure is taken while a start shares the cores."""
        self.timed = True
        if self.strategy != "auto":
            name = self.strategy
        elif self.choice is not None:
            name = self.choice.strategy
            self.flavour = self.choice.flavour or self.flavour
        elif not ready:
            self.timed, self.starting = False, self.starting + 1
            return "split"
        else:
            if self.split.submitted >= self.SPLIT_TRIAL:
                self.flavour = self.trial_flavour()
            name = "split" if self.split.submitted < self.SPLIT_TRIAL else "whole"
        (self.split if name == "split" else self.whole[self.flavour]).submitted += 1
        return name

    def split_ran(self, rows: int, seconds: float) -> None:
        """A split batch of ``rows`` that the pool ran in ``seconds`` (the first is not
        counted: a pool's start, auto's calibration)."""
        if self.split.submitted > 1 and seconds > 0:
            self.split.batch_rates.append(rows / seconds)

    def split_taken(self, rows: int, take: float, spans: list[tuple[float, float, int]]) -> None:
        """A split batch of ``rows`` whose parts ran on the whole-batch workers (``spans``:
        each part's start, end and rows on the clock of ``time.monotonic``), taken in by
        the stream in ``take`` seconds. Rated as whole batches are, since its parts
        overlap the next batch's; the first one is not (the workers' start)."""
        self.split.taken += 1
        if not self.measuring() or self.split.taken <= 1:
            return
        for start, end, n in spans:  # each part's share of the taking
            self.split.note(n, end - start, take * n / rows, (start, end))

    def split_rate(self) -> float | None:
        """Split's rows a second: a batch's rows over the time the pool took for it, or,
        split into parts on the workers, as whole batches are rated (the parts ran on
        the pool's own flavour, the plan's only one)."""
        if not self.split.spans:
            return _median(self.split.batch_rates)
        independent = _independent(self.flavours[0])
        return self.split.figures(self.workers, None, independent).whole

    def whole_taken(
        self,
        rows: int,
        busy: float | None,
        take: float,
        flavour: str = "",
        span: tuple[float, float] | None = None,
    ) -> None:
        """A whole batch of ``rows``, which its worker built in ``busy`` seconds (from
        ``span``'s start to its end, on the clock of ``time.monotonic``) and the stream
        took in ``take``."""
        flavour = flavour or self.flavours[0]
        arm = self.whole[flavour]
        arm.taken += 1
        if not self.measuring() or self._tried(flavour) or arm.taken <= self.workers:
            return  # a worker's first batch pays its start; a choice made needs no more
        arm.note(rows, busy, take, span)
        if all(self._tried(f) for f in self.flavours):
            self.choice = choose_among(self.all_figures())

    def all_figures(self) -> dict[str, StrategyFigures]:
        split = self.split_rate()
        return {
            f: arm.figures(self.workers, split, _independent(f)) for f, arm in self.whole.items()
        }

    def describe(self) -> str:
        """A line for ``Pool.explain()``."""
        counts = [("split while workers started", self.starting), ("split", self.split.submitted)]
        counts += [(f"whole on {f}", arm.submitted) for f, arm in self.whole.items()]
        ran = ", ".join(f"{k} {v}" for k, v in counts if v)
        if self.strategy != "auto":
            return f"stream: strategy={self.strategy!r}; batches: {ran or 'none yet'}"
        if self.choice is None:
            each = self.workers + self.whole_trial
            return (
                f"stream: strategy='auto', still measuring (batches: {ran or 'none yet'}); "
                f"it needs {self.SPLIT_TRIAL} split and {each} whole batches on each of "
                f"{', '.join(self.flavours)}"
            )
        streams = f" ({self.streams} streams of this function)" if self.streams > 1 else ""
        return (
            f"stream: strategy='auto' chose {self.choice.strategy}{streams}: {self.choice.reason}"
        )
