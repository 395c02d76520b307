"""What ``auto`` found for one signature: measurements, predictions, the choice.

A :class:`Calibration` is also what ``prep.explain`` returns and ``print`` shows;
the cache key of a choice is :func:`signature`.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._structure import Rows, TensorRows

#: threads or processes are chosen over the rest only when predicted this much faster
#: (the calibration's slices vary by 10-20% on a busy machine); ties go to no pool
POOL_MARGIN = 1.15
POOLS = ("threads", "processes")


@dataclass
class Calibration:
    """What ``auto`` measured for one signature, what it predicts, and what it chose."""

    rows: int
    workers: int
    serial_row: float = math.nan
    #: seconds per row serially with torch on one worker's share of intra-op threads,
    #: and how many cores' worth torch's own threads made serial faster by
    one_thread_row: float | None = None
    serial_cores: float = 1.0
    vectorized_row: float | None = None
    vmap_row: float | None = None
    thread_speedup: float | None = None
    process_dispatch: float | None = None
    process_start: float = 0.0
    bytes_per_row: int = 0
    sample: int = 0
    predicted: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    choice: str = "serial"
    seconds: float = 0.0
    #: seconds a started process pool would have saved on the batches run so far
    saved_by_processes: float = 0.0
    batches: int = 0
    switched: str = ""
    #: False: a batched form ran the first batch without winning outright; the next
    #: batch measures the pools against it
    settled: bool = True
    #: the process pool was started during calibration, for the batches after this one
    prestarted: bool = False
    #: a process pool would start in milliseconds here (the forkserver is up)
    cheap_start: bool = False
    #: the dispatch cost was measured on a running pool (else it is assumed)
    dispatch_measured: bool = False

    def processes_would_save(self, rows: int) -> float:
        """Seconds a started process pool would save over the choice on ``rows`` rows."""
        if (
            not self.process_start
            or self.choice == "processes"
            or "processes" not in self.predicted
        ):
            return 0.0
        warm = (self.predicted["processes"] - self.process_start) * POOL_MARGIN
        return max(0.0, self.predicted[self.choice] - warm) * rows / max(1, self.rows)

    def count_batch(self, rows: int, allow_processes: bool = True) -> None:
        """Rent or buy. A process pool that loses this batch only because it has to
        start is started anyway when that is cheap (the forkserver is up: its workers
        come up while this batch finishes), and used from the next batch. When it is
        not (2.5 s with torch to import), it starts once the batches run so far would
        have saved that much with it: never paying more than twice the best in
        hindsight, whether the batches stop now or go on for ever."""
        self.batches += 1
        if not allow_processes:  # a DataLoader worker (say) that inherited this pool
            return
        self.saved_by_processes += self.processes_would_save(rows)
        paid = self.saved_by_processes >= self.process_start
        if not self.process_start or not (paid or (self.prestarted and self.batches > 1)):
            return
        why = (
            f"the {self.saved_by_processes:.2f} s they would have saved paid for starting "
            f"the pool ({self.process_start:.1f} s)"
            if paid
            else "its workers started during the first batch"
        )
        self.predicted["processes"] -= self.process_start
        before, self.process_start = self.choice, 0.0
        self.choice = choose(self.predicted)
        self.switched = f"from batch {self.batches} on: {before} -> {self.choice}, as {why}"

    def __str__(self) -> str:
        us = lambda s: f"{s * 1e6:,.1f} us" if s is not None else "-"  # noqa: E731
        lines = [
            f"auto: {self.rows} rows, {self.workers} workers; calibrated in "
            f"{self.seconds * 1e3:.1f} ms, computing {self.sample} of the rows",
            f"  serial {us(self.serial_row)}/row"
            + (
                f" ({us(self.one_thread_row)} on one worker's threads)"
                if self.one_thread_row
                else ""
            )
            + (f", vectorized {us(self.vectorized_row)}/row" if self.vectorized_row else "")
            + (f", vmap {us(self.vmap_row)}/row" if self.vmap_row else "")
            + (f", threads run {self.thread_speedup:.2f}x serial" if self.thread_speedup else "")
            + (
                f", process dispatch {self.process_dispatch * 1e3:.2f} ms/batch"
                if self.process_dispatch is not None and self.dispatch_measured
                else ""
            )
            + (
                f", process dispatch ~{self.process_dispatch * 1e3:.0f} ms/batch assumed"
                if self.process_dispatch is not None and not self.dispatch_measured
                else ""
            )
            + (
                f" (no pool yet: +{self.process_start:.1f} s to start it)"
                if self.process_start
                else ""
            ),
            "  predicted for a whole batch: "
            + ", ".join(
                f"{k} {v * 1e3:.1f} ms"
                for k, v in sorted(self.predicted.items(), key=lambda kv: kv[1])
            ),
        ]
        lines += [f"  not considered: {k} ({why})" for k, why in self.dropped.items()]
        if self.switched:
            lines.append(f"  {self.switched}")
        elif self.prestarted or (self.cheap_start and self.processes_would_save(self.rows)):
            lines.append(
                "  processes lose this batch only by their start-up: a pool starts their "
                "workers during it, for the next batches"
            )
        elif saving := self.processes_would_save(self.rows):
            lines.append(
                f"  processes would save {saving * 1e3:,.1f} ms a batch once started: "
                f"they start after about {math.ceil(self.process_start / saving)} batches "
                f"({self.saved_by_processes * 1e3:,.1f} ms saved so far)"
            )
        lines.append(f"  choice: {self.choice}")
        return "\n".join(lines)


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
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        args, kwargs = fn.args + args, {**fn.keywords, **kwargs}
        fn = fn.func
    if inspect.ismethod(fn):  # ``obj.method`` is a new object at every access
        fn, args = fn.__func__, (fn.__self__, *args)
    return (
        id(fn),
        tuple(map(_value_key, args)),
        tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())),
    )


def signature(fn: Callable[..., Any], rows: Rows, device: Any) -> Any:
    """What a cached choice is valid for (everything but the number of rows)."""
    if isinstance(rows, TensorRows):
        layout: Any = (
            rows.names,
            tuple((tuple(c.shape[1:]), str(c.dtype), str(c.device)) for c in rows.columns),
        )
    else:
        layout = ("samples", type(rows.samples[0]).__qualname__ if len(rows) else None)
    return (_fn_key(fn), layout, str(device))


def choose(predicted: dict[str, float]) -> str:
    # a pool has to save more than measurement noise to be worth the cores it takes
    return min(predicted, key=lambda k: predicted[k] * (POOL_MARGIN if k in POOLS else 1.0))
