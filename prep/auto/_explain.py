"""``print(calibration)``: what auto measured, predicted, observed and chose, in a few
lines (the figures themselves are :class:`~prep.auto.Figures`' fields).

:func:`render` reads one signature's figures and writes them out: it renders, and
decides nothing. It writes each executor's own figures (kept under
its name) by that name; the one word it holds of any (:data:`ONE`) is a word."""

from __future__ import annotations

import math

from ..executors import traits_of
from ._figures import Figures

#: how a line names one of a pool's workers, where that is not its name
ONE = {"processes": "process"}
#: what a line says of a form auto rents or buys whose start is a compile, not a pool's
#: (``Traits.compiles``; not started: what it is, and when it starts)
COMPILES = (
    "not compiled yet",
    "{} compiles once the batches so far have taken as long as its compile",
)


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:,.1f} us" if seconds is not None else "-"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def render(cal: Figures) -> str:
    """One signature's figures: the sentence of :func:`_why`, then the figures, what was
    left out and why, the events, and the choice."""
    predicted = sorted(cal.predicted.items(), key=lambda kv: kv[1])
    lines = [
        _why(cal),
        f"auto: {cal.rows} rows, {cal.workers} workers"
        + (f", {cal.options}" if cal.options else "")
        + f"; calibrated in {cal.seconds * 1e3:.1f} ms, computing {cal.sample} of the rows",
        _measured(cal),
        "  predicted for a whole batch: "
        + ", ".join(
            f"{k} {v * 1e3:.1f} ms" if v or k not in cal.to_start() else f"{k} not measured"
            for k, v in predicted
        ),
    ]
    if cal.observed:
        lines.append(
            "  measured a whole batch (median): "
            + ", ".join(
                f"{k} {cal.figure(k) * 1e3:.1f} ms over {len(v)}"
                for k, v in sorted(cal.observed.items(), key=lambda kv: cal.figure(kv[0]))
            )
        )
    if cal.setup_seconds:
        lines.append(
            f"  setup= takes {cal.setup_seconds * 1e3:,.1f} ms here: a new process pool "
            f"counts it once a worker in its start-up"
        )
    reasons: dict[str, list[str]] = {}  # executors left out for one reason, on one line
    for name, reason in cal.dropped.items():
        reasons.setdefault(reason, []).append(name)
    lines += [f"  not considered: {', '.join(names)} ({r})" for r, names in reasons.items()]
    lines += [f"  {e}" for e in cal.events]
    lines += _starts(cal)
    if cal.remembered:
        lines.append(
            f"  remembered from an earlier run on this machine ({cal.remembered}); every "
            f"batch is still timed, and the choice moves when the figures do"
        )
    lines.append(f"  choice: {cal.choice}")
    return "\n".join(lines)


def _why(cal: Figures) -> str:
    """One sentence first: what auto runs and why, before the figures."""
    choice = cal.choice
    waiting = {n for n in cal.to_start() if not cal.figure(n)}  # not measured: no figure
    others = sorted((n for n in cal.predicted if n not in {choice, *waiting}), key=cal.figure)
    if cal.remembered and not cal.observed:
        return f"{choice}: remembered from an earlier run here, not yet timed in this one."
    if not cal.settled:
        return (
            f"{choice} for now: a batched form ran this first batch without winning "
            f"outright, so the pools are measured on the next one."
        )
    light = cal.dropped.get("processes", "")
    if choice == "serial" and light.startswith("the batch takes"):
        return f"serial: {light}, so no pool can win."
    measured = "measured" if cal.observed.get(choice) else "predicted"
    text = f"{choice}: {measured} {_ms(cal.figure(choice))} a batch"
    if others:
        text += ", against " + ", ".join(f"{n} {_ms(cal.figure(n))}" for n in others[:2])
    for name in cal.to_start():
        if name != choice and cal.figure(name) < cal.figure(choice):
            text += "; " + (
                COMPILES[1].format(name)
                if traits_of(name).compiles
                else f"{name} start once what they save has paid for their start-up"
            )
    return text + "."


def _measured(cal: Figures) -> str:
    """The calibration's per-row figures, in one line."""
    one_thread = cal.one_thread_row
    text = f"  serial {_us(cal.serial_row)}/row" + (
        f" ({_us(one_thread)} on one worker's threads)" if one_thread else ""
    )
    text += "".join(f", {n} {_us(row)}/row" for n, row in cal.batched_rows.items() if row)
    text += "".join(f", {n} run {x:.2f}x serial" for n, x in cal.speedup.items() if x)
    for name, seconds in cal.dispatch.items():
        text += (
            f", {ONE.get(name, name)} dispatch {seconds * 1e3:.2f} ms/batch"
            if cal.dispatch_measured
            else f", {ONE.get(name, name)} dispatch ~{seconds * 1e3:.0f} ms/batch assumed"
        )
    for name in cal.to_start():
        start = cal.start.get(name)
        if traits_of(name).compiles:
            text += f", {name} {COMPILES[0]}" + (
                f" (+{start * 1e3:,.0f} ms to compile it)" if start is not None else ""
            )
            continue
        text += (
            f" (no pool yet: +{start * 1e3:,.0f} ms to start it, measured)"
            if start is not None
            else " (no pool yet: its start-up is measured once prep's forkserver is up)"
        )
    return text


def _starts(cal: Figures) -> list[str]:
    """When a pool auto rents or buys would start, and what checking its rows cost."""
    lines = []
    for name, start in cal.start.items():
        saving = cal.would_save(name, cal.rows)
        if saving and start:
            lines.append(
                f"  {name} would save {saving * 1e3:,.1f} ms a batch once started: "
                f"they start after about {math.ceil(start / saving)} batches "
                f"({cal.saved.get(name, 0.0) * 1e3:,.1f} ms saved so far)"
            )
    if cal.check_seconds:
        lines.append(
            f"  checking rows in the workers against serial's here took "
            f"{cal.check_seconds * 1e3:,.1f} ms, once"
        )
    return lines


__all__ = ["COMPILES", "ONE", "render"]
