"""What a :class:`~prep.Pool`'s streams share: its workers (those its ``processes`` and
``threads`` executors run ``map_rows`` on), ``auto``'s plan per function and options
(so an epoch loop pays the strategy trial once), and the latest plans, which
``Pool.explain()`` describes.

    Pool.imap ─▶ Streams.open ─▶ Stream(submit=Submitter(plan, Work))
                                   │ split: the pool's map_rows, in the stream's thread;
                                   │        on processes/threads, in parts on their workers
                                   └ whole: on the workers of a flavour (the executor's engine)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from .._batch import check_seeded
from .._kept import keep_newest
from .._progress import CountBar
from ..errors import ConfigError
from ..executors import Executor, traits_of
from ..registry import IN_WORKERS
from .position import Position
from .stats import verdict
from .strategy import StrategyPlan, check_strategy
from .stream import Stream, check_prefetch
from .submit import Submitter, Work

__all__ = ["Streams"]

#: streams whose strategy ``explain()`` describes, the latest last
PLANS = 4
#: functions (with their options) whose auto plan a pool keeps
KEPT = 64


class Streams:
    """One pool's streams: ``workers`` each, on the workers of the pool's executors."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._kept: dict[Any, StrategyPlan] = {}
        self._latest: list[StrategyPlan] = []
        self._stream: weakref.ref[Stream] | None = None  # the latest, while it lives
        self._lock = threading.Lock()

    def plan(self, strategy: str, key: Any, flavours: tuple[str, ...]) -> StrategyPlan:
        """The stream's plan: for ``auto``, the one of earlier streams of the same
        function and options (its trial is paid once per pool)."""
        with self._lock:
            try:
                plan = self._kept.pop(key, None) if strategy == "auto" else None
            except TypeError:  # an unhashable callable: measured each stream
                key, plan = None, None
            if plan is None or plan.flavours != flavours:
                plan = StrategyPlan(strategy, self.workers, flavours)
            if key is not None and strategy == "auto":
                keep_newest(self._kept, key, plan, KEPT)  # popped above: re-inserted newest
            plan.streams += 1
            self._latest = [p for p in self._latest if p is not plan][-(PLANS - 1) :] + [plan]
        return plan

    def prefetch(self, prefetch: Any, strategy: Any, kind: type[Executor]) -> int:
        """``prefetch`` checked; None: two batches per worker where whole batches may
        run (as a DataLoader's prefetch_factor=2 does), else two."""
        if prefetch is not None:
            return check_prefetch(prefetch)
        whole = strategy in ("whole", "auto") and bool(kind.traits.stream_workers)
        whole = whole and self.workers > 1
        return 2 * self.workers if whole else 2

    def open(
        self,
        kind: type[Executor],
        may_fork: bool,
        batches: Iterator[Any],
        prefetch: Any,
        strategy: Any,
        work: Work,
        position: Position | None = None,
        total: int | None = None,
    ) -> Stream:
        """A stream of ``work`` over ``batches``: split batches through the pool's
        executor of ``kind`` (or in parts on its workers), whole ones on the workers of
        a flavour the plan picks; none that starts processes unless ``may_fork``;
        ``position``: where ``batches`` stand (None: at their start); ``total``: the
        batches to come, where known (the bar's end)."""
        flavours = kind.traits.stream_workers
        if not may_fork:  # a DataLoader worker cannot have children
            kept = tuple(f for f in flavours if not traits_of(f).needs_processes)
            flavours = kept or ((IN_WORKERS,) if flavours else ())
        if work.global_draws:  # seed=, and a function that may draw from the global generators
            check_seeded(kind)
            if not kind.traits.shares_generators:
                # threads watch such rows and stop at a draw; processes and serial seed
                # them: auto (or processes) cannot know that the function draws nothing
                # before it has run, so it keeps to workers that give every function rows
                flavours = tuple(f for f in flavours if not traits_of(f).shares_generators)
        prefetch = self.prefetch(prefetch, strategy, kind)
        strategy = check_strategy(strategy, kind, self.workers, prefetch)
        if work.options.out is not None and prefetch != 0:
            raise ConfigError(
                f"out= is one buffer, but imap prepares up to prefetch={prefetch!r} batches "
                f"while you hold the current one: they would overwrite it; drop out= (each "
                f"batch gets its own output), or pass prefetch=0"
            )
        shaping = repr(sorted(work.options.batch_options().items()))  # what shapes a result
        plan = self.plan(strategy, (work.bound, work.samples, shaping), flavours or ("",))
        parts = kind.name if kind.name in flavours else None  # the executor's own workers
        submit = Submitter(plan, work, parts)
        bar = CountBar("batch", total=total) if work.progress else None
        stream = Stream(
            work.split, batches, prefetch, submit=submit, workers=self.workers,
            position=position, bar=bar, strategy=plan.describe,
        )  # fmt: skip
        if bar is not None:
            weakref.finalize(stream, bar.close)
        with self._lock:
            self._stream = weakref.ref(stream)  # what explain() says the loop achieved
        return stream

    def describe(self) -> list[str]:
        """A line for each of the latest streams' strategy, and what the latest stream
        achieved (its rate and the verdict on what bounded it)."""
        with self._lock:
            lines = [p.describe() for p in self._latest]
            stream = self._stream() if self._stream is not None else None
        if stream is not None and (s := stream.stats()).batches:
            rate = s.rows / s.elapsed if s.elapsed > 0 else 0.0
            lines.append(
                f"    latest stream: {s.batches:,} batches, {s.rows:,} rows at {rate:,.0f} "
                f"rows/s; {verdict(s)}"
            )
        return lines
