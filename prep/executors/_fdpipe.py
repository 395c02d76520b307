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

import ctypes
import io
import os
import pickle
import socket
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

import torch
from torch import Tensor

from ..core.output import shared_empty

__all__ = ["recv", "send"]

#: tensors up to this many bytes are copied into the message instead of shared
INLINE = 64 * 1024


class _Pickler(pickle.Pickler):
    def __init__(self, buffer: io.BytesIO) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds: list[int] = []
        self._by_storage: dict[int, int] = {}  # storage address -> index in fds
        self.keep: list[Any] = []  # storages whose fds are in flight

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not Tensor or obj.device.type != "cpu" or obj.requires_grad:
            return None
        if obj.nbytes <= INLINE:
            t = obj.contiguous()
            return ("raw", ctypes.string_at(t.data_ptr(), t.nbytes), t.dtype, tuple(t.shape))
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
        return ("fd", index, size, obj.dtype, tuple(obj.shape), obj.stride(), obj.storage_offset())


def _fd_of(storage: Any) -> tuple[int, int] | None:
    """The shared storage's descriptor and size; None where it has none (shared by file
    name, torch's other strategy: a DataLoader under file_system)."""
    try:
        fd, size = storage._share_fd_cpu_()
    except RuntimeError:
        return None
    return int(fd), int(size)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, fds: list[int]) -> None:
        super().__init__(io.BytesIO(data))
        self.fds = fds
        self._storages: dict[int, Any] = {}

    def persistent_load(self, pid: Any) -> Tensor:
        if pid[0] == "raw":
            _, data, dtype, shape = pid
            if not data:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
        _, index, size, dtype, shape, stride, offset = pid
        storage = self._storages.get(index)
        if storage is None:
            # torch's own rebuild of an fd-shared storage (not in its stubs)
            storage = self._storages[index] = torch.UntypedStorage._new_shared_fd_cpu(  # type: ignore[attr-defined]
                self.fds[index], size
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
    try:
        return _Unpickler(data[4:], fds).load()
    finally:
        for fd in fds:  # each storage holds its own mapping now
            os.close(fd)
