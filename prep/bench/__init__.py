"""Benchmark harness: which executor wins for which workload (``prep bench``).

>>> from prep.bench import Grid, run
>>> res = run(Grid(workloads=("noop",), executors=("serial", "loop"), rows=(4,),
...                workers=(1,), repeat=1))
>>> sorted(c.executor for c in res.cells)
['loop', 'serial']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .grid import Grid
    from .harness import run
    from .results import Cell, Results, Startup
    from .timing import Timing, interleaved, table
    from .workloads import WORKLOADS, Workload

#: name -> the module that holds it: imported on first use, so that every ``prep``
#: command (which lists ``prep bench`` among its commands) does not pay for the harness
_WHERE = {
    "Grid": "grid",
    "run": "harness",
    "Cell": "results",
    "Results": "results",
    "Startup": "results",
    "Timing": "timing",
    "interleaved": "timing",
    "table": "timing",
    "WORKLOADS": "workloads",
    "Workload": "workloads",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "WORKLOADS",
    "Cell",
    "Grid",
    "Results",
    "Startup",
    "Timing",
    "Workload",
    "interleaved",
    "run",
    "table",
]
