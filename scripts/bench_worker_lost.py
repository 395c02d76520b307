"""How soon a warm pool reports a worker that died: a row that kills its own worker
(SIGKILL), on ``processes`` and ``joblib``, from the kill to ``prep.WorkerCrashed``
in the caller.

    python scripts/bench_worker_lost.py [--repeats 5]

The row writes the time (``time.time()``, one clock for every process) to a file
just before it kills its process; the caller notes the time it catches the error.
Prints each repeat's seconds and the median per executor.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import torch

import prep

MARK = Path(tempfile.gettempdir()) / f"prep-worker-lost-{os.getpid()}"


def dies_on_row_3(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) == 3:
        MARK.write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    return row


def once(pool: prep.Pool) -> float:
    MARK.unlink(missing_ok=True)
    try:
        pool.map_rows(dies_on_row_3, torch.arange(8.0).view(8, 1))
    except prep.WorkerCrashed:
        caught = time.time()
    else:
        raise RuntimeError("the row that kills its worker did not")
    return caught - float(MARK.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for executor in ("processes", "joblib"):
        with prep.Pool(executor, workers=2) as pool:
            pool.map_rows(torch.neg, torch.ones(8, 1))  # warm: the workers are up
            took = [once(pool) for _ in range(args.repeats)]
        shown = " ".join(f"{t:.3f}" for t in took)
        print(f"{executor}: {shown}; median {statistics.median(took):.3f} s")
    MARK.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
