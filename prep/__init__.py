"""prep: map a per-row function over a batch of tensors with the executor that wins.

>>> import torch, prep
>>> out = prep.map_rows(lambda row: row * 2, torch.ones(4, 3), executor="threads")
>>> out.shape
torch.Size([4, 3])
"""

from __future__ import annotations

from . import executors, ops
from ._explanation import Explanation
from ._system import info
from ._version import __version__
from .api import explain, map_rows, map_samples, shutdown
from .auto.wisdom import forget
from .collate import Collate
from .core.rowwise import rowwise
from .errors import (
    BatchTimeout,
    ConfigError,
    PrepError,
    RowError,
    ShardError,
    StackError,
    VmapUnsupported,
    WorkerCrashed,
)
from .loader import Loader
from .pool import Pool
from .registry import EXECUTORS

__all__ = [
    "EXECUTORS",
    "BatchTimeout",
    "Collate",
    "ConfigError",
    "Explanation",
    "Loader",
    "Pool",
    "PrepError",
    "RowError",
    "ShardError",
    "StackError",
    "VmapUnsupported",
    "WorkerCrashed",
    "__version__",
    "executors",
    "explain",
    "forget",
    "info",
    "map_rows",
    "map_samples",
    "ops",
    "rowwise",
    "shutdown",
]
