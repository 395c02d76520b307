"""Messages with tensors over a worker's pipe: the tensors' shared memory rides as file
descriptors in the same socket (SCM_RIGHTS), the rest is pickled bytes.

torch.multiprocessing sends a shared tensor as a descriptor fetched *later*: the
receiver connects to a "resource sharer" thread in the sender (a socket, an HMAC
handshake: about 0.35 ms a tensor here), which must still be alive then. A
worker that finished batch k and then crashed on batch k+1 would lose batch k's
output. Here the descriptors travel with the message itself, so the kernel holds
them until they are read, whoever has died since, and one message costs one
``sendmsg`` more, whatever its number of tensors.

Small tensors (a padded batch's lengths) travel as bytes in the message: a
shared-memory segment costs more than copying a few kilobytes.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import socket
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

import torch
from torch import Tensor

from ..core.output import shared_empty
from ..core.rows import raw_tensor

__all__ = ["recv", "send"]

#: tensors up to this many bytes are copied into the message instead of shared
INLINE = 64 * 1024


class _Pickler(pickle.Pickler):
    """A pickler that sends plain CPU tensors its own way (:meth:`_tensor`), looked up
    by their exact type: every other object pickles as it always does, without a
    call into Python for each (a ``persistent_id`` would be called for every one)."""

    def __init__(self, buffer: io.BytesIO) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds: list[int] = []
        self._by_storage: dict[int, int] = {}  # storage address -> index in fds
        self.keep: list[Any] = []  # storages whose fds are in flight
        self.dispatch_table = {**copyreg.dispatch_table, Tensor: self._tensor}

    def _tensor(self, obj: Tensor) -> Any:
        if obj.device.type != "cpu" or obj.requires_grad:
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # torch's own way
        if obj.nbytes <= INLINE and (reduced := raw_tensor(obj)) is not None:
            return reduced
        storage = obj.untyped_storage()
        fd_size = _fd_of(storage) if storage.is_shared() else None
        if fd_size is None:  # a copy in shared memory; the caller's stays as it is
            obj = shared_empty(obj.shape, obj.dtype).copy_(obj)
            storage = obj.untyped_storage()
            fd_size = _fd_of(storage)
            assert fd_size is not None, "a tensor prep shared has a file descriptor"
        key = storage.data_ptr()
        index = self._by_storage.get(key)
        if index is None:
            fd, size = fd_size
            index = self._by_storage[key] = len(self.fds)
            self.fds.append(fd)
            self.keep.append((storage, size))
        size = self.keep[index][1]
        args = (index, size, obj.dtype, tuple(obj.shape), obj.stride(), obj.storage_offset())
        return _shared, args


def _fd_of(storage: Any) -> tuple[int, int] | None:
    """The shared storage's descriptor and size; None where it has none (shared by file
    name, torch's other strategy: a DataLoader under file_system)."""
    try:
        fd, size = storage._share_fd_cpu_()
    except RuntimeError:
        return None
    return int(fd), int(size)


#: the descriptors of the message this thread is loading, and the storages made of them
_loading = threading.local()


def _shared(
    index: int,
    size: int,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
) -> Tensor:
    """A tensor on the shared storage of the message's ``index``-th descriptor."""
    storages: dict[int, Any] = _loading.storages
    storage = storages.get(index)
    if storage is None:
        # torch's own rebuild of an fd-shared storage (not in its stubs)
        storage = storages[index] = torch.UntypedStorage._new_shared_fd_cpu(  # type: ignore[attr-defined]
            _loading.fds[index], size
        )
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def send(conn: Connection, obj: Any) -> None:
    """``obj`` down ``conn`` (a socket pipe), its large tensors by file descriptor: one
    message (the number of descriptors, then the pickle), then the descriptors."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    pickler = _Pickler(buffer)
    pickler.dump(obj)
    view = buffer.getbuffer()
    view[:4] = len(pickler.fds).to_bytes(4, "little")
    conn.send_bytes(view)
    del view
    if pickler.fds:
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            sendfds(s, pickler.fds)


def recv(conn: Connection) -> Any:
    """What :func:`send` sent, its tensors mapped here (the descriptors then closed)."""
    data = conn.recv_bytes()
    count = int.from_bytes(data[:4], "little")
    fds: list[int] = []
    if count:
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            fds = recvfds(s, count)
    _loading.fds, _loading.storages = fds, {}
    try:
        return pickle.loads(memoryview(data)[4:])
    finally:
        _loading.fds, _loading.storages = [], {}
        for fd in fds:  # each storage holds its own mapping now
            os.close(fd)
