"""What auto measured and chose on one workload, batch by batch: its explain().

    python scripts/probe_auto.py torch_stft            # 12 batches of 64 rows
    python scripts/probe_auto.py json_parse --rows 256 --batches 20

A fresh Pool("auto") runs the workload's batch ``--batches`` times (wisdom off, so
this is a first run); each call's milliseconds are printed, then explain(). Run it
alone on the machine: the figures are one run's, not medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["PREP_WISDOM"] = "off"

import prep  # noqa: E402

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.libraries import LIBRARY_WORKLOADS  # noqa: E402
from benchmarks.libraries import call as call_workload  # noqa: E402
from benchmarks.workloads import WORKLOADS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=[*WORKLOADS, *LIBRARY_WORKLOADS])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    w = {**WORKLOADS, **LIBRARY_WORKLOADS}[args.workload]
    batch = w.batch(args.rows)
    times = []
    with prep.Pool("auto", workers=args.workers) as pool:
        for _ in range(args.batches):
            t = time.perf_counter()
            call_workload(pool, w, batch)
            times.append((time.perf_counter() - t) * 1e3)
        print(f"{args.workload}, {args.rows} rows, {args.batches} batches; ms per call:")
        print("  " + " ".join(f"{t:.1f}" for t in times))
        print(pool.explain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
