"""Row-level options of ``prep run``: ragged rows stored padded, failed rows recorded.

    --pad / --pad-to       ─▶ map_rows(pad=, pad_to=, return_lengths=True)
                           ─▶ each output NAME saved with NAME_lengths beside it
    --on-row-error / --fill ─▶ map_rows(on_error=, fill=, return_valid=True)
                           ─▶ the entry's failed_rows (every index) and row_errors

Both change what an output holds, so they are part of the recipe that ``--resume``
compares; a default is left out of it, so a manifest written before these options
existed still proves its shards done.

``map_rows`` keeps a failed row's error to itself (its one warning names the first
row only), so the errors are read by calling the function once more on each failed
row, in the shard's own thread. A deterministic function fails the same way again;
at most :data:`MAX_ERRORS` rows a shard are run again, so a shard where most rows
fail costs at most that many extra rows; every failed row's index is recorded all
the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..errors import ConfigError

if TYPE_CHECKING:
    from .task import RunConfig

__all__ = [
    "MAX_ERRORS",
    "ROW_ERRORS",
    "check_rows",
    "describe",
    "failed_rows",
    "map_options",
    "recipe_fields",
    "unpack",
    "with_lengths",
]

#: what a row the function raises on does: fail its shard, be filled, be left out
ROW_ERRORS = ("raise", "fill", "skip")
#: failed rows per shard whose error is read (by running them again) and recorded
MAX_ERRORS = 100
#: characters of one recorded error, so that a manifest line stays readable
MAX_ERROR_CHARS = 500
SUFFIX = "_lengths"


def check_rows(config: RunConfig) -> None:
    """The row-level options of ``config``, checked before any shard runs."""
    if config.on_row_error not in ROW_ERRORS:
        raise ConfigError(
            f"on_row_error={config.on_row_error!r} is not one of {', '.join(map(repr, ROW_ERRORS))}"
        )
    for name in ("pad", "fill"):
        value = getattr(config, name)
        if value is not None and not isinstance(value, (bool, int, float)):
            raise ConfigError(f"{name}={value!r} is not a number; e.g. 0, -1 or nan")
    if config.fill is not None and config.on_row_error != "fill":
        raise ConfigError(
            f"fill={config.fill!r} is the value of a failed row under --on-row-error fill, "
            f"but on_row_error is {config.on_row_error!r}; pass --on-row-error fill too"
        )
    to = config.pad_to
    if to is not None and not (
        isinstance(to, tuple)
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in to)
    ):
        raise ConfigError(f"pad_to={to!r} is not a tuple of sizes >= 0; e.g. (128,) or (3, 64)")


def padded(config: RunConfig) -> bool:
    """Whether rows may differ in size (and lengths are saved)."""
    return config.pad is not None or config.pad_to is not None


def map_options(config: RunConfig) -> dict[str, Any]:
    """The keywords of ``map_rows`` for ``config``'s row-level options (none by default)."""
    options: dict[str, Any] = {}
    if padded(config):
        options.update(pad=config.pad, pad_to=config.pad_to, return_lengths=True)
    if config.on_row_error != "raise":
        options.update(
            on_error=config.on_row_error, fill=config.fill, return_valid=True, return_errors=True
        )
    return options


def unpack(
    result: Any, config: RunConfig
) -> tuple[Any, Any, Tensor | None, dict[int, BaseException]]:
    """``map_rows``'s answer as (output, lengths or None, valid mask or None, the
    failed rows' errors)."""
    if not map_options(config):
        return result, None, None, {}
    out, *extra = result
    lengths = extra.pop(0) if padded(config) else None
    if config.on_row_error == "raise":
        return out, lengths, None, {}
    valid, errors = extra
    return out, lengths, valid, errors


def with_lengths(named: Mapping[str, Tensor], lengths: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The outputs with each one's ``NAME_lengths`` right after it."""
    both: dict[str, Tensor] = {}
    for name, tensor in named.items():
        if name + SUFFIX in named:
            raise ConfigError(
                f"the function returns both {name!r} and {name + SUFFIX!r}; with --pad the "
                f"lengths of {name!r} are saved as {name + SUFFIX!r}, so rename that result"
            )
        both[name] = tensor
        both[name + SUFFIX] = lengths[name]
    return both


def failed_rows(
    valid: Tensor, errors: dict[int, BaseException]
) -> tuple[list[int], list[dict[str, Any]]]:
    """The rows that failed (every index) and, for the first :data:`MAX_ERRORS` of
    them, ``{"row": i, "error": "Type: message"}`` of the row function's exception
    (or of the worker's death, for a row that killed it)."""
    failed = (~valid).nonzero().flatten().tolist()
    return failed, [{"row": i, "error": _text(errors.get(i))} for i in failed[:MAX_ERRORS]]


def _text(error: BaseException | None) -> str:
    """``Type: message`` of the row's own exception (a RowError's cause)."""
    if error is None:
        return "unknown: the row failed but left no error"
    cause = error.__cause__ if error.__cause__ is not None else error
    text = f"{type(cause).__name__}: {cause}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def recipe_fields(config: RunConfig) -> dict[str, Any]:
    """The row-level options that differ from the defaults, as JSON (nan as "nan")."""
    fields: dict[str, Any] = {}
    if config.pad is not None:
        fields["pad"] = _json_number(config.pad)
    if config.pad_to is not None:
        fields["pad_to"] = list(config.pad_to)
    if config.on_row_error != "raise":
        fields["on_row_error"] = config.on_row_error
    if config.fill is not None:
        fields["fill"] = _json_number(config.fill)
    return fields


def _json_number(value: bool | int | float) -> bool | int | float | str:
    # JSON has no nan or inf (json.dumps would write a bare NaN that other readers
    # refuse, and nan != nan would make --resume redo the shard forever)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    return value


def describe(config: RunConfig) -> str:
    """The row-level options for ``--explain``, as the flags that set them."""
    parts = []
    if config.pad is not None:
        parts.append(f"--pad {config.pad}")
    if config.pad_to is not None:
        parts.append(f"--pad-to {','.join(map(str, config.pad_to))}")
    parts.append(f"--on-row-error {config.on_row_error}")
    if config.fill is not None:
        parts.append(f"--fill {config.fill}")
    return " ".join(parts)
