"""A property of the whole public call: whatever the batch, the row function and the
options, every executor gives what a plain loop gives, or the error that loop
predicts, or a refusal ``tests/registry.py`` lists for it.

Hypothesis draws a batch (dtype, rows, width, whether it requires grad), a row
function from a small zoo (plain, with a twin, ragged, failing on a row, returning a
bad value on a row), ``map_rows`` (of a tensor, or a dict of one) or
``map_samples``, the options (``pad``, ``on_error``, ``fill``, ``out``,
``timeout``) and an executor. :func:`reference` computes what the call must give
without prep: the rows one by one, checked against the first good row (or ``out=``),
padded with ``torch.nn.functional.pad`` and joined with ``torch.stack``; or the
error, its type and the words that name its cause. Both directions are checked: a
result must equal the reference's, an error must be one the reference predicts (or
the executor's listed refusal). The examples are few and derandomized (the profile in
tests/conftest.py): the suite stays well under a minute and fails the same way on
every run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep
from tests import registry

pytestmark = pytest.mark.timeout(240)


# ------------------------------------------------------------------ the zoo of row functions


def double(row: torch.Tensor) -> torch.Tensor:
    return row * 2


def _twin_batch(row: torch.Tensor) -> torch.Tensor:
    return row * 2 + 1


@prep.rowwise(batched=_twin_batch)
def twin(row: torch.Tensor) -> torch.Tensor:
    """Has a batched twin (of the same parameter name): vectorized runs it."""
    return row * 2 + 1


def first(row: torch.Tensor) -> int:
    return int(row.flatten()[0]) if row.numel() else 0


def ragged(row: torch.Tensor) -> torch.Tensor:
    """As long as its first value says (mod 3, plus one): rows differ in size."""
    return row[: 1 + first(row) % 3]


def fails_on_odd(row: torch.Tensor) -> torch.Tensor:
    if first(row) % 2:
        raise ValueError(f"odd row {first(row)}")
    return row + 1


def none_on_odd(row: torch.Tensor) -> Any:
    return None if first(row) % 2 else row + 1


def list_on_odd(row: torch.Tensor) -> Any:
    return [1, 2] if first(row) % 2 else row + 1


def float64_on_odd(row: torch.Tensor) -> Any:
    return row.double() if first(row) % 2 else row + 1


ZOO: dict[str, Callable[..., Any]] = {
    "double": double,
    "twin": twin,
    "ragged": ragged,
    "fails": fails_on_odd,
    "none": none_on_odd,
    "list": list_on_odd,
    "dtype": float64_on_odd,
}
#: the zoo's functions that read values (``int(row[0])``): what vmap cannot trace
READS_VALUES = {"ragged", "fails", "none", "list", "dtype"}

DTYPES = {"float32": torch.float32, "int64": torch.int64, "uint8": torch.uint8}


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    n, width = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    batch = torch.arange(n * width).view(n, width).to(dtype)
    if dtype.is_floating_point and draw(st.booleans()):
        batch = batch.requires_grad_() * 1  # a non-leaf: what torch refuses to pickle
    on_error = draw(st.sampled_from(["raise", "fill", "skip"]))
    options: dict[str, Any] = {
        "pad": draw(st.sampled_from([None, None, 0, -1, 1e40, math.nan, 300])),
        "on_error": on_error,
        "timeout": draw(st.sampled_from([None, 30, 10**400])),
    }
    if on_error == "fill":
        options["fill"] = draw(st.sampled_from([None, 0, -1, 7, math.nan]))
    out = draw(st.sampled_from([None, "same", "narrower"]))
    if out is not None:
        options["out"] = torch.zeros(n, width - (out == "narrower"), dtype=dtype)
    return {
        "fn": draw(st.sampled_from(sorted(ZOO))),
        "mode": draw(st.sampled_from(["rows", "named", "samples"])),
        "batch": batch,
        "options": options,
        "executor": draw(st.sampled_from(registry.EVERY)),
    }


# ------------------------------------------------------------------ the reference


@dataclass(frozen=True)
class Raises:
    """An error the reference predicts: its type, and words its text must hold."""

    error: type[BaseException]
    words: tuple[str, ...]

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.error) and all(w in str(exc) for w in self.words)


def fits(value: float, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds ``value`` as given (docs/errors.md, "Bad arguments")."""
    if dtype.is_floating_point:
        return math.isnan(value) or abs(value) <= torch.finfo(dtype).max
    if math.isnan(value) or not float(value).is_integer():
        return False
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


