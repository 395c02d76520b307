"""What a stream's figures (``Stream.stats()``) cost: per batch, measured directly, and
a stream with them against one without (``measure=False``), interleaved.

    PYTHONPATH=. python scripts/bench_stream_stats.py              # ~10 s
    PYTHONPATH=. python scripts/bench_stream_stats.py --rounds 9 --batches 4000

The streams' batches cost next to nothing (``call`` returns the batch; a pool's
``map_rows`` of a tiny batch with ``--pool``), so that the bookkeeping is as large a
part of a batch as it can be.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import prep
from prep.stream.stats import BatchFigures, Meter, rows_in
from prep.stream.stream import Stream


def per_batch_us(n: int) -> float:
    """The bookkeeping of one batch alone: what the producer adds (two clock reads, the
    rows, the figures) and what the consumer does (``asked``, the queue's size, ``took``)."""
    meter, result, figures = Meter(2, 2), torch.zeros(64, 8), BatchFigures(64, 0.0, 0.0)
    t = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        figures = BatchFigures(rows_in(result), time.perf_counter() - a, 0.0)
        meter.took(meter.asked(), 0, figures)
    return (time.perf_counter() - t) / n * 1e6


def stream_us(call: Callable[[Any], Any], batch: Any, n: int, measure: bool) -> float:
    """Microseconds a batch through a whole stream of ``n``."""
    t = time.perf_counter()
    stream = Stream(call, (batch for _ in range(n)), prefetch=2, measure=measure)
    for _ in stream:
        pass
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", action="store_true", help="each batch through map_rows")
    args = parser.parse_args()
    batch = torch.zeros(64, 8)
    pool = prep.Pool("serial") if args.pool else None
    call: Callable[[Any], Any] = (
        (lambda b: pool.map_rows(torch.neg, b)) if pool is not None else (lambda b: b)
    )
    stream_us(call, batch, 200, True)  # warm
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.rounds):  # interleaved: the machine's drift hits both alike
        off.append(stream_us(call, batch, args.batches, False))
        on.append(stream_us(call, batch, args.batches, True))
    direct = statistics.median(per_batch_us(20_000) for _ in range(args.rounds))
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(f"bookkeeping alone: {direct:.2f} us a batch")
    print(
        f"stream, us a batch (median of {args.rounds}; min..max): figures on {med_on:.1f} "
        f"({min(on):.1f}..{max(on):.1f}), off {med_off:.1f} ({min(off):.1f}..{max(off):.1f}); "
        f"on/off {med_on / med_off:.3f}"
    )
    if pool is not None:
        pool.close()


if __name__ == "__main__":
    main()
