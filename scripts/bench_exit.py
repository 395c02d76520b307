"""How long a program that used ``executor="processes"`` keeps its output pipes open
after it exits: what a caller reading its stderr through a pipe waits for.

    python scripts/bench_exit.py [--repeats 7]

Prints, per repeat, the seconds from the program's exit to the end of its stderr
(prep's forkserver holds it until it ends), and their median.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CODE = (
    "import torch, prep; "
    "prep.map_rows(torch.neg, torch.ones(64, 4), executor='processes', workers=2)"
)


def once() -> float:
    p = subprocess.Popen([sys.executable, "-c", CODE], stderr=subprocess.PIPE)
    p.wait()
    exited = time.perf_counter()
    assert p.stderr is not None
    p.stderr.read()  # returns at EOF: when every process holding the pipe has ended
    return time.perf_counter() - exited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    took = [once() for _ in range(args.repeats)]
    print("seconds from exit to the end of stderr:", " ".join(f"{t:.3f}" for t in took))
    print(f"median {statistics.median(took):.3f} s")


if __name__ == "__main__":
    main()