def _named(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reference(case: dict[str, Any]) -> torch.Tensor | list[Raises]:
    """What the call must give, computed as a user's loop would, with no prep code: the
    result, or every error the case has a cause for (prep may meet them in any order:
    a pad= that does not fit, a row larger than out=, a fill= that does not fit, the
    first failing row under on_error='raise')."""
    fn, batch, options = ZOO[case["fn"]], case["batch"].detach(), case["options"]
    pad, on_error, out = options["pad"], options["on_error"], options.get("out")
    fill = options.get("fill")
    fill = fill if fill is not None else (pad if pad is not None else 0)
    errors: list[Raises] = []
    # the shape and dtype every row must have: out='s, else the first good row's
    like: tuple[tuple[int, ...], torch.dtype] | None = None
    if out is not None:
        like = (tuple(out.shape[1:]), out.dtype)
    if like is not None and pad is not None and not fits(pad, like[1]):
        errors.append(Raises(ValueError, (f"pad={pad!r}", _named(like[1]))))
    kept: list[torch.Tensor | None] = []  # a row's result, or None where it failed
    for i, row in enumerate(batch):
        failure: Raises | None = None
        try:
            got = fn(row)
        except ValueError as exc:
            failure = Raises(prep.RowError, (f"row {i}", str(exc)))
        else:
            if not isinstance(got, torch.Tensor):
                failure = Raises(TypeError, (f"on row {i}", f"returned a {type(got).__name__}"))
            elif like is None:
                like = (tuple(got.shape), got.dtype)
                if pad is not None and not fits(pad, got.dtype):
                    errors.append(Raises(ValueError, (f"pad={pad!r}", _named(got.dtype))))
            elif got.dtype != like[1] or got.dim() != len(like[0]):
                failure = Raises(prep.StackError, (f"row {i} returned", str(got.dtype)))
            elif pad is None and tuple(got.shape) != like[0]:
                failure = Raises(prep.StackError, (f"row {i} returned shape", "pad="))
                if out is not None and on_error == "raise" and not errors:
                    # a row's shape against out= is checked where the row is written,
                    # which may be after the next rows ran: the next failure may come first
                    errors.append(failure)
                    failure = None
                    continue
            elif (
                pad is not None
                and out is not None
                and any(s > limit for s, limit in zip(got.shape, like[0]))
            ):  # prep never truncates a row, whatever on_error says
                errors.append(Raises(prep.StackError, (f"row {i} returned shape", "larger")))
        if failure is not None and on_error == "raise":
            return [*errors, failure]  # the first failing row ends the loop
        if failure is not None and on_error == "fill" and like and not fits(fill, like[1]):
            errors.append(Raises(ValueError, (f"fill={fill!r}", _named(like[1]))))
        kept.append(None if failure is not None else got.detach())
    if errors:
        return errors
    good = [r for r in kept if r is not None]
    if like is None or (not good and out is None):
        return [Raises(prep.RowError, (f"every one of the {len(batch)} rows failed",))]
    size = like[0]
    if out is None and pad is not None:
        size = tuple(max(r.shape[d] for r in good) for d in range(len(like[0])))
    rows = []
    for r in kept:
        if r is None:
            if on_error == "fill":
                rows.append(torch.full(size, fill, dtype=like[1]))
            continue  # skip: left out
        if pad is not None:
            r = F.pad(r, [p for s, have in zip(reversed(size), reversed(r.shape))
                          for p in (0, s - have)], value=pad)  # fmt: skip
        rows.append(r)
    if not rows:  # every row failed and was skipped: out='s shape, with no row
        return torch.empty((0, *size), dtype=like[1])
    return torch.stack(rows)


def outcome(case: dict[str, Any], executor: str) -> Any:
    """The call's result (out= given afresh) or the exception it raised."""
    options = dict(case["options"])
    if options.get("out") is not None:
        options["out"] = torch.zeros_like(options["out"])
    fn, batch = ZOO[case["fn"]], case["batch"]
    call = prep.map_samples if case["mode"] == "samples" else prep.map_rows
    data = {"rows": batch, "named": {"row": batch}, "samples": list(batch)}[case["mode"]]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # failed rows and fallbacks warn
            return call(fn, data, executor=executor, workers=2, **options)
    except Exception as exc:
        return exc


def needs(case: dict[str, Any]) -> list[str]:
    """What the case needs, in tests/registry.py's words."""
    found = []
    if not hasattr(ZOO[case["fn"]], "batched"):
        found.append(registry.NO_TWIN)
    if case["fn"] in READS_VALUES:
        found.append(registry.READS_VALUES)
    if case["mode"] == "samples":
        found.append(registry.SAMPLES)
    if case["options"]["pad"] is not None:
        found.append(registry.PAD)
    if case["options"]["on_error"] != "raise":
        found.append(registry.PER_ROW_ERRORS)
    return found


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and values (nan where nan), and no autograd history."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and not a.requires_grad
        and bool(torch.equal(a, b) or (a.is_floating_point() and a.isnan().eq(b.isnan()).all()
                                       and torch.equal(a.nan_to_num(0), b.nan_to_num(0))))
    )  # fmt: skip


