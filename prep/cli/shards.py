"""``prep run`` and ``prep make-shards``: their arguments and handlers (``prep/cli`` registers
them); the handlers only build a :class:`~prep.run.RunConfig` and call :mod:`prep.run`."""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

from ..api import shutdown
from ..errors import UsageError
from ..registry import EXECUTORS as REGISTRY
from ..run import (
    PARALLEL,
    ROW_ERRORS,
    RunConfig,
    ShardProgress,
    explain_cluster,
    explain_run,
    make_shards,
    run_shards,
    sigterm_raises,
)
from .args import columns, count, key_value, number, positive, shape

__all__ = ["MAKE_HELP", "RUN_HELP", "configure_make", "configure_run", "make", "run"]

RUN_HELP = "transform a folder of tensor shards with a row function"
MAKE_HELP = "write a synthetic data set of shards"


def configure_run(p: argparse.ArgumentParser) -> None:
    """What ``prep run`` reads, computes and writes."""
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".pt/.safetensors files or folders")
    p.add_argument("--out", required=True, type=Path, help="output folder (and its manifest)")
    p.add_argument(
        "--fn",
        required=True,
        help="the row function, MODULE:FUNCTION or path/to/file.py:FUNCTION; each row of a "
        "dict shard calls it with every column as a keyword, by name (a scalar column as a "
        "0-d tensor); it returns a tensor (saved as out), a tuple (out0, out1, ...) or a dict",
    )
    p.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="per-worker state: called once where each worker runs (a tokenizer, a model); "
        "the row function gets what it returns as the keyword state=",
    )
    p.add_argument(
        "--arg",
        action="append",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument bound to the function (int, float, true/false or text)",
    )
    p.add_argument(
        "--columns",
        type=columns,
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
    _configure_run_after(p)


def _configure_run_rows(g: argparse._ArgumentGroup) -> None:
    """Row-level options (prep.run.config): ragged rows padded, failing rows filled or left out."""
    g.add_argument(
        "--pad",
        type=number,
        metavar="VALUE",
        help="let rows return outputs of different sizes: each output is padded with VALUE "
        "(a number, e.g. 0, -1 or nan) at the end of every dim to its shard's largest row, "
        "and each row's size is saved beside it as NAME_lengths (int64 [rows] for 1-D rows, "
        "[rows, dims] else; e.g. out and out_lengths)",
    )
    g.add_argument(
        "--pad-to",
        type=shape,
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
        "--seed",
        type=int,
        metavar="N",
        help="seed each row's random draws from N, the shard's path inside the input folder "
        "and the row: the same rows from every executor, worker count, machine and --resume "
        "(a function with an rng parameter draws from that generator; docs/api.md)",
    )
    g.add_argument(
        "--fill",
        type=number,
        metavar="VALUE",
        help="a failed row's value under --on-row-error fill (default: the --pad value, else 0); "
        "its lengths are 0",
    )


def _configure_run_how(p: argparse.ArgumentParser) -> None:
    """How ``prep run`` runs its shards: whole or by rows, executor, workers, jobs, device."""
    p.add_argument(
        "--parallel",
        choices=PARALLEL,
        default="auto",
        help="shards: each worker process takes whole shards (loads, computes with one "
        "worker's share of torch's threads, saves), as the DataLoader does with batches; "
        "rows: one shard at a time in this process, its rows spread by --executor; auto "
        "(the default): measured on a few rows of the first shard, once per run; --explain "
        "says which and why",
    )
    p.add_argument(
        "--executor",
        default="auto",
        choices=[*REGISTRY],
        help="how a shard's rows run (default auto: serial inside whole-shard workers, "
        "measured on the first shard otherwise); threads, processes and joblib spread "
        "each shard's rows, so they imply --parallel rows",
    )
    p.add_argument(
        "--workers",
        type=positive,
        help="worker processes (default: one per core): whole-shard workers, or the row "
        "executor's; each gets cores/workers of torch's threads, so more workers than cores "
        "oversubscribe them, and each whole-shard worker holds a shard in memory",
    )
    p.add_argument(
        "--jobs",
        type=positive,
        help="shards in flight at once (default: 2 per whole-shard worker, so each has its "
        "next shard queued; 2 with --parallel rows, one computing while the other loads or "
        "saves; with --cluster, one per worker thread). Fewer than the workers leaves "
        "workers idle; more with --parallel rows only holds more shards in memory, since "
        "one shard computes at a time",
    )
    p.add_argument(
        "--device",
        help="where the function runs, e.g. cuda: each shard's tensors are moved there "
        "(outputs are saved from the CPU)",
    )


def _configure_run_after(p: argparse.ArgumentParser) -> None:
    """What ``prep run`` does after a stop or a failure, where it runs, what it says."""
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
        help="print what the run would do and why, and stop (nothing is written): whole "
        "shards or rows (measured on the first shard), the torch threads prep sets, the "
        "jobs, and each shard's executor (--executor, or what auto measured), with the "
        "row options",
    )


def run(ns: argparse.Namespace) -> int:
    keys = [k for k, _ in ns.arg]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise UsageError(f"--arg {', '.join(dupes)} given more than once")
    # every field but args is the flag of the same name
    given = {f.name: getattr(ns, f.name) for f in dataclasses.fields(RunConfig) if f.name != "args"}
    config = RunConfig(args=dict(ns.arg), **given)
    if ns.fill is not None and ns.on_row_error != "fill":
        raise UsageError(f"--fill {ns.fill} is for --on-row-error fill; pass that too")
    with warnings.catch_warnings():
        # map_rows warns once a shard about its failed rows; the run reports them itself
        warnings.filterwarnings("ignore", r"\d+ of \d+ rows failed", RuntimeWarning)
        try:
            return _explain(ns, config) if ns.explain else _run_all(ns, config)
        finally:
            shutdown()  # warm row pools: no worker process outlives the command


def _explain(ns: argparse.Namespace, config: RunConfig) -> int:
    if ns.cluster is not None:
        print(explain_cluster(ns.inputs, config, ns.cluster, ns.jobs))
    else:
        print(explain_run(ns.inputs, config, ns.parallel, ns.jobs))
    return 0


def _run_all(ns: argparse.Namespace, config: RunConfig) -> int:
    with sigterm_raises():
        summary = run_shards(
            ns.inputs,
            ns.out,
            config,
            jobs=ns.jobs,
            on_error=ns.on_error,
            resume=ns.resume,
            cluster=ns.cluster,
            progress=ShardProgress(quiet=ns.quiet),
            parallel=ns.parallel,
        )
    return summary.exit_code


def configure_make(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="folder to write the shards to")
    p.add_argument("--shards", type=positive, default=4)
    p.add_argument("--rows", type=count, default=256, help="rows per shard")
    p.add_argument("--seq", type=positive, default=64, help="sequence length L")
    p.add_argument("--dim", type=positive, default=16, help="features per token F")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=["pt", "safetensors"], default="pt")
    p.add_argument("--quiet", action="store_true")


def make(ns: argparse.Namespace) -> int:
    paths = make_shards(
        ns.out, shards=ns.shards, rows=ns.rows, seq=ns.seq, dim=ns.dim, seed=ns.seed, fmt=ns.format
    )
    if not ns.quiet:
        size = sum(p.stat().st_size for p in paths) / 1e6
        print(f"wrote {len(paths)} shard(s), {size:,.1f} MB, to {ns.out}")
    return 0
