"""How long ``prep run --cluster`` takes to end when its Dask scheduler dies mid-run,
and with which exit code: a real ``dask scheduler`` and two ``dask worker`` processes,
8 shards of a slow row function, the scheduler killed once the first shard is done.

    python scripts/bench_cluster_lost.py [--repeats 5] [--on-error skip]

Prints, per repeat, the seconds from the kill to prep's exit and the exit code, then
the median. Needs the dask extra (``pip install -e .[dask]``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from prep.run import save_shard

ROOT = Path(__file__).resolve().parent.parent


def scheduler() -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--no-dashboard"], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"Scheduler at:\s+(tcp://\S+)", line):
            # keep reading its log, so that it never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError("the scheduler printed no address")


def once(data: Path, out: Path, on_error: str) -> tuple[float, int]:
    sched, addr = scheduler()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1"]
    workers = [
        subprocess.Popen([*worker, "--no-dashboard"], stderr=subprocess.DEVNULL, env=env)
        for _ in range(2)
    ]
    cmd = [sys.executable, "-m", "prep", "run", str(data), "--out", str(out)]
    cmd += ["--fn", "tests.rowfns:slow", "--columns", "x", "--executor", "serial"]
    cmd += ["--cluster", addr, "--on-error", on_error]
    run = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert run.stderr is not None
    killed = None
    try:
        for line in run.stderr:
            if "[1/" in line and killed is None:  # the first shard is done: the rest in flight
                sched.kill()
                killed = time.perf_counter()
        run.wait()
        if killed is None:
            raise RuntimeError("the run ended before its first shard was reported")
        return time.perf_counter() - killed, run.returncode
    finally:
        for p in (*workers, sched):
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--on-error", default="stop", choices=("stop", "skip"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        for k in range(8):
            x = (10.0 * k + torch.arange(6.0))[:, None].expand(6, 3).contiguous()
            save_shard({"x": x}, data / f"s{k}.pt", "pt")
        took = []
        for r in range(args.repeats):
            seconds, code = once(data, Path(tmp) / f"out{r}", args.on_error)
            print(f"repeat {r}: exit code {code} {seconds:.2f} s after the scheduler died")
            took.append(seconds)
    print(f"median {statistics.median(took):.2f} s")


if __name__ == "__main__":
    main()
