"""Shard files: find them, load them without trusting them, save them atomically.

A shard is one file holding a dict of named tensors that share dim 0 (the rows):
``.pt`` (``torch.save`` of a dict) or ``.safetensors``.

Loading trusts nothing. ``.pt`` goes through ``torch.load(weights_only=True)``,
whose unpickler builds tensors and plain containers and refuses everything
else; a refusal is never retried unsafely (only ``trust_pickle=True`` loads
arbitrary pickles). Whatever goes wrong comes out as :class:`~prep.ShardError`
naming the file and the problem.

Saving never leaves a truncated file under a final name::

    tensors ─serialize─▶ .{name}.tmp-{pid}-{random}   (same folder, so same filesystem)
            ─flush, fsync─▶ os.replace(tmp, name) ─fsync(folder)─▶ durable

(``prep run`` leaves the folder's fsync to its driver, once for a group of shards:
:func:`sync_folders`). A disk that is full, over quota or read-only is
:class:`OutOfSpace`, named by its errno, also where torch's writer wraps the
``OSError`` in an enforce message of its own.

and the bytes are a function of the tensors alone: ``torch.save`` to a *path*
names the zip's root folder after the file (a temporary name would leak into
the bytes), so it writes to a file object, whose root is always ``archive/``;
views are compacted first, since ``torch.save`` of a view writes its whole
storage. Two saves of equal dicts are byte-identical, in any process.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import safetensors.torch
import torch
from torch import Tensor

from ..errors import ConfigError, OutOfSpace, ShardError
from .temps import Temps

__all__ = [
    "FORMATS",
    "OutOfSpace",
    "ShardFile",
    "compact",
    "find_shards",
    "load_shard",
    "other_files",
    "save_shard",
    "sha256_file",
    "sync_folders",
]

#: file suffix -> format name
FORMATS: dict[str, str] = {".pt": "pt", ".safetensors": "safetensors"}
_SUFFIX = {name: suffix for suffix, name in FORMATS.items()}


@dataclass(frozen=True)
class ShardFile:
    """An input shard: where it is, and its path relative to the input it was found under."""

    path: Path
    rel: str  # POSIX-style, the key of the manifest and the output's place under --out

    @property
    def format(self) -> str:
        return FORMATS[self.path.suffix]

    def output(self, out: Path, fmt: str | None = None) -> tuple[Path, str]:
        """The output's path and its ``rel`` under ``out`` (suffix changed for ``fmt``)."""
        rel = self.rel
        if fmt is not None and fmt != self.format:
            rel = rel[: -len(self.path.suffix)] + _SUFFIX[fmt]
        return out / rel, rel


def find_shards(inputs: Iterable[str | os.PathLike[str]]) -> list[ShardFile]:
    """The shards named by ``inputs``: files as given, folders searched recursively (sorted)."""
    found: dict[str, ShardFile] = {}
    for given in inputs:
        root = Path(given)
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.suffix in FORMATS and p.is_file())
            pairs = [(p, p.relative_to(root).as_posix()) for p in files]
        elif root.is_file():
            if root.suffix not in FORMATS:
                raise ConfigError(
                    f"input {str(root)!r} is not a shard: expected a folder or a file ending "
                    f"in {' or '.join(FORMATS)}"
                )
            pairs = [(root, root.name)]
        else:
            raise ConfigError(f"input {str(root)!r} does not exist; check the path")
        for path, rel in pairs:
            if rel in found and found[rel].path.resolve() != path.resolve():
                raise ConfigError(
                    f"inputs {str(found[rel].path)!r} and {str(path)!r} would both be written "
                    f"to {rel!r} under --out; run them separately or rename one"
                )
            found[rel] = ShardFile(path, rel)
    if not found:
        names = ", ".join(repr(str(i)) for i in inputs) or "(none)"
        raise ConfigError(f"no {' or '.join(FORMATS)} files found in {names}")
    return list(found.values())


