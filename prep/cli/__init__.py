"""The ``prep`` command line: parses arguments and calls the library, nothing more.

    prep run INPUT... --out DIR --fn MODULE:FUNCTION [--arg KEY=VALUE ...] [...]
    prep make-shards --out DIR [--shards N --rows N --seq L --dim F --seed S]
    prep info [--json]

Each command is one entry of :data:`COMMANDS`: its help line, a function that
adds its arguments to its subparser, and its handler (``Namespace -> exit code``).
``prep run`` and ``prep make-shards`` are in :mod:`prep.cli.shards`, ``prep bench``
in :mod:`prep.cli.bench`, the argument types in :mod:`prep.cli.args`.
Exit codes: 0 done (rows that failed under ``--on-row-error fill|skip`` included:
a warning says how many); 1 some shard failed; 2 bad arguments or settings;
130 interrupted (Ctrl-C); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .._system import info
from ..errors import PrepError, Terminated
from . import bench, shards
from .args import parse_value, positive

__all__ = ["COMMANDS", "Command", "main", "parse_value"]


class Command(NamedTuple):
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handle: Callable[[argparse.Namespace], int]


# ------------------------------------------------------------------ prep info


def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--workers", type=positive, help="show threads per worker for this many")


def _info(ns: argparse.Namespace) -> int:
    facts = info(ns.workers)
    if ns.json:
        print(json.dumps(facts, indent=2))
        return 0
    shm = facts.pop("shm_free_bytes")
    facts["shm_free"] = "n/a" if shm is None else f"{shm / 2**30:.1f} GiB"
    facts["cuda_devices"] = ", ".join(facts["cuda_devices"]) or "none"
    width = max(map(len, facts))
    for key, value in facts.items():
        print(f"{key.replace('_', ' '):<{width}}  {value}")
    return 0


# ------------------------------------------------------------------ prep forget


def _configure_forget(p: argparse.ArgumentParser) -> None:
    p.set_defaults()  # no options: the file is PREP_WISDOM's, or the cache folder's


def _forget(ns: argparse.Namespace) -> int:
    from ..auto import wisdom

    where = wisdom.location()
    if where is None:
        print(f"wisdom is off ({wisdom.ENV}={os.environ.get(wisdom.ENV)!r}): nothing to forget")
        return 0
    held = wisdom.forget()
    print(f"forgot {held} remembered choice{'s' * (held != 1)} of auto ({where})")
    return 0


# ------------------------------------------------------------------ dispatch

#: command name -> Command; adding a command is adding an entry
COMMANDS: dict[str, Command] = {
    "run": Command(shards.RUN_HELP, shards.configure_run, shards.run),
    "make-shards": Command(shards.MAKE_HELP, shards.configure_make, shards.make),
    "info": Command(
        "what this machine offers prep (cores, threads, shm, CUDA)", _configure_info, _info
    ),
    "bench": Command(bench.HELP, bench.configure, bench.run),
    "forget": Command(
        "clear what auto remembered across runs (its wisdom file)", _configure_forget, _forget
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring)."""
    top = argparse.ArgumentParser(
        prog="prep", description="Preprocess tensors with a per-row function, fast and safely."
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    try:
        ns = top.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's usage error
        return int(exc.code or 0)
    prog = f"prep {ns.command}"
    try:
        return COMMANDS[ns.command].handle(ns)
    # an OSError: e.g. the disk under --out filled up while the manifest was written
    except (PrepError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        # ConfigError (UsageError among them) is a ValueError: bad arguments, like argparse's
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt as exc:
        return 143 if isinstance(exc, Terminated) else 130
