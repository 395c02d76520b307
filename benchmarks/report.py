"""How a benchmarks run reads: the terminal table, the summary, report.md and the files.

:func:`write` puts everything into one folder::

    results.json   every figure, the grid and the environment (Results.to_dict), with
                   auto against the best executor and prep against the peers
    table.txt      the terminal table: one row per cell, the winner of each group starred
    report.md      environment, summary of who wins where, auto vs the winner, prep
                   against the alternatives (with --peers), the tables
    throughput.png rows/s against rows per batch, one panel per workload (needs matplotlib)
    winners.png    the fastest variant for each workload and rows per batch
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prep.bench.timing import table

from .alternatives import against_peers
from .auto_vs_best import summarize
from .cell_text import ms, note, rate, startup, times
from .grid import AUTO, AUTO_FIRST, LOOP, PLAIN_JOBLIB, label
from .peers import NOTES as PEER_NOTES
from .results import Cell, Results
from .summary import summary

__all__ = ["alternatives_table", "markdown", "summary", "terminal_table", "write"]


def terminal_table(results: Results) -> str:
    """One row per cell; ``*`` marks the winner of its group (workload, rows, workers)."""
    body = []
    for c in results.cells:
        status = "" if c.status == "ok" else c.status.upper() + ": "
        body.append(
            [
                c.workload,
                str(c.rows),
                str(c.workers),
                ("* " if c.winner else "  ") + c.label,
                ms(c.median_s),
                "-" if c.spread is None else f"{c.spread:.0%}",
                rate(c),
                times(c.speedup),
                startup(c),
                status + note(c),
            ]
        )
    header = ["workload", "rows", "workers", "variant", "median ms", "spread", "rows/s"]
    header += ["vs serial", "start-up ms", "note"]
    return (
        table(body, header) + "\n* fastest in its group (auto and estimated cells do not compete)"
    )


def _breakdown_text(cell: Cell) -> str:
    b = cell.breakdown
    parts = []
    if "compute_est_s" in b:
        parts.append(
            f"compute~{b['compute_est_s'] * 1e3:.3g} + overhead~{b['overhead_est_s'] * 1e3:.3g}"
        )
    if "moved_mb" in b:
        mb = b["moved_mb"]
        parts.append(f"moves {mb:.3g} MB" if mb >= 1 else f"moves {mb * 1024:.3g} KB")
    return "; ".join(parts)


def _workload_table(results: Results, workload: str) -> str:
    body = []
    for c in results.cells:
        if c.workload != workload:
            continue
        spread = "-" if c.low_s is None else f"{ms(c.low_s)}-{ms(c.high_s)}"
        if c.spread is not None:
            spread += f" ({c.spread:.0%})"
        body.append(
            [
                str(c.rows),
                str(c.workers),
                ("**" + c.label + "**") if c.winner else c.label,
                ms(c.median_s),
                spread,
                rate(c),
                times(c.speedup),
                startup(c),
                _breakdown_text(c),
                ("" if c.status == "ok" else c.status + ": ") + " ".join(c.note.split()),
            ]
        )
    header = ["rows", "workers", "variant", "median ms", "min-max ms (spread)", "rows/s"]
    header += ["vs serial", "start-up ms", "breakdown ms (estimates)", "note"]
    return table(body, header)


def markdown(results: Results, plots: list[str] | None = None) -> str:
    """report.md: environment, summary, auto vs the winner, start-up, one table per workload."""
    env = results.environment
    grid = results.grid
    out = ["# prep benchmarks", ""]
    out.append(
        table(
            [[k, str(v)] for k, v in env.items()] + [["wall time", f"{results.wall_s:.0f} s"]],
            ["environment", ""],
        )
    )
    out += [
        "",
        f"Grid: workloads {', '.join(grid['workloads'])}; variants {', '.join(grid['executors'])}; "
        f"{_peers_text(grid)}rows {grid['rows']}; workers {grid['workers']}; {grid['repeat']} "
        f"interleaved repeats per cell (median; spread = (max - min) / median).",
        "",
        "## Who wins where",
        "",
        *summary(results),
        "",
    ]
    out += [f"![{p}]({p})" for p in plots or []]
    out += _auto_section(results) + _alternatives_section(results) + _startup_section(results)
    for workload, about in results.workloads.items():
        out += ["", f"## {workload}", "", about, "", _workload_table(results, workload)]
    out += ["", "## How to read this", "", *NOTES]
    if results.grid.get("peers"):
        out += PEER_NOTES
    return "\n".join(out) + "\n"


#: a column of a table with a row per group: its header, the entry's field, how it reads
Column = tuple[str, str, Callable[[Any], str]]


def _name(variant: str | None) -> str:
    return label(variant) if variant else "-"


_GROUP: list[Column] = [
    ("workload", "workload", str),
    ("rows", "rows", str),
    ("workers", "workers", str),
]
_AUTO: list[Column] = [
    *_GROUP,
    ("winner", "winner", _name),
    ("best executor", "best", _name),
    ("best ms", "best_s", ms),
    ("auto ms", "auto_s", ms),
    ("auto/best", "auto_ratio", times),
    ("auto first call ms", "auto_first_s", ms),
    ("first/best", "auto_first_ratio", times),
    ("auto, N calls ms", "auto_calls_s", ms),
    ("best, N calls + start-up ms", "best_calls_s", ms),
    ("N calls/best", "auto_calls_ratio", times),
]
_ALTERNATIVES: list[Column] = [
    *_GROUP,
    ("best peer", "best_peer", _name),
    ("peer ms", "best_peer_s", ms),
    ("prep's best executor", "best", _name),
    ("prep ms", "best_s", ms),
    ("prep/peer", "best_ratio", times),
    ("auto ms", "auto_s", ms),
    ("auto/peer", "auto_ratio", times),
]


def _groups_table(groups: list[dict[str, Any]], columns: list[Column]) -> str:
    """A markdown table of per-group entries (auto_vs_best's, alternatives'), one row each."""
    body = [[show(g[key]) for _, key, show in columns] for g in groups]
    return table(body, [header for header, _, _ in columns])


def _peers_text(grid: dict[str, object]) -> str:
    peers = grid.get("peers")
    return f"peers {', '.join(peers)}; " if isinstance(peers, list) and peers else ""


def alternatives_table(results: Results) -> str | None:
    """prep's best executor and auto against the best peer, group by group (None: no peer ran)."""
    found = against_peers(results)
    return _groups_table(found["groups"], _ALTERNATIVES) if found["groups"] else None


