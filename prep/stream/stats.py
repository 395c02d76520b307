"""What a stream measured (:meth:`Stream.stats`), and the one sentence that says what
bounds the loop (:func:`verdict`).

The figures are kept always: a few clock reads and additions a batch, on the side
that already handles it, and a reservoir of the loop's waits of fixed size::

    producer thread                         consumer (the loop)
    ───────────────                         ───────────────────
    t = clock; next(batches)  → source      next(stream): the wait, until a batch is there
    submit(batch); deliver    → busy        ... your step ...: between, until next() again
    the result's rows, busy, source ride with it through the queue, counted when taken

- the loop's time is its ``wait`` plus its time ``between`` batches; ``wait_share`` is
  the part of it spent in ``next()``;
- the stream's time (``elapsed``) runs from its start to the last batch taken; the
  ``source`` and ``busy`` shares are of it;
- ``busy`` is the pool's busy seconds: each ticket's worker seconds over the stream's
  workers (whole batches, and split ones in parts), or, for a batch run in the
  producer's thread (split through the pool's executor), that thread's run time,
  when the whole pool works on that batch.

The rule (:func:`verdict`), in order, its thresholds the constants below:

1. the loop waited less than ``WAIT_COMPUTE`` of its time: **compute-bound**. Where
   the machine's cores were busy ``SATURATED`` of the time or more, and the data side
   kept ``COMPETES`` cores or more busy, it competes with the step for them: a loader
   that looks fast while it slows training, which waits alone cannot show. Else the
   workers busy less than ``BUSY_SPARE`` of the time can spare one;
2. else the producer spent at least ``SOURCE_BOUND`` of the time in ``batches``:
   **source-bound** (more workers would not help: the batches come no faster);
3. else **data-bound**: with the workers busy at least ``BUSY_DATA``, more workers
   or a cheaper row function would help; below it, the workers idle while the loop
   waits: the stream's own thread (sending and merging batches) or too small a
   ``prefetch`` is the limit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BUSY_DATA",
    "BUSY_SPARE",
    "COMPETES",
    "RESERVOIR",
    "SATURATED",
    "SOURCE_BOUND",
    "WAIT_COMPUTE",
    "BatchFigures",
    "Meter",
    "StreamStats",
    "clock",
    "rows_in",
    "verdict",
]

#: the loop waited less than this share of its time: compute-bound
WAIT_COMPUTE = 0.10
#: the producer spent at least this share of the stream's time in ``batches``: source-bound
SOURCE_BOUND = 0.50
#: data-bound with the workers busy at least this share: they are the limit
BUSY_DATA = 0.80
#: compute-bound with the workers busy less than this share: one can be spared
BUSY_SPARE = 0.50
#: the machine's cores busy at least this share of the stream's time: saturated
SATURATED = 0.90
#: the data side's cores (its workers' busy seconds and the source's, a second) from
#: which, on a saturated machine, it competes with the step
COMPETES = 0.5
#: the loop's waits kept for the median and 95th percentile (a uniform sample of all)
RESERVOIR = 512

#: the figures' clock, read as ``stats.clock()`` wherever they are timed (so that a test
#: can make one side of a stream slow by moving it on, without waiting for real)
clock = time.perf_counter


def cpu_times() -> tuple[int, int, int] | None:
    """Every core's busy and total time since boot (in ticks), and the cores, from
    Linux's /proc/stat: what the whole machine did, this process, its workers and the
    rest (None where there is no /proc/stat). Read twice a stream, as ``clock`` is
    read wherever it is timed (so a test can say how busy the machine was)."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        ticks = [int(x) for x in lines[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    idle = ticks[3] + ticks[4]  # idle and waiting for I/O
    return sum(ticks) - idle, sum(ticks), cores


