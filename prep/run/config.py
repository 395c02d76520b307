"""What ``prep run`` computes on every shard: :class:`RunConfig`, and its checks.

A config names the function (``module:function``, imported where the shard runs)
and its arguments, which columns it takes, and the row-level options::

    --pad / --pad-to        ─▶ map_rows(pad=, pad_to=, return_lengths=True)
                            ─▶ each output NAME saved with NAME_lengths beside it
    --on-row-error / --fill ─▶ map_rows(on_error=, fill=, return_valid=True)
                            ─▶ the entry's failed_rows and row_errors (:mod:`prep.run.rows`)

Both change what an output holds, so they are part of the :meth:`RunConfig.recipe`
that ``--resume`` compares; a default is left out of it, so a manifest written
before these options existed still proves its shards done.

Everything is checked before any shard runs, and where it can be, before
``--out`` is created: the options, the executor and device, and whether the
function can be called as ``prep run`` calls it (:meth:`RunConfig.check_call`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from .._batch import check_seeded
from ..core.checks import call_problem, check_device, signature, takes_keyword
from ..core.options import Options
from ..core.policy import ON_ERROR
from ..core.seeding import mix
from ..errors import ConfigError, ShardError
from ..registry import executor_class
from .calls import call_mismatch, load_fn, no_setup
from .shards import FORMATS, load_shard

__all__ = ["ROW_ERRORS", "RunConfig", "load_fn"]

#: what a row the function raises on does: fail its shard, be filled, be left out (the
#: choices of map_rows' on_error=, whose names --on-row-error takes)
ROW_ERRORS = ON_ERROR


@dataclass(frozen=True)
class RunConfig:
    """What to compute on each shard (how many shards at once is not part of it)."""

    fn: str  # "module:function", imported where the shard runs
    args: Mapping[str, Any] = field(default_factory=dict)  # bound with functools.partial
    columns: tuple[str, ...] | None = None  # positional, in this order; None: all, by name
    executor: str = "auto"
    workers: int | None = None
    device: str | None = None
    format: str | None = None  # "pt" or "safetensors"; None: the input's
    trust_pickle: bool = False
    # row-level options: ragged rows padded, failing rows kept (see the module docstring)
    pad: bool | int | float | None = None  # None: every row returns equal shapes
    pad_to: tuple[int, ...] | None = None  # a fixed row shape for every output
    on_row_error: str = "raise"  # "raise" (the shard fails), "fill" or "skip"
    fill: bool | int | float | None = None  # a failed row's value (None: the pad, else 0)
    setup: str | None = None  # "module:function" of per-worker state (state= for fn)
    seed: int | None = None  # each row's draws seeded by (seed, the shard's path, the row)

    # ------------------------------------------------------------ what it computes

    def recipe(self) -> dict[str, Any]:
        """The fields that say which computation made an output (see :mod:`prep.run.manifest`);
        the row-level options only where they differ from the defaults (nan as "nan")."""
        columns = list(self.columns) if self.columns is not None else None
        found: dict[str, Any] = {"fn": self.fn, "args": dict(self.args), "columns": columns}
        optional = {
            "setup": self.setup or None,  # the state it used made the output too
            "pad": _json_number(self.pad),
            "pad_to": list(self.pad_to) if self.pad_to is not None else None,
            "on_row_error": self.on_row_error if self.on_row_error != "raise" else None,
            "fill": _json_number(self.fill),
            "seed": self.seed,
        }
        return found | {k: v for k, v in optional.items() if v is not None}

    def bound_fn(self) -> Callable[..., Any]:
        """``--fn`` with ``args`` bound; cached, so a worker imports it once."""
        return _bound(self.fn, self.args)

    def setup_fn(self) -> Callable[[], Any] | None:
        """``--setup`` imported (where the shard runs), or None."""
        return load_fn(self.setup, "--setup") if self.setup else None

    def row_options(self) -> Options:
        """The options of ``map_rows`` for the row-level options (the defaults but
        ``device``, by default), with what each shard saves asked back: lengths under
        ``--pad``, the valid mask and errors under ``--on-row-error fill|skip``."""
        given: dict[str, Any] = {}
        if self.pad is not None or self.pad_to is not None:  # rows may differ in size
            given.update(pad=self.pad, pad_to=self.pad_to, return_lengths=True)
        if self.on_row_error != "raise":
            given.update(
                on_error=self.on_row_error, fill=self.fill, return_valid=True, return_errors=True
            )
        return Options(device=self.device, **given)

    def shard_options(self, rel: str) -> Options:
        """:meth:`row_options` for the shard at ``rel`` (its path inside the input folder):
        under ``--seed``, its rows keyed under the seed and that path, the same on every
        machine, at any worker count and after ``--resume``."""
        options = self.row_options()
        if self.seed is None:
            return options
        path = int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=8).digest(), "big")
        return options.with_(seed=mix(self.seed, path))

    def unpack(self, result: Any) -> tuple[Any, Any, Tensor | None, dict[int, BaseException]]:
        """``map_rows``'s answer to :meth:`row_options` as (output, lengths or None, valid
        mask or None, the failed rows' errors): what those options asked back."""
        asked = self.row_options().returns
        out, *extra = result if asked.lengths or asked.valid else (result,)
        lengths = extra.pop(0) if asked.lengths else None
        valid, errors = extra if asked.valid else (None, {})
        return out, lengths, valid, errors

    def row_flags(self) -> str:
        """The row-level options as the flags that set them (for ``--explain``)."""
        flags = {
            "--pad": self.pad,
            "--pad-to": ",".join(map(str, self.pad_to)) if self.pad_to is not None else None,
            "--on-row-error": self.on_row_error,
            "--fill": self.fill,
        }
        return " ".join(f"{flag} {value}" for flag, value in flags.items() if value is not None)

    # ------------------------------------------------------------ checked before any shard

    def check(self) -> None:
        """Every setting, before any work: a ConfigError naming the bad one."""
        if self.format is not None and self.format not in FORMATS.values():
            choices = ", ".join(map(repr, FORMATS.values()))
            raise ConfigError(f"format={self.format!r} is not one of {choices} (or None)")
        kind = executor_class(self.executor)  # raises ConfigError naming the choices
        self.check_rows()
        if self.seed is not None:
            Options(seed=self.seed)  # a TypeError naming it
            check_seeded(kind)
        check_device(self.device)  # a CUDA device where torch has none fails here, not per shard
        self.check_call()  # the function cannot be imported, or not called with these --arg
        try:
            json.dumps(self.recipe())
        except (TypeError, ValueError):
            raise ConfigError(
                f"args={dict(self.args)!r} cannot be recorded in the manifest (JSON); pass "
                f"numbers, strings, booleans, or lists and dicts of them"
            ) from None

    def check_rows(self) -> None:
        """The row-level options alone."""
        if self.on_row_error not in ROW_ERRORS:
            choices = ", ".join(map(repr, ROW_ERRORS))
            raise ConfigError(f"on_row_error={self.on_row_error!r} is not one of {choices}")
        for name in ("pad", "fill"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (bool, int, float)):
                raise ConfigError(f"{name}={value!r} is not a number; e.g. 0, -1 or nan")
        if self.fill is not None and self.on_row_error != "fill":
            raise ConfigError(
                f"fill={self.fill!r} is the value of a failed row under --on-row-error fill, "
                f"but on_row_error is {self.on_row_error!r}; pass --on-row-error fill too"
            )
        to = self.pad_to
        if to is not None and not (
            isinstance(to, tuple)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in to)
        ):
            raise ConfigError(f"pad_to={to!r} is not a tuple of sizes >= 0; e.g. (128,) or (3, 64)")

    def check_call(self, columns: Iterable[str] | None = None, path: Path | None = None) -> None:
        """A ConfigError, before any row runs, if ``--fn`` cannot be called on a row as
        ``prep run`` calls it: ``--arg`` by name, the row's tensors positionally
        (``--columns``) or by name (``columns``, the names in the shard at ``path``),
        ``state=`` with ``--setup``; a ShardError naming ``path`` where the shard lacks a
        column the function needs (:func:`prep.run.calls.call_mismatch`). Where the names
        are not known yet (no shard read), only what ``--arg`` gives is checked."""
        fn = load_fn(self.fn)
        if self.setup and not takes_keyword(fn, "state"):
            raise ConfigError(
                f"--setup {self.setup} gives --fn {self.fn} its state as the keyword state=, "
                f"but the function has no state parameter; add one (def fn(..., *, state)), "
                f"or drop --setup"
            )
        given = dict(self.args) | ({"state": None} if self.setup else {})
        if columns is not None and self.columns is None:
            names = [c for c in columns if c not in given]
            error = call_mismatch(fn, self.fn, names, given, self.setup, path)
            if error is not None:
                raise error
            return
        if self.columns is not None:
            problem = call_problem(fn, len(self.columns), **given)
            call = ", ".join([*self.columns, *(f"{k}=..." for k in given)])
            if problem is not None and "'state'" in problem and not self.setup:
                raise no_setup(self.fn)
        else:
            problem = _unknown_args(fn, given)
            call = ", ".join(["<columns>", *(f"{k}=..." for k in given)])
        if problem is not None:
            raise ConfigError(
                f"--fn {self.fn} cannot be called as prep run calls it on every row, "
                f"fn({call}): {problem}; pass the function's other arguments with --arg "
                f"NAME=VALUE, and choose the row's tensors with --columns"
            )

    def check_first_shard(self, path: Path, shard_errors: bool = False) -> None:
        """:meth:`check_call` with the names of the first shard's tensors (read, not
        computed on), so that a call that cannot work fails once, before any shard runs.
        A shard that cannot be read, or lacks a column, is left to its own run to report
        (a ShardError naming it, under --on-error), unless ``shard_errors`` (--explain,
        which runs no shard, says it here)."""
        if self.columns is not None:
            return
        try:
            self.check_call(list(load_shard(path, trust_pickle=self.trust_pickle)), path)
        except ShardError:
            if shard_errors:
                raise


def _unknown_args(fn: Callable[..., Any], given: Mapping[str, Any]) -> str | None:
    sig = signature(fn)
    if sig is None:
        return None
    try:
        sig.bind_partial(**given)
    except TypeError as exc:
        return str(exc)
    return None


def _bound(spec: str, args: Mapping[str, Any]) -> Callable[..., Any]:
    key = tuple(sorted(args.items()))
    try:
        return _bound_cached(spec, key)
    except TypeError:  # an unhashable argument (a list): bind without the cache
        fn = load_fn(spec)
        return functools.partial(fn, **args) if args else fn


@functools.lru_cache(maxsize=8)
def _bound_cached(spec: str, args: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    fn = load_fn(spec)
    return functools.partial(fn, **dict(args)) if args else fn


def _json_number(value: bool | int | float | None) -> bool | int | float | str | None:
    # JSON has no nan or inf (json.dumps would write a bare NaN that other readers
    # refuse, and nan != nan would make --resume redo the shard forever)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    return value
