"""What ``seed=`` costs a row: serial ``map_rows`` of a random row function with and
without a seed, side by side, for each generator a row may draw from.

    python scripts/bench_seed.py [--rows 4096] [--repeat 21]

Per function (a draw from torch's default generator, from an ``rng`` the function
takes, from Python's ``random``, from numpy's global generator), the median over
``--repeat`` interleaved rounds of a batch's time with ``seed=7`` and without, and
their difference per row. Below, the primitives the design is built on: seeding
each generator, and reading its state (done a few times a run of rows, not a row).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import prep


def from_torch(row: torch.Tensor) -> torch.Tensor:
    return row + torch.rand(())


def from_rng(row: torch.Tensor, rng: torch.Generator | None = None) -> torch.Tensor:
    return row + torch.rand((), generator=rng)


def from_random(row: torch.Tensor) -> torch.Tensor:
    return row + random.random()


def from_numpy(row: torch.Tensor) -> torch.Tensor:
    return row + float(np.random.rand())


FUNCTIONS = {"torch": from_torch, "rng": from_rng, "random": from_random, "numpy": from_numpy}


def timed(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def per_call(call: Callable[[], object], n: int = 2000) -> float:
    """Microseconds a call, the best of 5 loops of ``n``."""
    best = min(timed(lambda: [call() for _ in range(n)]) for _ in range(5))
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batch = torch.zeros(args.rows, 4)
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.repeat):
        for name, fn in FUNCTIONS.items():
            for seeded in (False, True):
                kw = {"seed": 7} if seeded else {}
                took = timed(lambda: prep.map_rows(fn, batch, executor="serial", **kw))  # noqa: B023
                times.setdefault((name, seeded), []).append(took)
    print(f"serial map_rows, {args.rows} rows of [4], median of {args.repeat} interleaved rounds")
    print(f"({os.cpu_count()} cores, torch {torch.__version__}, 1 torch thread)\n")
    print("| the row draws from | unseeded, us a row | seed=7, us a row | seed= costs, us a row |")
    print("|---|---:|---:|---:|")
    for name in FUNCTIONS:
        plain = statistics.median(times[(name, False)]) / args.rows * 1e6
        seeded = statistics.median(times[(name, True)]) / args.rows * 1e6
        print(f"| {name} | {plain:.2f} | {seeded:.2f} | {seeded - plain:.2f} |")
    gen = torch.Generator()
    print("\n| primitive | us a call |")
    print("|---|---:|")
    primitives = {
        "torch.Generator.manual_seed": lambda: gen.manual_seed(12345),
        "default_generator.manual_seed": lambda: torch.random.default_generator.manual_seed(1),
        "random.seed(int)": lambda: random.seed(12345),
        "numpy.random.seed(int)": lambda: np.random.seed(12345),
        "torch.random.get_rng_state": torch.random.get_rng_state,
        "random.getstate": random.getstate,
        "numpy.random.get_state": np.random.get_state,
    }
    for name, call in primitives.items():
        print(f"| {name} | {per_call(call):.2f} |")


if __name__ == "__main__":
    main()
