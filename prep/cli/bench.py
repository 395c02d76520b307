"""``prep bench``: its arguments and handler (``prep/cli`` registers them); the handler
only loads your function and factory, builds a :class:`~prep.bench.Race` and prints
its :func:`~prep.bench.report`. Exit codes: 0 the race ran (an executor or peer that
cannot run your function is a finding: a failed cell); 1 your workload itself is
broken (the factory or serial raised); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from .._imports import load_callable
from ..bench import Race, broken, report
from ..bench.peers import PEERS
from ..registry import EXECUTORS as REGISTRY
from .args import positive

__all__ = ["HELP", "configure", "run"]

HELP = "time your row function on every executor (and, with --peers, the tools it replaces)"


def configure(p: argparse.ArgumentParser) -> None:
    """What ``prep bench`` times, and how often."""
    p.add_argument("--fn", required=True, metavar="MODULE:FUNCTION", help="your row function")
    p.add_argument(
        "--batch",
        required=True,
        metavar="MODULE:FACTORY",
        help="your batch factory: a number of rows -> a batch for map_rows",
    )
    p.add_argument(
        "--rows", type=positive, nargs="+", metavar="N", help="rows per batch (default 16 64 256)"
    )
    p.add_argument("--workers", type=positive, metavar="N", help="workers (default: the cores)")
    p.add_argument("--repeat", type=positive, metavar="N", help="timed repeats (default 5)")
    p.add_argument(
        "--executors",
        nargs="+",
        metavar="NAME",
        help=f"executors to time (default: all of {', '.join(REGISTRY)}; serial always)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="also time " + " and ".join(p.label for p in PEERS.values()) + " on your rows",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="limit per call of a prep executor, against hangs (default: none, as in map_rows)",
    )


def run(ns: argparse.Namespace) -> int:
    fn = load_callable(ns.fn, "--fn")
    factory = load_callable(ns.batch, "--batch")
    given = {k: getattr(ns, k) for k in ("rows", "workers", "repeat", "executors", "timeout")}
    race = Race(peers=ns.peers, **{k: v for k, v in given.items() if v is not None})
    print(
        f"prep bench: {ns.fn} on {', '.join(race.variants())}; rows {race.rows}, "
        f"{race.workers} workers, {race.repeat} repeats",
        file=sys.stderr,
        flush=True,
    )
    cells = race.run(fn, factory, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(report(cells))
    return 1 if broken(cells) else 0
