"""``print(calibration)``: what auto measured, predicted, observed and chose, in a few
lines (the figures themselves are :class:`~prep.auto.Calibration`'s fields)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .calibration import Calibration


def describe(cal: Calibration) -> str:
    us = lambda s: f"{s * 1e6:,.1f} us" if s is not None else "-"  # noqa: E731
    dispatch = ""
    if cal.process_dispatch is not None:
        dispatch = (
            f", process dispatch {cal.process_dispatch * 1e3:.2f} ms/batch"
            if cal.dispatch_measured
            else f", process dispatch ~{cal.process_dispatch * 1e3:.0f} ms/batch assumed"
        )
    start = ""
    if "processes" in cal.predicted and not cal.processes_ready:
        start = (
            f" (no pool yet: +{cal.process_start * 1e3:,.0f} ms to start it, measured)"
            if cal.process_start is not None
            else " (no pool yet: its start-up is measured once prep's forkserver is up)"
        )
    lines = [
        f"auto: {cal.rows} rows, {cal.workers} workers"
        + (f", {cal.options}" if cal.options else "")
        + f"; calibrated in {cal.seconds * 1e3:.1f} ms, computing {cal.sample} of the rows",
        f"  serial {us(cal.serial_row)}/row"
        + (f" ({us(cal.one_thread_row)} on one worker's threads)" if cal.one_thread_row else "")
        + (f", vectorized {us(cal.vectorized_row)}/row" if cal.vectorized_row else "")
        + (f", vmap {us(cal.vmap_row)}/row" if cal.vmap_row else "")
        + (f", threads run {cal.thread_speedup:.2f}x serial" if cal.thread_speedup else "")
        + dispatch
        + start,
        "  predicted for a whole batch: "
        + ", ".join(
            f"{k} {v * 1e3:.1f} ms" for k, v in sorted(cal.predicted.items(), key=lambda kv: kv[1])
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
    lines += [f"  not considered: {k} ({why})" for k, why in cal.dropped.items()]
    lines += [f"  {e}" for e in cal.events]
    saving = cal.processes_would_save(cal.rows)
    if saving and cal.process_start:
        lines.append(
            f"  processes would save {saving * 1e3:,.1f} ms a batch once started: "
            f"they start after about {math.ceil(cal.process_start / saving)} batches "
            f"({cal.saved_by_processes * 1e3:,.1f} ms saved so far)"
        )
    lines.append(f"  choice: {cal.choice}")
    return "\n".join(lines)