@dataclass(frozen=True)
class StreamStats:
    """A stream's figures so far; ``str()`` gives them with the verdict.

    Seconds are totals over the batches delivered; ``busy`` is in pool seconds (see
    :mod:`prep.stream.stats`); ``fill`` is the mean number of batches ready in the
    queue when the loop asked for one (out of ``prefetch``).

    >>> from prep.stream.stats import StreamStats
    >>> s = StreamStats(batches=10, rows=640, wait_median=0.0, wait_p95=0.001,
    ...     wait_total=0.002, between_total=1.0, source_total=0.01, busy_total=0.2,
    ...     elapsed=1.0, fill=1.9, prefetch=2, workers=2)
    >>> str(s).splitlines()[-1]
    'compute-bound: batches were ready 100% of the time; the data side can spare a worker'
    """

    batches: int
    rows: int
    wait_median: float
    wait_p95: float
    wait_total: float
    between_total: float
    source_total: float
    busy_total: float
    elapsed: float
    fill: float
    prefetch: int
    workers: int
    #: the share of the machine's time its cores were busy over the stream (None: not known)
    machine_busy: float | None = None
    cores: int = 0

    @property
    def data_cores(self) -> float:
        """The cores the data side kept busy: its workers' busy seconds and the
        source's, over the stream's time."""
        spent = self.busy_total * self.workers + self.source_total
        return spent / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """The share of the loop's time spent waiting in ``next()``."""
        loop = self.wait_total + self.between_total
        return self.wait_total / loop if loop > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """The share of the stream's time the workers were busy."""
        return min(1.0, self.busy_total / self.elapsed) if self.elapsed > 0 else 0.0

    @property
    def source_share(self) -> float:
        """The share of the stream's time the producer spent pulling from ``batches``."""
        return min(1.0, self.source_total / self.elapsed) if self.elapsed > 0 else 0.0

    def __str__(self) -> str:
        return "\n".join(
            [
                f"{self.batches:,} batches, {self.rows:,} rows in {_seconds(self.elapsed)}",
                f"the loop waited {_seconds(self.wait_total)} ({self.wait_share:.0%} of its "
                f"time; a batch: median {_seconds(self.wait_median)}, 95th percentile "
                f"{_seconds(self.wait_p95)}) and worked {_seconds(self.between_total)}",
                f"workers ({self.workers}) busy {self.busy_share:.0%}; in the source "
                f"{_seconds(self.source_total)} ({self.source_share:.0%}); ready when asked "
                f"{self.fill:.1f} of prefetch={self.prefetch}",
                *self._machine(),
                verdict(self),
            ]
        )

    def _machine(self) -> list[str]:
        if self.machine_busy is None:
            return []
        return [
            f"the machine's {self.cores} cores busy {self.machine_busy:.0%}; the data side "
            f"kept {self.data_cores:.1f} of them busy"
        ]


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:,.2f} s"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def verdict(s: StreamStats) -> str:
    """What bounds the loop, in one sentence, by the rule in this module's docstring."""
    if s.batches == 0:
        return "no batch delivered yet: nothing to judge"
    waited, busy, source = s.wait_share, s.busy_share, s.source_share
    if waited < WAIT_COMPUTE:
        if s.machine_busy is not None and s.machine_busy >= SATURATED and s.data_cores >= COMPETES:
            return (
                f"compute-bound, but the machine's {s.cores} cores were busy "
                f"{s.machine_busy:.0%} and the data side kept {s.data_cores:.1f} of them "
                f"busy: it competes with your step for the cores, so the step may run "
                f"slower than alone; compare your steps/s with fewer workers"
            )
        if busy < BUSY_SPARE:
            return (
                f"compute-bound: batches were ready {1 - waited:.0%} of the time; "
                f"the data side can spare a worker"
            )
        return (
            f"compute-bound: batches were ready {1 - waited:.0%} of the time; the workers "
            f"were busy {busy:.0%}: keep them"
        )
    if source >= SOURCE_BOUND:
        return (
            f"source-bound: the workers waited on your iterator {source:.0%} of the time: "
            f"a faster source (more DataLoader workers, cached reads) would help, more "
            f"prep workers would not"
        )
    if busy >= BUSY_DATA:
        return (
            f"data-bound: the loop waited {waited:.0%} of its time; the workers were busy "
            f"{busy:.0%}: more workers or a cheaper row function would help"
        )
    return (
        f"data-bound: the loop waited {waited:.0%} of its time while the workers were "
        f"busy {busy:.0%}: the stream's own thread (sending and merging batches) is the "
        f"limit; a larger prefetch= or strategy='whole' may help"
    )


