"""One engine: what a batch costs through ``map_rows`` against the same pool's ``imap``,
and how many worker processes a Pool holds after each kind of call.

    python scripts/bench_engine.py [--repeat 41] [--workers 2]

Per batch: a warm ``Pool("processes")``, 16 trivial rows (``torch.neg`` on [16, 4]);
``map_rows`` is timed a batch at a time (latency), ``imap`` over a list of batches
(throughput, several in flight); serial and a plain loop beside them. Each figure is
the median of ``--repeat`` rounds, the kinds interleaved within a round.
Processes: the live descendants of this process (prep's forkserver is one of them)
after ``map_rows`` and ``imap`` on one pool, beside a ``Collate`` (which owns a pool
of its own) and a ``Pool("auto")`` after a stream and six ``map_rows``, and after
``close()``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import prep

ROWS, WIDTH, BATCHES = 16, 4, 50


def descendants() -> int:
    """Live processes descended from this one, by /proc (prep's workers are children of
    its forkserver, and the forkserver counts too)."""
    parent: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parent[int(pid)] = int(fields[1])
    mine, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine and p not in mine}
        mine |= more
        grew = bool(more)
    return len(mine) - 1


def settled() -> int:
    """:func:`descendants`, once workers that were asked to stop have gone (up to 5 s)."""
    end, n = time.monotonic() + 5, descendants()
    while time.monotonic() < end:
        time.sleep(0.1)
        again = descendants()
        if again == n:
            return n
        n = again
    return n


def per_batch(repeat: int, workers: int) -> dict[str, float]:
    batch = torch.randn(ROWS, WIDTH)
    batches = [batch] * BATCHES
    times: dict[str, list[float]] = {"map_rows": [], "imap": [], "serial": [], "loop": []}
    with prep.Pool("processes", workers=workers) as pool, prep.Pool("serial") as serial:
        pool.map_rows(torch.neg, batch)
        list(pool.imap(torch.neg, batches, strategy="split"))
        serial.map_rows(torch.neg, batch)
        for _ in range(repeat):
            t = time.perf_counter()
            for b in batches:
                pool.map_rows(torch.neg, b)
            times["map_rows"].append((time.perf_counter() - t) / BATCHES)
            t = time.perf_counter()
            for _ in pool.imap(torch.neg, batches, strategy="split"):
                pass
            times["imap"].append((time.perf_counter() - t) / BATCHES)
            t = time.perf_counter()
            for b in batches:
                serial.map_rows(torch.neg, b)
            times["serial"].append((time.perf_counter() - t) / BATCHES)
            t = time.perf_counter()
            for b in batches:
                torch.stack([torch.neg(r) for r in b])
            times["loop"].append((time.perf_counter() - t) / BATCHES)
    return {k: statistics.median(v) for k, v in times.items()}


def held(workers: int) -> list[tuple[str, int]]:
    batch = torch.randn(ROWS, WIDTH)
    counts = [("before", settled())]
    pool = prep.Pool("processes", workers=workers)
    pool.map_rows(torch.neg, batch)
    counts.append(("after map_rows", settled()))
    list(pool.imap(torch.neg, [batch] * 8))
    counts.append(("after imap", settled()))
    list(pool.imap(torch.neg, [batch] * 8, strategy="whole"))
    counts.append(("after imap(strategy='whole')", settled()))
    collate = prep.Collate(torch.neg, executor="processes", workers=workers)
    collate(list(batch))
    counts.append(("... and a Collate(executor='processes') of its own pool", settled()))
    collate.close()
    counts.append(("after collate.close()", settled()))
    auto = prep.Pool("auto", workers=workers)
    list(auto.imap(torch.neg, [batch] * 8))
    for _ in range(6):
        auto.map_rows(torch.neg, batch)
    counts.append(("... and a Pool('auto') after a stream and 6 map_rows", settled()))
    auto.close()
    pool.close()
    counts.append(("after close()", settled()))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=41)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    figures = per_batch(args.repeat, args.workers)
    print(f"ms per batch of {ROWS} rows (median of {args.repeat}, {args.workers} workers)")
    for name, value in figures.items():
        print(f"  {name:<10} {value * 1e3:7.3f}")
    print(f"  map_rows / imap: {figures['map_rows'] / figures['imap']:.2f}x")
    print("processes descended from this one (prep's forkserver counts as one):")
    for what, n in held(args.workers):
        print(f"  {what:<55} {n}")


if __name__ == "__main__":
    main()
