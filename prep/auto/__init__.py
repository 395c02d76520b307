"""``executor="auto"``: measure the row function on the batch, predict, choose, adapt.

* :mod:`.calibrator` measures (on the first batch of a signature, writing every
  row it runs into the output), through each executor's own steps
  (``CostModel.measure``: auto names no executor, it asks the registry);
* :mod:`._figures` holds the figures, :mod:`.calibration` is the report a user
  reads (:mod:`._explain` writes it out), and :mod:`._decisions` takes every
  decision from the figures;
* :mod:`.executor` is the executor registered as ``"auto"``: it calibrates,
  starts a process pool when that pays, runs, times each batch and adapts.
"""

from __future__ import annotations

from ._decisions import Decisions
from ._figures import POOL_MARGIN, Figures
from ._sample import Sample
from .calibration import Calibration, signature
from .calibrator import Calibrator
from .executor import AutoExecutor
from .models import left_out

__all__ = [
    "POOL_MARGIN",
    "AutoExecutor",
    "Calibration",
    "Calibrator",
    "Decisions",
    "Figures",
    "Sample",
    "left_out",
    "signature",
]
