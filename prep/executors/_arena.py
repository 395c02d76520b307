"""The batch's columns in shared memory, where every worker maps the same pages.

Buffers prep made are reused for the next batch of the same shapes (a warm pool
does not even re-send them); a column the caller passed already shared (a
DataLoader's) is used as it is and never written.
"""

from __future__ import annotations

import itertools

import torch

from .._output import shared_empty
from .._rows import Rows, SampleRows, TensorRows
from ..errors import ConfigError
from ._transport import check_shm


class Arena:
    def __init__(self) -> None:
        # (key, shared column buffer, owned): only buffers prep made are reused
        self._held: list[tuple[int, torch.Tensor, bool]] = []
        self._keys = itertools.count()

    def clear(self) -> None:
        self._held = []

    def share(self, rows: Rows) -> tuple[Rows, list[int], dict[int, torch.Tensor]]:
        """Put the batch's columns in shared memory, reusing last batch's buffers."""
        if isinstance(rows, SampleRows):
            return rows.shell(), [], {}
        assert isinstance(rows, TensorRows)
        for c in rows.columns:
            if c.device.type != "cpu":
                raise ConfigError(
                    f"executor='processes' got a tensor on {c.device}; workers never touch "
                    f"CUDA, so pass CPU tensors (and device= for the result), or use "
                    f"executor='threads' or 'vectorized' for a batch already on the GPU"
                )
        needed = sum(c.nbytes for c in rows.columns if not c.is_shared())
        check_shm(needed, "the batch")
        arena, keys, columns = [], [], {}
        for j, c in enumerate(rows.columns):
            if c.is_shared() and c.is_contiguous() and c.storage_offset() == 0:
                key, buf, owned = next(self._keys), c, False  # already shared (a DataLoader's)
            elif j < len(self._held) and self._held[j][2] and _same_layout(self._held[j][1], c):
                key, buf, owned = self._held[j]
                buf.copy_(c)
            else:
                key, owned = next(self._keys), True
                buf = shared_empty(c.shape, c.dtype)
                buf.copy_(c)
            arena.append((key, buf, owned))
            keys.append(key)
            columns[key] = buf
        self._held = arena
        return rows.shell(), keys, columns


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