def check(case: dict[str, Any], executor: str) -> None:
    """``executor``'s outcome of ``case`` is the reference's, or a refusal it may give."""
    want, got = reference(case), outcome(case, executor)
    allowed = registry.refusals(executor, *needs(case))
    where = f"{executor} on {case['fn']} {case['mode']} {case['options']}"
    if isinstance(got, BaseException):
        predicted = list(want) if isinstance(want, list) else []
        predicted += [Raises(r.error, (r.words,)) for r in allowed]
        assert any(p.matches(got) for p in predicted), (
            f"{where}: raised {type(got).__name__}: {got}\nwhere the reference "
            + (f"predicts {want}" if isinstance(want, list) else f"gives\n{want}")
        )
    else:
        assert isinstance(want, torch.Tensor), f"{where}: returned\n{got}\nwhere {want}"
        assert same(got, want), f"{where}: returned\n{got}\nwhere the reference gives\n{want}"


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    yield
    prep.shutdown()


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_every_executor_gives_the_loops_result_or_the_error_it_predicts(
    case: dict[str, Any],
) -> None:
    check(case, case["executor"])


@pytest.mark.parametrize(
    "executor", registry.executors(registry.NO_TWIN, registry.READS_VALUES, registry.PAD)
)
@pytest.mark.parametrize("pad", [None, 0])
def test_a_failure_names_serials_first_failing_row(executor: str, pad: float | None) -> None:
    """Rows 1 and 3 return float64 where row 0 returns float32: the error names row 1,
    as a loop would, whichever worker finishes first."""
    options = {"pad": pad, "on_error": "raise", "timeout": None}
    check({"fn": "dtype", "mode": "rows", "batch": torch.arange(5.0).view(5, 1),
           "options": options}, executor)  # fmt: skip


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("executor", registry.EVERY)
def test_each_of_the_zoo_on_each_executor(executor: str, name: str) -> None:
    """The zoo's functions one at a time, on a batch whose odd rows misbehave, under
    every policy, on a pool that has run the function on the first row alone (with
    pad=, as a user's first try might): the draw above need not meet them all."""
    batch = torch.arange(6.0).view(3, 2) + torch.tensor([0.0, 1.0, 2.0]).view(3, 1) * 5
    calls = [(1, 0, "raise"), (3, None, "raise"), (3, None, "fill"), (3, None, "skip")]
    for rows, pad, on_error in calls:
        options = {"pad": pad, "on_error": on_error, "timeout": None}
        check({"fn": name, "mode": "rows", "batch": batch[:rows], "options": options}, executor)
