"""How this machine runs one busy process against two at once: the ceiling of any
"N-core limit" (the serial rate times N) that a benchmark divides by.

    python scripts/probe_scaling.py          # 1, 2, 1, 2 processes, 3 s each

Each process runs the pure-Python feature hashing of ``bench_stream.py`` (about
90 us an item) for 3 seconds and reports its items a second. Where two
processes each run as fast as one alone, two cores give twice one's rate.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SECONDS = 3.0


def _busy(q: mp.Queue) -> None:  # type: ignore[type-arg]
    import bench_stream as bs

    texts = bs.make_texts(600)
    for t in texts[:50]:  # warm
        bs.featurize(t)
    start, k = time.perf_counter(), 0
    while time.perf_counter() - start < SECONDS:
        bs.featurize(texts[k % len(texts)])
        k += 1
    q.put(k / (time.perf_counter() - start))


def main() -> int:
    ctx = mp.get_context("spawn")
    for procs in (1, 2, 1, 2):
        q = ctx.Queue()
        ps = [ctx.Process(target=_busy, args=(q,)) for _ in range(procs)]
        for p in ps:
            p.start()
        rates = [q.get() for _ in ps]
        for p in ps:
            p.join()
        each = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"{procs} at once: {each} items/s each, {sum(rates):,.0f} in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