def other_files(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files under the input folders that :func:`find_shards` leaves out (not
    ``.pt`` or ``.safetensors``; hidden files, such as temporary ones, aside), sorted."""
    found = []
    for given in inputs:
        root = Path(given)
        if root.is_dir():
            found += [
                p for p in root.rglob("*")
                if p.suffix not in FORMATS and p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(root).parts)
            ]  # fmt: skip
    return sorted(found)


# ------------------------------------------------------------------ loading


def load_shard(path: Path, *, trust_pickle: bool = False) -> dict[str, Tensor]:
    """The shard's tensors by name, on the CPU; :class:`~prep.ShardError` if it is not one."""
    try:
        if path.suffix == ".safetensors":
            tensors: Any = safetensors.torch.load_file(path)
        else:
            tensors = _load_pt(path, trust_pickle)
    except ShardError:
        raise
    except FileNotFoundError:
        raise ShardError(f"{path}: the file disappeared before it was read") from None
    except Exception as exc:
        why = _why(exc, trust_pickle)
        error = ShardError(f"{path}: cannot be read as a shard ({why})")
        if why.startswith(_UNSAFE):
            raise error from None  # the whole verdict: torch's long advice adds nothing
        raise error from exc
    if not isinstance(tensors, Mapping):
        raise ShardError(
            f"{path}: holds a {type(tensors).__name__}, expected a dict of named tensors"
        )
    bad = {
        k: type(v).__name__
        for k, v in tensors.items()
        if not (isinstance(k, str) and isinstance(v, Tensor))
    }
    if bad:
        raise ShardError(
            f"{path}: entries {bad} are not tensors under string names; a shard is a dict "
            f"of str -> Tensor"
        )
    if not tensors:
        raise ShardError(f"{path}: holds an empty dict, expected at least one tensor")
    return dict(tensors)


#: how the two formats torch.save writes begin: a zip archive (one without its end is
#: truncated, said before torch.load, whose words are "Invalid argument"), and a pickle of
#: protocol 2 or later (the legacy format)
_STARTS = (b"PK", b"\x80")


def _load_pt(path: Path, trust_pickle: bool) -> Any:
    # mapped, not read: an op that reads a few positions per row touches only those
    # pages; a zip (torch.save's format today) maps, and is judged only if that fails
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle, mmap=True)
    except FileNotFoundError:
        raise
    except Exception:
        if zipfile.is_zipfile(path):
            raise  # a zip torch could not load: _why says what torch said
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"PK":  # a zip without its end: zipfile.is_zipfile found none
        raise ShardError(
            f"{path}: cannot be read as a shard (truncated: it starts as a zip "
            f"archive, as torch.save writes, but its end is missing; it was cut off "
            f"while written or copied). Write or copy it again"
        ) from None
    if not head.startswith(_STARTS):
        # neither format torch.save writes: damaged, or another kind of file. Said
        # before torch.load, whose weights_only refusal would read as "unsafe" and
        # whose unpickler, trusted, fails on garbage with unrelated errors
        what = "is empty" if not head else f"starts with {head!r}"
        raise ShardError(
            f"{path}: cannot be read as a shard (it {what}: neither a zip archive nor "
            f"a pickle, so not a torch.save file; it is damaged or of another format, "
            f"and --trust-pickle cannot help). Rewrite it with torch.save or safetensors"
        ) from None
    return torch.load(path, map_location="cpu", weights_only=not trust_pickle)  # legacy: unmapped


_UNSAFE = "its pickle holds objects"


def _why(exc: Exception, trust_pickle: bool) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not trust_pickle and "Weights only load failed" in str(exc):
        if "Unsupported global" not in str(exc):
            # the unpickler stopped on bytes it could not read, not on an unsafe object
            after = str(exc).partition("WeightsUnpickler error:")[2].strip()
            detail = after.splitlines()[0] if after else text
            return (
                f"its pickle cannot be read ({detail}): the file is damaged, or a pickle "
                f"torch.save did not write; only if you trust its source, --trust-pickle "
                f"reads it without the safety check"
            )
        return (
            f"{_UNSAFE} other than tensors and containers, which "
            "torch.load(weights_only=True) refuses; if you trust the file's source, "
            "pass --trust-pickle"
        )
    if "central directory" in text or "zip archive" in text:
        return f"truncated or not a torch.save file: {text}"
    return f"{type(exc).__name__}: {text}"


# ------------------------------------------------------------------ saving


def compact(t: Tensor) -> Tensor:
    """``t`` contiguous on the CPU, owning exactly its bytes (a view's storage may be larger)."""
    t = t.detach().cpu().contiguous()
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


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
    seal: Callable[[Callable[[], None]], None] | None = None,
) -> tuple[str, int]:
    """Write ``tensors`` to ``path`` atomically and durably; returns (sha256 hex, size).

    Tensors are compacted (:func:`compact`) and written in the mapping's order.
    Parent folders are created. ``temps`` tracks the temporary file so that an
    abandoned run can remove it. ``sync_folder=False`` leaves the rename's fsync to
    the caller (:func:`sync_folders`, once for many files); ``seal``, the file's own
    fsync and rename too, given to it as a function to call later (in a thread, while
    the next shard computes). :class:`OutOfSpace` if the disk is full, over quota or
    read-only.
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
        seal(functools.partial(_seal, tmp, path, temps, out.size))
    elif sync_folder:
        sync_folders([path.parent])
    return out.sha.hexdigest(), out.size


def _seal(tmp: Path, path: Path, temps: Temps, size: int) -> None:
    """What ``save_shard(seal=)`` leaves for later: the file's fsync, then its rename."""
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        temps.replace(tmp, path)
    except BaseException as exc:
        temps.forget(tmp)
        if isinstance(exc, OSError) and exc.errno in _FULL:
            raise _out_of_space(path, exc, size) from None
        raise


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
    """Compacted tensors, none sharing storage (safetensors refuses shared storage)."""
    seen: set[int] = set()
    owned = {}
    for name, t in tensors.items():
        t = compact(t)
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        owned[name] = t
    return owned


def sync_folders(folders: Iterable[Path]) -> None:
    """fsync each folder once: a rename is only durable once its folder's entry is on
    disk too (``prep run`` does it for a group of outputs, before their manifest lines)."""
    for folder in dict.fromkeys(folders):
        fd = os.open(folder, os.O_RDONLY)
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
