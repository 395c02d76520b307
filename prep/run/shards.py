"""Shard files: find them, and load them without trusting them (:mod:`prep.run.save`
writes them).

A shard is one file holding a dict of named tensors that share dim 0 (the rows):
``.pt`` (``torch.save`` of a dict) or ``.safetensors``.

Loading trusts nothing. ``.pt`` goes through ``torch.load(weights_only=True)``,
whose unpickler builds tensors and plain containers and refuses everything
else; a refusal is never retried unsafely (only ``trust_pickle=True`` loads
arbitrary pickles). Whatever goes wrong comes out as :class:`~prep.ShardError`
naming the file and the problem."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from ..errors import ConfigError, ShardError

__all__ = [
    "FORMATS",
    "ShardFile",
    "find_shards",
    "load_shard",
    "other_files",
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
