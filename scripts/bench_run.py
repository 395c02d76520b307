"""Benchmark ``prep run`` against ``cp -r`` of the same shards.

Writes a synthetic data set (``prep.run.make_shards``: ``x`` float32
``[rows, 128, 64]``, a span ``mask`` and ``length``) into a temporary folder
under /tmp, then times, in one process of this script and interleaved (the
order rotates every repeat, so drift in the machine's state hits all alike):

* ``cp -r DATA DEST``;
* ``python -m prep run DATA --out DEST --fn prep.ops:side_context_row
  --arg max_len=16 --quiet --executor vectorized`` (the batched twin), once per
  ``--jobs`` value, and once with the default ``--executor auto``; each as a
  whole command: interpreter start and ``import torch`` included;

and prints the medians as a markdown table, with each one's ratio to ``cp``.
``os.sync()`` runs before every timed command, so neither pays for the other's
write-back. The page cache is *not* dropped (that needs root, which a
benchmark should not rely on): the data is read once beforehand, and both
``cp`` and ``prep`` then read it from memory. ``prep`` fsyncs every output and
its manifest line; ``cp`` fsyncs nothing. The folder is removed at the end.

    python scripts/bench_run.py                      # 1 GB, 3 repeats
    python scripts/bench_run.py --size-mb 256 --repeat 5
    python scripts/bench_run.py --quick              # a smoke test: 64 MB, 1 repeat
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from prep.run import make_shards

SEQ, DIM, MAX_LEN = 128, 64, 16
ROW_BYTES = SEQ * DIM * 4 + SEQ + 8  # x (float32) + mask (bool) + length (int64)


def timed(cmd: list[str]) -> float:
    os.sync()
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def warm(folder: Path) -> None:
    """Read every file once, so the timed commands all find it in the page cache."""
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="total size of the shards")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values to time")
    ap.add_argument("--quick", action="store_true", help="64 MB, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_mb, args.repeat = 64, 1
    rows = max(1, args.size_mb * 2**20 // (args.shards * ROW_BYTES))
    root = Path(tempfile.mkdtemp(prefix="prep-bench-run-", dir="/tmp"))
    try:
        data = root / "data"
        make_shards(data, shards=args.shards, rows=rows, seq=SEQ, dim=DIM, seed=0)
        size = sum(p.stat().st_size for p in data.rglob("*.pt"))
        warm(data)
        fn = ["--fn", "prep.ops:side_context_row", "--arg", f"max_len={MAX_LEN}", "--quiet"]
        prep_cmd = [sys.executable, "-m", "prep", "run", str(data), *fn]
        variants = {"cp -r": lambda dest: ["cp", "-r", str(data), str(dest)]}

        def prep_run(*flags: str) -> Callable[[Path], list[str]]:
            return lambda dest: [*prep_cmd, "--out", str(dest), *flags]

        for j in args.jobs.split(","):
            variants[f"prep run --executor vectorized --jobs {j}"] = prep_run(
                "--executor", "vectorized", "--jobs", j
            )
        # the default executor: auto calibrates on the first shard, then reuses its choice
        variants["prep run (defaults: --executor auto --jobs 2)"] = prep_run()
        startup = [timed([sys.executable, "-c", "import prep.cli, prep.ops, prep.run"])]
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.repeat):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                dest = root / "dest"
                times[name].append(timed(variants[name](dest)))
                shutil.rmtree(dest)
            startup.append(timed([sys.executable, "-c", "import prep.cli, prep.ops, prep.run"]))
        report(args, rows, size, times, statistics.median(startup))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def report(
    args: argparse.Namespace, rows: int, size: int, times: dict[str, list[float]], startup: float
) -> None:
    cp = statistics.median(times["cp -r"])
    print(
        f"\n{args.shards} shards x {rows} rows of x [{rows}, {SEQ}, {DIM}] float32 + mask + "
        f"length = {size / 1e6:,.0f} MB; side_context max_len={MAX_LEN}; "
        f"{args.repeat} repeat(s), medians; torch {torch.__version__}, {os.cpu_count()} cores; "
        f"page cache warm for both\n"
    )
    print("| command | median s | MB/s | / cp -r | minus import, s | minus import / cp -r |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ts in times.items():
        m = statistics.median(ts)
        rest = f"| {m - startup:.2f} | {(m - startup) / cp:.2f} |" if name != "cp -r" else "| | |"
        print(f"| `{name}` | {m:.2f} | {size / 1e6 / m:,.0f} | {m / cp:.2f} {rest}")
    print(
        f"\n`python -c 'import prep.cli, prep.ops, prep.run'` alone (interpreter + torch): "
        f"median {startup:.2f} s, part of every prep run above; 'minus import' subtracts it. "
        f"Target: prep run / cp -r <= 2."
    )


if __name__ == "__main__":
    raise SystemExit(main())
