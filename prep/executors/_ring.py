"""Shared-memory buffers that whole batches' tensors travel in, reused.

A new shared-memory segment costs the first touch of its pages in both
processes (about 0.5 ms a megabyte here); a reused one costs a copy. A batch's
large private tensors are copied into buffers the ring lends, and the ring
takes them back once the batch is settled (answered, or its worker dead or
killed): nothing reads them after that. Tensors already in shared memory
travel as they are (their own descriptor), small ones inside the message.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

from ..core.output import shared_empty
from ..core.rows import Rows, TensorRows
from . import _fdpipe
from ._transport import check_shm

__all__ = ["Loan", "Ring"]


class Ring:
    """Shared-memory buffers that batches' tensors travel in, reused (see the module
    docstring); at most ``keep`` idle ones are kept."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._idle: deque[torch.Tensor] = deque()  # flat uint8, shared
        self._lock = threading.Lock()

    def loan(self, rows: Rows, holders: int) -> tuple[Rows, Loan | None]:
        """``rows`` as they travel, their large private tensors copied into the ring's
        buffers, and the loan of those buffers that its ``holders`` (the tickets that
        send them) give back together; ``rows`` and None where nothing is worth it."""
        if not isinstance(rows, TensorRows) or not any(map(self._worth, rows.columns)):
            return rows, None
        lent: list[torch.Tensor] = []
        columns = []
        for c in rows.columns:
            if self._worth(c):
                buf = self._take(c.nbytes)
                lent.append(buf)
                c = buf.view(c.dtype).view(c.shape).copy_(c)
            columns.append(c)
        travels = TensorRows(tuple(columns), rows.names, rows.offset, rows.check, rows.seeds)
        return travels, Loan(self, lent, holders)

    @staticmethod
    def _worth(c: torch.Tensor) -> bool:
        return (
            c.device.type == "cpu"
            and not c.requires_grad
            and c.nbytes > _fdpipe.INLINE
            and not c.untyped_storage().is_shared()
        )

    def _take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            for i, buf in enumerate(self._idle):
                if buf.nbytes == nbytes:
                    del self._idle[i]  # by place: deque.remove would compare tensors by ==
                    return buf
        check_shm(nbytes, "the batch")  # a clear error, not a bus error in a worker
        return shared_empty((nbytes,), torch.uint8)

    def give_back(self, bufs: list[torch.Tensor]) -> None:
        with self._lock:
            self._idle.extend(bufs)
            while len(self._idle) > self.keep:
                self._idle.popleft()

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()


class Loan:
    """Buffers lent for one batch that travels as several tickets (its parts): given
    back to the ring when the last of them is settled."""

    def __init__(self, ring: Ring, bufs: list[torch.Tensor], holders: int) -> None:
        self.ring, self.bufs, self.holders = ring, bufs, holders
        self._lock = threading.Lock()

    def settled(self) -> None:
        """One holder is settled (each calls this once)."""
        with self._lock:
            self.holders -= 1
            last = self.holders == 0
        if last:
            self.ring.give_back(self.bufs)
