"""``python -m benchmarks``: its arguments (:func:`configure`) and its handler (:func:`command`).

The handler only parses and calls :func:`benchmarks.harness.run`. ``--peers`` adds the
tools people use instead of prep (:mod:`benchmarks.peers`) to every group,
and the real libraries' workloads to the default ones. Exit codes: 0 the
bench ran (an executor that cannot run a workload, e.g. ``vmap`` on a row
function that calls ``.item()``, is a finding: a failed cell in the table);
1 a workload itself is broken (its batch factory or its serial run raised);
2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prep.errors import ConfigError

from . import harness
from .grid import DEFAULT_WORKLOADS, PEER_WORKLOADS, QUICK_PEER_WORKLOADS, Grid, is_count, variants
from .peers import PEERS
from .report import alternatives_table, summary, terminal_table
from .workloads import user_workload

__all__ = ["HELP", "PROG", "command", "configure", "grid_from", "main"]

PROG = "python -m benchmarks"

HELP = "time every executor side by side on built-in workloads (or yours): who wins where"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers; e.g. 16,64,256"
        ) from None
    if not all(is_count(v) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} has a value < 1; every value must be >= 1")
    return values


def _positive(text: str) -> int:
    values = _ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not one positive integer; e.g. 5")
    return values[0]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0 seconds")
    return value


def configure(p: argparse.ArgumentParser) -> None:
    """Add the harness's arguments to ``p``."""
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 4 workloads (5 with --peers), rows 8,64, one workers setting, "
        "2 repeats (< 1 min; 2-3 min with --peers)",
    )
    p.add_argument(
        "--workloads",
        nargs="+",
        metavar="NAME",
        help="built-in workloads, space- or comma-separated (default: "
        f"{','.join(DEFAULT_WORKLOADS)}; with --fn, only yours)",
    )
    p.add_argument(
        "--executors",
        nargs="+",
        metavar="NAME",
        help="variants to time, space- or comma-separated (default: all of "
        f"{','.join(variants())})",
    )
    p.add_argument("--rows", type=_ints, metavar="N,N", help="rows per batch (default 16,64,256)")
    p.add_argument("--workers", type=_ints, metavar="N,N", help="workers (default 1 and cores)")
    p.add_argument(
        "--repeat", type=_positive, metavar="N", help="timed repeats per cell (default 5)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        metavar="DIR",
        help="folder for results (./bench-out)",
    )
    p.add_argument("--fn", metavar="MODULE:FUNCTION", help="your row function")
    p.add_argument(
        "--batch", metavar="MODULE:FACTORY", help="your batch factory: rows -> batch (with --fn)"
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="limit per call of a prep executor, against hangs (default: none, as in map_rows)",
    )
    p.add_argument(
        "--peers",
        nargs="*",
        metavar="NAME",
        help="also time the tools people use instead of prep, warm and first call: all of "
        f"{','.join(PEERS)}, or the NAMEs given; the default workloads then include the "
        "real libraries' (pip install 'prep[peers]' for mpire and torchdata)",
    )


def _split(values: Sequence[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    return tuple(part for v in values for part in v.split(",") if part)


def grid_from(args: argparse.Namespace) -> Grid:
    """The :class:`~benchmarks.grid.Grid` that ``args`` ask for."""
    if (args.fn is None) != (args.batch is None):
        given, missing = ("--fn", "--batch") if args.fn else ("--batch", "--fn")
        raise ConfigError(
            f"{given} was given without {missing}; your workload needs both, e.g. "
            f"--fn mymodule:clean_row --batch mymodule:make_batch"
        )
    changes: dict[str, Any] = {}
    workloads: tuple[Any, ...] | None = _split(args.workloads)
    if args.fn is not None:
        workloads = (*(workloads or ()), user_workload(args.fn, args.batch))
    peers = _peers(args)
    if peers is not None and workloads is None:
        workloads = QUICK_PEER_WORKLOADS if args.quick else PEER_WORKLOADS
    for name, value in [
        ("workloads", workloads),
        ("peers", peers),
        ("executors", _split(args.executors)),
        ("rows", args.rows),
        ("workers", args.workers),
        ("repeat", args.repeat),
        ("timeout", args.timeout),
    ]:
        if value is not None:
            changes[name] = value
    return Grid.quick(**changes) if args.quick else Grid(**changes)


def _peers(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The peers ``--peers`` names (all of them when it names none); None without it."""
    given = getattr(args, "peers", None)
    if given is None:
        return None
    return _split(given) or tuple(PEERS)


def command(args: argparse.Namespace) -> int:
    """Run the bench ``args`` describe, print the table and the summary; the exit code."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        grid = grid_from(args)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    counts = [len(grid.workloads), len(grid.rows), len(grid.workers), len(grid.executors)]
    progress(
        f"{PROG}: "
        + "{} workload(s) x {} rows x {} workers x {} variant(s), ".format(*counts)
        + (f"{len(grid.peers)} peer(s), " if grid.peers else "")
        + f"{grid.repeat} repeats; writing to {args.out}"
    )
    results = harness.run(grid, out=args.out, progress=progress)
    print(terminal_table(results))
    print("\nWho wins where:")
    print("\n".join(summary(results)))
    alternatives = alternatives_table(results)
    if alternatives:
        print("\nprep against the alternatives (the best peer tool, warm):")
        print(alternatives)
    print(f"\n{results.wall_s:.0f} s; results.json, report.md and plots in {args.out}/")
    return 1 if results.broken() else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks [...]``: the harness over ``argv`` (default: the command line)."""
    parser = argparse.ArgumentParser(prog=PROG, description=HELP)
    configure(parser)
    return command(parser.parse_args(argv))
