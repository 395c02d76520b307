"""The ``prep`` command line: parses arguments and calls the library, nothing more.

    prep run INPUT... --out DIR --fn MODULE:FUNCTION [--arg KEY=VALUE ...] [...]
    prep make-shards --out DIR [--shards N --rows N --seq L --dim F --seed S]
    prep info [--json]

Each command is one entry of :data:`COMMANDS`: its help line, a function that
adds its arguments to its subparser, and its handler (``Namespace -> exit code``).
Exit codes: 0 done (rows that failed under ``--on-row-error fill|skip`` included:
a warning says how many); 1 some shard failed; 2 bad arguments or settings;
130 interrupted (Ctrl-C); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from . import info
from .api import shutdown
from .bench import command as bench_command
from .errors import PrepError, Terminated, UsageError
from .registry import EXECUTORS as REGISTRY
from .run import (
    ROW_ERRORS,
    Progress,
    RunConfig,
    explain_first_shard,
    make_shards,
    run_shards,
    sigterm_raises,
)
from .run.rows import describe

__all__ = ["COMMANDS", "Command", "main", "parse_value"]


class Command(NamedTuple):
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handle: Callable[[argparse.Namespace], int]


# ------------------------------------------------------------------ argument types


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer (>= 1)")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; pass an integer >= 0")
    return value


def parse_value(text: str) -> bool | int | float | str:
    """A ``--arg`` value: ``true``/``false`` (any case), an int, a float, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE with KEY a Python identifier; e.g. --arg max_len=16"
        )
    return key, parse_value(value)


def _number(text: str) -> bool | int | float:
    """A ``--pad``/``--fill`` value: a number (``nan`` and ``inf`` too) or true/false."""
    value = parse_value(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. 0, -1, 0.5 or nan")
    return value


def _shape(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a shape; give sizes >= 0 separated by commas, e.g. 128 or 3,64"
        )
    return sizes


def _columns(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty column name; e.g. --columns x,mask"
        )
    return names


# ------------------------------------------------------------------ prep run


def _configure_run(p: argparse.ArgumentParser) -> None:
    """What ``prep run`` reads, computes and writes."""
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".pt/.safetensors files or folders")
    p.add_argument("--out", required=True, type=Path, help="output folder (and its manifest)")
    p.add_argument("--fn", required=True, help="the row function, MODULE:FUNCTION")
    p.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="per-worker state: called once where each worker runs (a tokenizer, a model); "
        "the row function gets what it returns as the keyword state=",
    )
    p.add_argument(
        "--arg",
        action="append",
        type=_arg,
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument bound to the function (int, float, true/false or text)",
    )
    p.add_argument(
        "--columns",
        type=_columns,
        help="comma-separated tensors passed positionally in this order "
        "(default: all of them, by name)",
    )
    p.add_argument(
        "--format", choices=["pt", "safetensors"], help="output format (default: the input's)"
    )
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="load .pt files with weights_only=False, which runs any code their pickle holds; "
        "only for files you trust",
    )
    _configure_run_rows(p.add_argument_group("rows that differ in size, or fail"))
    _configure_run_how(p)


def _configure_run_rows(g: argparse._ArgumentGroup) -> None:
    """Row-level options (prep.run.rows): ragged rows padded, failing rows filled or left out."""
    g.add_argument(
        "--pad",
        type=_number,
        metavar="VALUE",
        help="let rows return outputs of different sizes: each output is padded with VALUE "
        "(a number, e.g. 0, -1 or nan) at the end of every dim to its shard's largest row, "
        "and each row's size is saved beside it as NAME_lengths (int64 [rows] for 1-D rows, "
        "[rows, dims] else; e.g. out and out_lengths)",
    )
    g.add_argument(
        "--pad-to",
        type=_shape,
        metavar="SHAPE",
        help="pad every row of every output to this shape instead, e.g. 128 or 3,64 "
        "(implies --pad 0 unless --pad is given; lengths are saved as with --pad); a "
        "larger row fails its shard",
    )
    g.add_argument(
        "--on-row-error",
        choices=ROW_ERRORS,
        default="raise",
        help="when the function raises on a row: fail the whole shard (raise, the default; "
        "--on-error then decides what the run does), fill the row's outputs with --fill "
        "(fill), or leave the row out of the output (skip). With fill or skip the shard is "
        "saved and done; its manifest entry lists failed_rows (every index) and row_errors "
        "(type: message, the first 100), a warning is printed, and the exit code stays 0",
    )
    g.add_argument(
        "--fill",
        type=_number,
        metavar="VALUE",
        help="a failed row's value under --on-row-error fill (default: the --pad value, else 0); "
        "its lengths are 0",
    )