def _alternatives_section(results: Results) -> list[str]:
    """The table of prep against the best peer ([] where no peer ran)."""
    text = alternatives_table(results)
    skipped = against_peers(results)["skipped"]
    if text is None and not skipped:
        return []
    out = ["", "## prep against the alternatives", ""]
    out += [
        "The fastest peer tool (warm; see the notes at the end for how each is used) "
        "against prep's fastest executor and auto, warm, on the same batches in the same "
        "interleaved repeats; below 1x, prep is faster.",
        "",
    ]
    out += [text, ""] if text else []
    out += [f"- {label(name)}: {why}" for name, why in skipped.items()]
    return out + ([""] if skipped else [])


def _auto_section(results: Results) -> list[str]:
    """The table of auto against the best executor, group by group ([] where auto never ran)."""
    auto = summarize(results)
    if not auto["groups"]:
        return []
    calls = next((g["calls"] for g in auto["groups"] if g["calls"]), None)
    return [
        "",
        f"## {AUTO} against the best executor",
        "",
        f"N = {calls} calls of one fresh pool: auto's first call plus N - 1 times its "
        f"warm median, against the best executor's median times N plus its pool's "
        f"start-up.",
        "",
        _groups_table(auto["groups"], _AUTO),
        "",
    ]


def _startup_section(results: Results) -> list[str]:
    """The start-up probes' table ([] where none ran)."""
    if not results.startup:
        return []
    body = [
        [
            s.executor,
            str(s.workers),
            ms(s.first_call_s),
            ms(s.warm_s),
            ms(s.startup_s),
            s.error or "",
        ]
        for s in results.startup
    ]
    header = ["executor", "workers", "first call ms", "warm ms", "start-up ms", ""]
    return ["## Pool start-up (a fresh prep.Pool on 64 no-op rows)", "", table(body, header)]


NOTES = [
    "- Every cell's repeats are interleaved with the other variants of its group, so a slow "
    "spell of the machine hits all of them alike; the first call of each variant is untimed "
    "and its result is checked against serial's (a variant that raises or differs fails).",
    f"- `{label(AUTO_FIRST)}` is auto's first call for that group in this process, timed "
    "alone; if auto's calibration was already cached for the signature, it is a warm call.",
    "- Start-up is a fresh prep.Pool's first call minus its warm calls, measured once per "
    "executor and workers; the first process pool of an interpreter also starts the "
    "forkserver. 'start-up is repaid after N calls' divides it by the time saved per call.",
    "- The executors report no dispatch/compute/transfer split, so the breakdown is an "
    "estimate: compute = serial's time / workers (an even split), overhead = the rest "
    "(dispatch, transfer, waiting on the GIL, imbalance); 'moves' is the bytes copied "
    "between processes by design (shared memory for processes, pickles for joblib).",
    f"- `{label(LOOP)}` is the seed's `torch.stack([fn(*row) for row in zip(*columns)])`; "
    f"`{label(PLAIN_JOBLIB)}` is `joblib.Parallel(n_jobs=workers)(delayed(fn)(*row) ...)`. "
    "It pickles the whole batch for every row: it is skipped for batches over 64 MB, and "
    "timed on as many rows as ship 256 MB a call, then scaled (marked estimated; such "
    "cells do not compete for the winner).",
]


def write(results: Results, out: Path, note: Callable[[str], None] = print) -> list[Path]:
    """Write results.json, table.txt, report.md and the PNGs into ``out``; return the paths."""
    from .plots import draw

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "table.txt", out / "report.md"]
    data = results.to_dict()
    data["auto"] = summarize(results)
    if results.grid.get("peers"):
        data["peers"] = against_peers(results)
    data["summary"] = summary(results)
    written[0].write_text(json.dumps(data, indent=2) + "\n")
    written[1].write_text(terminal_table(results) + "\n")
    pngs = draw(results, out, note=note)
    written[2].write_text(markdown(results, [p.name for p in pngs]))
    return written + pngs
