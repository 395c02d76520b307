"""``prep bench``: your row function on every executor, and against the tools you would
otherwise use, on your machine.

:class:`Race` runs it (:mod:`prep.bench.race`), :func:`report` draws the table,
:mod:`prep.bench.peers` holds the two peers (a ``multiprocessing.Pool`` and a
``DataLoader`` with workers), and :func:`interleaved` is the timing every benchmark
of the repository uses: medians of interleaved repeats, with their spread.

>>> import torch
>>> from prep.bench import Race, report
>>> cells = Race(rows=(8,), workers=2, repeat=1, executors=("threads",)).run(
...     torch.neg, lambda rows: torch.arange(rows * 2.0).view(rows, 2))
>>> [c.variant for c in cells]
['serial', 'threads']
>>> print(report(cells).splitlines()[0])
| rows | variant   | median ms | spread | rows/s | vs serial | note |
"""

from __future__ import annotations

from .race import Cell, Race, broken, report
from .timing import Timing, interleaved, table

__all__ = ["Cell", "Race", "Timing", "broken", "interleaved", "report", "table"]