def rows_in(result: Any) -> int:
    """The rows of one batch's result: dim 0 of a Tensor, of the first of a tuple or
    dict (several outputs, or ``return_lengths=``'s pair), else its length (0: none)."""
    while isinstance(result, (tuple, Mapping)) and result:
        result = next(iter(result.values())) if isinstance(result, Mapping) else result[0]
    if isinstance(result, torch.Tensor):
        return int(result.shape[0]) if result.dim() else 1
    return len(result) if isinstance(result, Sized) else 0


@dataclass(frozen=True)
class BatchFigures:
    """What the producer measured of one batch, handed over with its result."""

    rows: int
    source: float  # seconds in next(batches)
    busy: float  # pool seconds its workers (or the producer's thread) spent on it


class Meter:
    """The consumer's side of the bookkeeping, updated in ``next()`` only: counts and
    sums, and a fixed-size uniform sample of the waits (a private generator: the
    process's ``random`` is left alone)."""

    def __init__(self, prefetch: int, workers: int) -> None:
        self.prefetch, self.workers = prefetch, workers
        self.start = self.last_taken = clock()
        self.batches = self.rows = self.ready = 0
        self.wait = self.between = self.source = self.busy = 0.0
        self.returned: float | None = None  # when the loop got its last batch
        self.machine = cpu_times()
        self.waiting = False  # whether the loop is in next(), between asked() and took()
        self.waits: list[float] = []
        self._rng = random.Random(0)

    def asked(self) -> float:
        """The loop called ``next()``: its work since the last batch ends now."""
        now = clock()
        if self.returned is not None:
            self.between += now - self.returned
            self.returned = None
        self.waiting = True
        return now

    def took(self, since: float, ready: int, figures: BatchFigures) -> None:
        """The loop gets a batch it asked for at ``since``, with ``ready`` in the queue."""
        now = self.returned = self.last_taken = clock()
        self.waiting = False
        wait = now - since
        self.batches += 1
        self.rows += figures.rows
        self.ready += ready
        self.wait += wait
        self.source += figures.source
        self.busy += figures.busy
        if len(self.waits) < RESERVOIR:
            self.waits.append(wait)
        else:  # Algorithm R: each wait stays with chance RESERVOIR / batches
            slot = self._rng.randrange(self.batches)
            if slot < RESERVOIR:
                self.waits[slot] = wait

    def stats(self) -> StreamStats:
        waits = sorted(self.waits)
        machine, now = self.machine, cpu_times()
        busy = None
        if machine is not None and now is not None and now[1] > machine[1]:
            busy = (now[0] - machine[0]) / (now[1] - machine[1])
        return StreamStats(
            batches=self.batches,
            rows=self.rows,
            wait_median=_quantile(waits, 0.5),
            wait_p95=_quantile(waits, 0.95),
            wait_total=self.wait,
            between_total=self.between,
            source_total=self.source,
            busy_total=self.busy,
            elapsed=self.last_taken - self.start,
            fill=self.ready / self.batches if self.batches else 0.0,
            prefetch=self.prefetch,
            workers=self.workers,
            machine_busy=busy,
            cores=now[2] if now is not None else 0,
        )


def _quantile(sorted_xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``sorted_xs``, interpolated between neighbours (0: none)."""
    if not sorted_xs:
        return 0.0
    at = q * (len(sorted_xs) - 1)
    low = int(at)
    high = min(low + 1, len(sorted_xs) - 1)
    return sorted_xs[low] + (sorted_xs[high] - sorted_xs[low]) * (at - low)
