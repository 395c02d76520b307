"""The core executors side by side: per-row overhead, GIL-bound, GIL-free, big rows.

Run it alone on the machine (the figures are medians of interleaved repeats):

    python scripts/bench_core.py            # the table in the README
    python scripts/bench_core.py --quick    # a smoke test

Cases and the targets they check:
  1. no-op row fn, 4096 rows: per-row cost of threads (<= 10 us) and processes (<= 30 us)
  2. GIL-bound pure-Python fn of >= 2 ms a row: processes >= 1.6x faster than serial
  3. GIL-releasing torch op (matmul chain): threads >= 1.5x faster than serial
  4. rows of a [256, 512, 768] float32 batch (side context): processes >= 10x faster per
     row than a plain ``joblib.Parallel()(delayed(fn)(x[b]) for b ...)``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import joblib
import torch

import prep
from prep.bench import interleaved, table

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import WORKLOADS, Workload, matmul_chain

# the "256x256 matmul chain" (the bench grid's matmul workload is 128x128)
MATMUL_256 = Workload(
    "matmul256",
    matmul_chain,
    lambda rows: torch.randn(rows, 256, 256, generator=torch.Generator().manual_seed(0)) / 16,
    "4 products of [256, 256] matrices a row, releases the GIL",
)

EXECUTORS = ["serial", "threads", "processes", "joblib"]


def per_row_table(
    title: str,
    workload: str | Workload,
    rows: int,
    repeat: int,
    workers: int,
    executors: Sequence[str] = EXECUTORS,
) -> tuple[str, dict[str, float]]:
    w = WORKLOADS[workload] if isinstance(workload, str) else workload
    batch = w.batch(rows)
    variants = {
        ex: (lambda ex=ex: prep.map_rows(w.fn, batch, executor=ex, workers=workers))
        for ex in executors
    }
    times = interleaved(variants, repeat=repeat)
    serial = times["serial"].median
    body = [
        [
            ex,
            f"{t.median * 1e3:.1f}",
            f"{t.median / rows * 1e6:.1f}",
            f"{t.spread:.0%}",
            f"{serial / t.median:.2f}x",
        ]
        for ex, t in times.items()
    ]
    text = f"### {title}\n{w.about}; {rows} rows, workers={workers}\n\n" + table(
        body, ["executor", "batch ms", "us/row", "spread", "vs serial"]
    )
    return text, {ex: t.median / rows for ex, t in times.items()}


def big_rows(rows: int, naive_rows: int, repeat: int, workers: int) -> tuple[str, float]:
    """processes over all rows vs the naive joblib call over a few (it ships the batch per row)."""
    w = WORKLOADS["side_context"]
    x, mask = w.batch(rows)

    def naive() -> object:
        parts = joblib.Parallel(n_jobs=workers)(
            joblib.delayed(w.fn)(x[b], mask[b]) for b in range(naive_rows)
        )
        return torch.stack(parts)

    times = interleaved(
        {
            "processes": lambda: prep.map_rows(
                w.fn, (x, mask), executor="processes", workers=workers
            ),
            "joblib (prep, chunked)": lambda: prep.map_rows(
                w.fn, (x, mask), executor="joblib", workers=workers
            ),
            f"plain joblib, first {naive_rows} rows": naive,
        },
        repeat=repeat,
    )
    per_row = {
        name: t.median / (naive_rows if name.startswith("plain") else rows)
        for name, t in times.items()
    }
    naive_row = per_row[f"plain joblib, first {naive_rows} rows"]
    body = [
        [name, f"{times[name].median * 1e3:.0f}", f"{r * 1e3:.2f}", f"{naive_row / r:.1f}x"]
        for name, r in per_row.items()
    ]
    text = (
        f"### Rows of a [{rows}, 512, 768] float32 batch (side context, max_len=128)\n"
        f"the plain call pickles the whole batch for every row, so it runs on the first "
        f"{naive_rows} rows only; per-row times compare\n\n"
        + table(body, ["variant", "ms", "ms/row", "vs plain joblib"])
    )
    return text, naive_row / per_row["processes"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    args = parser.parse_args(argv)
    q = args.quick
    repeat = 2 if q else args.repeat
    print(
        f"torch {torch.__version__}, {prep.info()['cores']} cores, "
        f"workers={args.workers}, repeat={repeat}\n"
    )
    results = {}
    sections = [
        ("1. Per-row overhead", "noop", 256 if q else 4096),
        ("2. GIL-bound Python", "python", 8 if q else 64),
        ("3. GIL-releasing torch op", MATMUL_256, 8 if q else 64),
        (
            "3b. The same with [128, 128] matrices (too small for torch's own threads)",
            "matmul",
            8 if q else 64,
        ),
    ]
    for title, workload, rows in sections:
        name = workload if isinstance(workload, str) else workload.name
        text, results[name] = per_row_table(title, workload, rows, repeat, args.workers)
        print(text, "\n", flush=True)
    text, big = big_rows(8 if q else 256, 2 if q else 8, max(2, repeat // 2), args.workers)
    print(text, "\n")
    noop, py, mm = results["noop"], results["python"], results["matmul256"]
    checks = [
        ("threads per-row overhead <= 10 us", noop["threads"] * 1e6, 10, "us", False),
        ("processes per-row overhead <= 30 us", noop["processes"] * 1e6, 30, "us", False),
        ("processes vs serial, GIL-bound >= 1.6x", py["serial"] / py["processes"], 1.6, "x", True),
        (
            "threads vs serial, GIL-releasing [128, 128] (3b)",
            results["matmul"]["serial"] / results["matmul"]["threads"],
            1.5,
            "x",
            True,
        ),
        (
            "threads vs serial, GIL-releasing [256, 256] >= 1.5x",
            mm["serial"] / mm["threads"],
            1.5,
            "x",
            True,
        ),
        ("processes vs plain joblib, big rows >= 10x", big, 10, "x", True),
    ]
    print("### Targets\n")
    print(
        table(
            [
                [
                    name,
                    f"{got:.2f} {unit}",
                    "met" if (got >= goal if higher else got <= goal) else "MISSED",
                ]
                for name, got, goal, unit, higher in checks
            ],
            ["target", "measured", ""],
        )
    )
    prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
