"""Does prep's thread pool slow the caller's own torch ops? Serial batches before and after.

    python scripts/bench_threads_caller.py

A matmul chain (small products: torch runs each on its intra-op threads) is
timed serially in the calling thread, then a ``threads`` pool runs batches,
then serial again while the pool is alive, then after it is closed. Medians of
``--repeat`` calls each. Before prep set each worker thread's own intra-op
threads (it capped the caller's around every batch), the "alive" figure was
about 4x the "before" one on a 2-core machine: the workers' OpenMP teams made
libgomp throttle every team, the caller's included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import prep

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import WORKLOADS


def median_ms(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    w = WORKLOADS["matmul"]
    batch = w.batch(args.rows)
    serial = lambda: prep.map_rows(w.fn, batch, executor="serial")  # noqa: E731
    before = median_ms(serial, args.repeat)
    pool = prep.Pool("threads")
    threads = median_ms(lambda: pool.map_rows(w.fn, batch), args.repeat)
    alive = median_ms(serial, args.repeat)
    pool.close()
    after = median_ms(serial, args.repeat)
    threads_now = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads_now} intra-op threads, {args.rows} rows")
    print(f"serial before the pool      {before:8.1f} ms")
    print(f"threads pool                {threads:8.1f} ms")
    print(f"serial while the pool lives {alive:8.1f} ms  ({alive / before:.2f}x before)")
    print(f"serial after it is closed   {after:8.1f} ms  ({after / before:.2f}x before)")


if __name__ == "__main__":
    main()
