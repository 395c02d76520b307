"""A property of the whole public call: whatever the batch, the row function and the
options, every executor either gives serial's result or refuses with an error that
names what to change.

Hypothesis draws a batch (dtype, rows, width, whether it requires grad), a row
function from a small zoo (plain, with a twin, ragged, failing on a row, returning a
bad value on a row), ``map_rows`` (of a tensor, or a dict of one) or
``map_samples``, the options (``pad``, ``on_error``, ``fill``, ``out``,
``timeout``) and an executor. The examples are few and derandomized: the suite
stays well under a minute on two busy cores and fails the same way on every run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep
from tests import rowfns

pytestmark = pytest.mark.timeout(240)

EXECUTORS = sorted(prep.EXECUTORS)
#: what an error must mention to count as naming the argument to change
NAMES = ("pad", "fill", "out=", "on_error", "timeout", "executor", "batch", "samples",
         "row function", "vmap", "row ")  # fmt: skip


# ------------------------------------------------------------------ the zoo of row functions


def double(row: torch.Tensor) -> torch.Tensor:
    return row * 2


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
    "twin": rowfns.affine,  # has a batched twin: vectorized runs it
    "ragged": ragged,
    "fails": fails_on_odd,
    "none": none_on_odd,
    "list": list_on_odd,
    "dtype": float64_on_odd,
}

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
        options["fill"] = draw(st.sampled_from([None, 0, -1, math.nan]))
    out = draw(st.sampled_from([None, "same", "narrower"]))
    if out is not None:
        options["out"] = torch.zeros(n, width - (out == "narrower"), dtype=dtype)
    return {
        "fn": draw(st.sampled_from(sorted(ZOO))),
        "mode": draw(st.sampled_from(["rows", "named", "samples"])),
        "batch": batch,
        "options": options,
        "executor": draw(st.sampled_from(EXECUTORS)),
    }


def outcome(case: dict[str, Any], executor: str) -> Any:
    """The call's result (cloned, out= given afresh) or the exception it raised."""
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


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and not a.requires_grad
        and bool(torch.equal(a, b) or (a.is_floating_point() and a.isnan().eq(b.isnan()).all()
                                       and torch.equal(a.nan_to_num(0), b.nan_to_num(0))))
    )  # fmt: skip


def tidy(error: BaseException) -> bool:
    """An error a user can act on: prep's own, or a ValueError/TypeError naming the
    argument; the row function's own exception under on_error='raise' is wrapped
    as a RowError (a PrepError) with its row."""
    if not isinstance(error, (prep.PrepError, ValueError, TypeError)):
        return False
    return any(name in str(error) for name in NAMES)


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    yield
    prep.shutdown()


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_every_executor_gives_serials_result_or_a_tidy_error(case: dict[str, Any]) -> None:
    reference = outcome(case, "serial")
    got = outcome(case, case["executor"])
    if isinstance(got, BaseException):
        assert tidy(got), f"{case['executor']}: untidy {type(got).__name__}: {got}"
        return
    assert not isinstance(reference, BaseException), (
        f"{case['executor']} returned a result where serial raised {reference!r}"
    )
    assert same(got, reference), f"{case['executor']} differs from serial:\n{got}\n{reference}"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_serial_itself_is_tidy_on_what_the_fuzz_draws(executor: str) -> None:
    """The zoo's failures, one at a time, as the fuzz meets them: each is a result or
    an error that names what to change, under every executor."""
    batch = torch.arange(6.0).view(3, 2)
    for name in ZOO:
        case = {"fn": name, "mode": "rows", "batch": batch, "options": {}}
        got = outcome(case, executor)
        assert not isinstance(got, BaseException) or tidy(got), f"{name}: {got!r}"
