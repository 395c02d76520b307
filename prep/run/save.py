"""Shard files written: atomically, durably, and to the same bytes every time.

Saving never leaves a truncated file under a final name::

    tensors ─serialize─▶ .{name}.tmp-{pid}-{random}   (same folder, so same filesystem)
            ─flush, fsync─▶ os.replace(tmp, name) ─fsync(folder)─▶ durable

(``prep run`` leaves the folder's fsync to its driver, once for a group of shards:
:func:`sync_folders`; a worker given several shards at once fsyncs and renames them
together at the end: :func:`seal_files`). A disk that is full, over quota or
read-only is :class:`OutOfSpace`, named by its errno, also where torch's writer
wraps the ``OSError`` in an enforce message of its own.

The bytes are a function of the tensors alone: ``torch.save`` to a *path* names the
zip's root folder after the file (a temporary name would leak into the bytes), so
it writes to a file object, whose root is always ``archive/``; views are compacted
first, since ``torch.save`` of a view writes its whole storage. Two saves of equal
dicts are byte-identical, in any process.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import safetensors.torch
import torch
from torch import Tensor

from ..errors import ConfigError, OutOfSpace
from .temps import Temps

__all__ = [
    "OutOfSpace",
    "Unsealed",
    "save_shard",
    "seal_files",
    "sha256_file",
    "sync_folders",
]


#: errnos that say the disk, not the shard, is at fault, and the fix for each
_FULL = {
    errno.ENOSPC: "free space on it",
    errno.EDQUOT: "free space on it (or raise your quota)",
    errno.EROFS: "make it writable (or choose another --out)",
}


class _Hashing:
    """A write-only file object that hashes what passes through it, and keeps the
    ``OSError`` of a failed write (torch's writer raises its own error in its place)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.size += memoryview(data).nbytes
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_pt(tensors: dict[str, Tensor], f: _Hashing) -> None:
    torch.save(tensors, f)  # type: ignore[arg-type]  # torch.save needs only write()


def _write_safetensors(tensors: dict[str, Tensor], f: _Hashing) -> None:
    f.write(safetensors.torch.save(tensors))


_WRITERS: dict[str, Callable[[dict[str, Tensor], _Hashing], None]] = {
    "pt": _write_pt,
    "safetensors": _write_safetensors,
}


def save_shard(
    tensors: Mapping[str, Tensor],
    path: Path,
    fmt: str,
    temps: Temps | None = None,
    sync_folder: bool = True,
    seal: Callable[[Unsealed], None] | None = None,
) -> tuple[str, int]:
    """Write ``tensors`` to ``path`` atomically and durably; returns (sha256 hex, size).

    Tensors are compacted (contiguous, each owning its bytes) and written in the mapping's order.
    Parent folders are created. ``temps`` tracks the temporary file so that an
    abandoned run can remove it. ``sync_folder=False`` leaves the rename's fsync to
    the caller (:func:`sync_folders`, once for many files); ``seal``, the file's own
    fsync and rename too: it is given the :class:`Unsealed` file, for
    :func:`seal_files` with others. :class:`OutOfSpace` if the disk is full, over quota
    or read-only.
    """
    if fmt not in _WRITERS:
        raise ConfigError(f"format={fmt!r} is not one of {', '.join(map(repr, _WRITERS))}")
    tensors = _owning(tensors)
    temps = temps if temps is not None else Temps()
    out: _Hashing | None = None
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temps.new(path)
        with open(tmp, "xb") as raw:
            out = _Hashing(raw)
            _WRITERS[fmt](tensors, out)
            raw.flush()
            if seal is None:
                os.fsync(raw.fileno())
        if seal is None:
            temps.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            temps.forget(tmp)
        cause = out.error if out is not None and out.error is not None else exc
        if isinstance(cause, OSError) and cause.errno in _FULL:
            raise _out_of_space(path, cause, sum(t.nbytes for t in tensors.values())) from None
        raise
    if seal is not None:
        seal(Unsealed(tmp, path, temps, out.size))
    elif sync_folder:
        sync_folders([path.parent])
    return out.sha.hexdigest(), out.size


@dataclass(frozen=True)
class Unsealed:
    """A file ``save_shard(seal=)`` wrote to ``tmp``, neither fsynced nor renamed."""

    tmp: Path
    path: Path
    temps: Temps
    size: int


def seal_files(files: list[Unsealed]) -> list[Exception | None]:
    """Fsync every file, then rename each into place; each one's error (a full disk:
    :class:`OutOfSpace`), its temporary file removed. Fsynced together, before any
    rename, the files leave each fsync less to commit."""
    errors: list[Exception | None] = []
    for f in files:
        try:
            _fsync(f.tmp)
            errors.append(None)
        except OSError as exc:
            errors.append(exc)
    for i, f in enumerate(files):
        if errors[i] is None:
            try:
                f.temps.replace(f.tmp, f.path)
                continue
            except Exception as exc:  # an OSError, or Cancelled: the run was abandoned
                errors[i] = exc
        f.temps.forget(f.tmp)
        error = errors[i]
        if isinstance(error, OSError) and error.errno in _FULL:
            errors[i] = _out_of_space(f.path, error, f.size)
    return errors


def _out_of_space(path: Path, exc: OSError, nbytes: int) -> OutOfSpace:
    """One line: the file, the errno's words, the free space, the shard's size, the fix."""
    try:
        free = f"{_mb(shutil.disk_usage(path.parent if path.parent.exists() else '.').free)} free"
    except OSError:
        free = "free space unknown"
    return OutOfSpace(
        f"{path}: cannot be written: {exc.strerror or os.strerror(exc.errno or 0)} "
        f"[errno {errno.errorcode.get(exc.errno or 0, exc.errno)}] ({free}, the shard's "
        f"output is {_mb(nbytes)}); {_FULL[exc.errno or 0]}, then rerun with --resume"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _owning(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The tensors contiguous on the CPU, each owning exactly its bytes (a view's storage
    may be larger), none sharing storage (safetensors refuses shared storage)."""
    seen: set[int] = set()
    owned = {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        storage = t.untyped_storage()
        if (
            t.storage_offset() != 0
            or storage.nbytes() != t.nbytes
            or (storage.data_ptr() in seen and t.numel())
        ):
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        owned[name] = t
    return owned


def sync_folders(folders: Iterable[Path]) -> None:
    """fsync each folder once: a rename is only durable once its folder's entry is on
    disk too (``prep run`` does it for a group of outputs, before their manifest lines)."""
    for folder in dict.fromkeys(folders):
        _fsync(folder)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
    return sha.hexdigest()
