"""What a shard's output holds under the row-level options of :class:`~prep.run.RunConfig`.

    --pad / --pad-to        ─▶ each output NAME saved with NAME_lengths beside it
    --on-row-error fill/skip ─▶ the entry's failed_rows (every index) and row_errors

Each failed row's error comes back from ``map_rows(return_errors=True)``, the
row function's own exception (or the worker's death, for a row that killed it);
every failed row's index is recorded, and the errors of the first
:data:`MAX_ERRORS`, so that a shard where most rows fail keeps a readable entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..errors import ConfigError

__all__ = ["MAX_ERRORS", "failed_rows", "with_lengths"]

#: failed rows per shard whose error is recorded (every index is)
MAX_ERRORS = 100
#: characters of one recorded error, so that a manifest line stays readable
MAX_ERROR_CHARS = 500
SUFFIX = "_lengths"


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


def failed_rows(valid: Tensor, errors: dict[int, BaseException]) -> dict[str, Any]:
    """The entry's ``failed_rows`` (every index) and ``row_errors``: for the first
    :data:`MAX_ERRORS` of them, ``{"row": i, "error": "Type: message"}`` of the row
    function's exception (or of the worker's death, for a row that killed it)."""
    failed = (~valid).nonzero().flatten().tolist()
    row_errors = [{"row": i, "error": _text(errors.get(i))} for i in failed[:MAX_ERRORS]]
    return {"failed_rows": failed, "row_errors": row_errors}


def _text(error: BaseException | None) -> str:
    """``Type: message`` of the row's own exception (a RowError's cause)."""
    if error is None:
        return "unknown: the row failed but left no error"
    cause = error.__cause__ if error.__cause__ is not None else error
    text = f"{type(cause).__name__}: {cause}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
