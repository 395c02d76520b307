"""The options of one call, in one type: what ``map_rows``, ``map_samples``, a Pool's
calls, its streams and ``Collate`` take beside the function and the data.

:class:`Options` is the one list of them, with their defaults, checked once when
it is made (a frozen dataclass: checked values cannot change afterwards).
:class:`CallOptions` types the same names as keywords (``**options:
Unpack[CallOptions]``); ``tests/test_api_seams.py`` holds the two to the same
names. A name that is not an option is one error naming it and the choices.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .checks import check_device, check_timeout
from .policy import Policy


@dataclass(frozen=True)
class Returns:
    """What a call returns beside the output: ``(out, lengths, valid, errors)``, those
    asked for."""

    lengths: bool = False
    valid: bool = False
    errors: bool = False

    def __post_init__(self) -> None:
        for name in ("lengths", "valid", "errors"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"return_{name}={getattr(self, name)!r} is not True or False")


class CallOptions(TypedDict, total=False):
    """The keywords of :class:`Options`, for ``**options`` (see its fields)."""

    device: Any
    timeout: float | None
    out: Any
    pad: Any
    pad_to: Any
    return_lengths: bool
    on_error: str
    fill: Any
    return_valid: bool
    return_errors: bool
    progress: bool
    seed: int | None


@dataclass(frozen=True)
class Options:
    """One call's options, checked.

    ``device`` where the result lands; ``timeout`` seconds for the batch; ``out`` a
    preallocated result to fill; ``pad``/``pad_to`` ragged rows; ``on_error``/``fill``
    failed rows; ``return_lengths``/``return_valid``/``return_errors`` what the call
    returns beside the output; ``progress`` a bar; ``seed`` each row's random draws
    from generators seeded for the row (``core.seeding``). ``policy`` and ``returns`` are
    made from them. A Pool's own ``device``, ``timeout`` and ``progress`` are the
    defaults its calls start from.
    """

    device: Any = None
    timeout: float | None = None
    out: Any = None
    pad: Any = None
    pad_to: Any = None
    return_lengths: bool = False
    on_error: str = "raise"
    fill: Any = None
    return_valid: bool = False
    return_errors: bool = False
    progress: bool = False
    seed: int | None = None
    policy: Policy = field(init=False, repr=False, compare=False)
    returns: Returns = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked forms replace what was given
        set_(self, "device", check_device(self.device))
        set_(self, "timeout", check_timeout(self.timeout))
        set_(self, "policy", Policy.of(self.pad, self.pad_to, self.on_error, self.fill))
        set_(self, "returns", Returns(self.return_lengths, self.return_valid, self.return_errors))
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress={self.progress!r} is not True or False")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise TypeError(
                f"seed={self.seed!r} is a {type(self.seed).__name__}, not an int; pass e.g. "
                f"seed=7, or seed=hash((epoch, step)) for a new draw each step"
            )

    @classmethod
    def of(cls, call: str, given: Mapping[str, Any], defaults: Options | None = None) -> Options:
        """``defaults`` (or the defaults) with the options ``given`` to ``call`` (its
        name, for the error about a name that is not an option)."""
        unknown = [name for name in given if name not in NAMES]
        if unknown:
            raise TypeError(_unknown(call, unknown))
        base = DEFAULT if defaults is None else defaults
        if not given:
            return base
        values = {**base.__dict__, **given}  # dataclasses.replace, without its 1.4 us
        del values["policy"], values["returns"]
        return cls(**values)

    def with_(self, **changes: Any) -> Options:
        """These options with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def batch_options(self) -> dict[str, Any]:
        """The options that shape a batch's result, as keywords, those not at their
        default (a stream keys its plan on them)."""
        return {
            name: value
            for name in _BATCH
            if not _is_default(value := getattr(self, name), _DEFAULTS[name])
        }


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    return isinstance(value, (bool, str)) and type(value) is type(default) and value == default


def _unknown(call: str, names: list[str]) -> str:
    bad = ", ".join(f"{n}=" for n in names)
    hints = [m for n in names for m in difflib.get_close_matches(n, NAMES, n=1)]
    hint = f" (did you mean {', '.join(f'{m}=' for m in hints)}?)" if hints else ""
    return (
        f"{call}() got {bad}, which {'is not an option' if len(names) == 1 else 'are not options'}"
        f"{hint}; the options are {', '.join(f'{n}=' for n in NAMES)}"
    )


#: every option's name, in the order of the dataclass
NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Options) if f.init)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Options) if f.init}
#: the options that shape a batch's result (not where it lands, when it times out or a bar)
_BATCH = tuple(n for n in NAMES if n not in ("device", "timeout", "progress", "seed"))

#: every option at its default
DEFAULT = Options()

__all__ = ["DEFAULT", "NAMES", "CallOptions", "Options", "Returns"]
