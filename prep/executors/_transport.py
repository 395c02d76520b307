"""What crosses from the parent to the workers: the row function, and shared memory.

The function travels with cloudpickle (by name where the workers can import
it, by value where they cannot); tensors travel through /dev/shm, which must
have room for them.
"""

from __future__ import annotations

import functools
import io
import pickle
import shutil
import types
from typing import Any

import cloudpickle

from ..errors import ConfigError, ExecutorUnavailable

SHM_DIR = "/dev/shm"


def describe_fn(fn: Any) -> str:
    """``module.qualname`` of a function (or the repr of another callable)."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({describe_fn(fn.func)}, ...)"
    name = getattr(fn, "__qualname__", None)
    if name is None:
        return repr(fn)
    return f"{getattr(fn, '__module__', None) or '?'}.{name}"


def named_code(make: Any, args: tuple[Any, ...], filename: str) -> types.CodeType:
    """A code object as cloudpickle rebuilds it, with the file it was written in."""
    return make(*args).replace(co_filename=filename)


#: cloudpickle's reduction of a code object, which writes "<dynamic-code>" for its file
_code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, keeping the file name of each function sent by value: a worker's
    traceback then names the user's file and line, as serial's does, not
    "<dynamic-code>"."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType and _code_reduce is not None:
            make, args = _code_reduce(obj)
            return named_code, (make, args, obj.co_filename)
        return super().reducer_override(obj)


def pickle_fn(fn: Any) -> bytes:
    """The row function as workers load it: by name where they can import it, by
    value (cloudpickle, keeping its file name) where they cannot. Tensors it captures
    travel as copies."""
    try:
        buf = io.BytesIO()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
        return buf.getvalue()
    except Exception as exc:
        raise ConfigError(
            f"executor='processes' must send the row function {describe_fn(fn)} to its "
            f"workers, and it cannot be pickled ({type(exc).__name__}: {exc}); it (or "
            f"something it captures: a lock, an open file, a module-level client) must be "
            f"picklable, or use executor='threads'"
        ) from exc


class ByValue:
    """``fn`` for another pickler (loky's): it travels as :func:`pickle_fn`'s bytes, its
    file names kept, and arrives as the function itself."""

    def __init__(self, fn: Any) -> None:
        self.blob = pickle_fn(fn)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return pickle.loads, (self.blob,)


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or None where there is no such folder."""
    try:
        return shutil.disk_usage(SHM_DIR).free
    except OSError:
        return None


def shm_fits(nbytes: int) -> bool:
    """Whether ``nbytes`` fit in /dev/shm, with a margin: other processes (and torch's
    own allocator) share it. True where there is no such folder to check."""
    free = shm_free()
    return free is None or nbytes <= 0.9 * free


def check_shm(nbytes: int, what: str) -> None:
    if not shm_fits(nbytes):
        free = shm_free() or 0
        raise ExecutorUnavailable(
            f"executor='processes' needs {nbytes / 2**20:.1f} MiB of shared memory for {what}, "
            f"but {SHM_DIR} has {free / 2**20:.1f} MiB free; use executor='threads', smaller "
            f"batches, or a larger /dev/shm (docker run --shm-size=...)"
        )