def _configure_run_how(p: argparse.ArgumentParser) -> None:
    """How ``prep run`` works: executor, slots, device, resume, errors, cluster, output."""
    p.add_argument(
        "--executor",
        default="auto",
        choices=[*REGISTRY],
        help="how rows run inside a shard (default auto: measured on the first shard)",
    )
    p.add_argument("--workers", type=_positive, help="row workers inside a shard")
    p.add_argument(
        "--jobs",
        type=_positive,
        help="shards in flight at once (default 2; with --cluster, one per worker thread)",
    )
    p.add_argument(
        "--device",
        help="where the function runs, e.g. cuda: each shard's tensors are moved there "
        "(outputs are saved from the CPU)",
    )
    p.add_argument("--resume", action="store_true", help="skip the shards the manifest proves done")
    p.add_argument(
        "--on-error",
        choices=["stop", "skip"],
        default="stop",
        help="after a failed shard (unreadable, unwritable, or a row failed under "
        "--on-row-error raise): finish those in flight and start no more (stop, the "
        "default), or go on and list the failures at the end (skip); exit code 1 either way. "
        "For rows, see --on-row-error",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="send shards to the Dask scheduler at tcp://HOST:PORT, or 'local' to start a "
        "LocalCluster here (needs prep[dask]; workers must see the same files)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress or summary (failures and failed rows are still reported)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="measure the function on the first shard, print what executor='auto' would "
        "pick and why, with the row options, and stop (nothing is written)",
    )


def _run(ns: argparse.Namespace) -> int:
    keys = [k for k, _ in ns.arg]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise UsageError(f"--arg {', '.join(dupes)} given more than once")
    config = RunConfig(
        fn=ns.fn,
        args=dict(ns.arg),
        columns=ns.columns,
        executor=ns.executor,
        workers=ns.workers,
        device=ns.device,
        format=ns.format,
        trust_pickle=ns.trust_pickle,
        pad=ns.pad,
        pad_to=ns.pad_to,
        on_row_error=ns.on_row_error,
        fill=ns.fill,
        setup=ns.setup,
    )
    if ns.fill is not None and ns.on_row_error != "fill":
        raise UsageError(f"--fill {ns.fill} is for --on-row-error fill; pass that too")
    with warnings.catch_warnings():
        # map_rows warns once a shard about its failed rows; the run reports them itself
        warnings.filterwarnings("ignore", r"\d+ of \d+ rows failed", RuntimeWarning)
        return _explain(ns, config) if ns.explain else _run_all(ns, config)


def _explain(ns: argparse.Namespace, config: RunConfig) -> int:
    try:
        first, calibration = explain_first_shard(ns.inputs, config)
    finally:
        shutdown()
    print(f"{first}:")
    print(f"row options: {describe(config)}")
    print(calibration)
    return 0


def _run_all(ns: argparse.Namespace, config: RunConfig) -> int:
    try:
        with sigterm_raises():
            summary = run_shards(
                ns.inputs,
                ns.out,
                config,
                jobs=ns.jobs,
                on_error=ns.on_error,
                resume=ns.resume,
                cluster=ns.cluster,
                progress=Progress(quiet=ns.quiet),
            )
    finally:
        shutdown()  # warm row pools: no worker process outlives the command
    return summary.exit_code


# ------------------------------------------------------------------ prep make-shards


def _configure_make(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="folder to write the shards to")
    p.add_argument("--shards", type=_positive, default=4)
    p.add_argument("--rows", type=_count, default=256, help="rows per shard")
    p.add_argument("--seq", type=_positive, default=64, help="sequence length L")
    p.add_argument("--dim", type=_positive, default=16, help="features per token F")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=["pt", "safetensors"], default="pt")
    p.add_argument("--quiet", action="store_true")


def _make(ns: argparse.Namespace) -> int:
    paths = make_shards(
        ns.out, shards=ns.shards, rows=ns.rows, seq=ns.seq, dim=ns.dim, seed=ns.seed, fmt=ns.format
    )
    if not ns.quiet:
        size = sum(p.stat().st_size for p in paths) / 1e6
        print(f"wrote {len(paths)} shard(s), {size:,.1f} MB, to {ns.out}")
    return 0


# ------------------------------------------------------------------ prep info


def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--workers", type=_positive, help="show threads per worker for this many")


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
    from .auto import wisdom

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
    "run": Command("transform a folder of tensor shards with a row function", _configure_run, _run),
    "make-shards": Command("write a synthetic data set of shards", _configure_make, _make),
    "info": Command(
        "what this machine offers prep (cores, threads, shm, CUDA)", _configure_info, _info
    ),
    "bench": Command(bench_command.HELP, bench_command.configure, bench_command.command),
    "forget": Command(
        "clear what auto remembered across runs (its wisdom file)", _configure_forget, _forget
    ),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="prep", description="Preprocess tensors with a per-row function, fast and safely."
    )
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring)."""
    top = parser()
    try:
        ns = top.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's usage error
        return int(exc.code or 0)
    prog = f"prep {ns.command}"
    try:
        return COMMANDS[ns.command].handle(ns)
    except PrepError as exc:
        # ConfigError (UsageError among them) is a ValueError: bad arguments, like argparse's
        code = 2 if isinstance(exc, ValueError) else 1
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return code
    except OSError as exc:  # e.g. the disk under --out filled up while the manifest was written
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        return 143 if isinstance(exc, Terminated) else 130
