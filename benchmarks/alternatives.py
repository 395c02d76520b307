"""prep against the alternatives: per group, the best peer tool against prep's best.

For each group where a peer ran warm (``python -m benchmarks --peers``, :mod:`benchmarks.peers`):

- ``best_peer``: the peer with the lowest warm median (first calls aside);
- ``best``: prep's fastest executor of the registry (auto aside, as in
  :mod:`benchmarks.auto_vs_best`), and ``best_ratio``, its median over the best
  peer's: below 1, prep's best is faster;
- ``auto_ratio``: warm auto's median over the best peer's.

:func:`against_peers` adds the share of groups where each ratio is at most 1
(prep as fast or faster), and the peers skipped everywhere with the reason.
"""

from __future__ import annotations

from typing import Any

from .auto_vs_best import WITHIN, best_executor, ratio, share_within
from .grid import AUTO
from .peers import PEERS
from .results import Cell, Results

__all__ = ["against_peers"]


def against_peers(results: Results) -> dict[str, Any]:
    """One entry per group where a peer ran, the shares where prep keeps up, the skipped."""
    entries = [
        entry for key, cells in results.groups() if (entry := _entry(key, cells)) is not None
    ]
    return {
        "groups": entries,
        "best_at_most_peer": share_within(entries, "best_ratio", 1.0),
        "auto_at_most_peer": share_within(entries, "auto_ratio", 1.0),
        "auto_within": share_within(entries, "auto_ratio", WITHIN),
        "threshold": WITHIN,
        "skipped": _skipped(results),
    }


def _entry(key: tuple[str, int, int], cells: list[Cell]) -> dict[str, Any] | None:
    peers = [c for c in cells if c.status == "ok" and c.executor in PEERS and c.median_s]
    if not peers:
        return None
    peer = min(peers, key=lambda c: c.median_s or 0.0)
    best = best_executor(cells)
    auto = next((c for c in cells if c.executor == AUTO and c.status == "ok"), None)
    return {
        "workload": key[0],
        "rows": key[1],
        "workers": key[2],
        "best_peer": peer.executor,
        "best_peer_s": peer.median_s,
        "best": best.executor if best else None,
        "best_s": best.median_s if best else None,
        "best_ratio": ratio(best, peer),
        "auto_s": auto.median_s if auto else None,
        "auto_ratio": ratio(auto, peer),
    }


def _skipped(results: Results) -> dict[str, str]:
    """Peers that ran nowhere because they cannot here (a package missing): name -> why."""
    found: dict[str, str] = {}
    ran = {c.executor for c in results.cells if c.status != "skipped"}
    for c in results.cells:
        if c.executor in PEERS and c.status == "skipped" and c.executor not in ran:
            found.setdefault(c.executor, c.note)
    return found
