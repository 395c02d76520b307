"""Benchmark harness: which executor wins for which workload (``prep bench``).

>>> from prep.bench import Grid, run
>>> res = run(Grid(workloads=("noop",), executors=("serial", "loop"), rows=(4,),
...                workers=(1,), repeat=1))
>>> sorted(c.executor for c in res.cells)
['loop', 'serial']
"""

from __future__ import annotations

from .grid import Grid
from .harness import run
from .results import Cell, Results, Startup
from .timing import Timing, interleaved, table
from .workloads import WORKLOADS, Workload

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
