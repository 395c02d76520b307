"""A row function whose result holds no tensor (an empty tuple or dict) gets the error
every result no executor can store gets (a TypeError naming the row and what it
returned, as serial gives for ``None``), on every executor that runs a plain row
function, with and without ``pad=``, through ``map_rows`` and ``Pool.imap``; it is the
user's error, so no worker process dies of it and the pool runs the next call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import prep
from tests import registry
from tests.conftest import pool_children

pytestmark = pytest.mark.timeout(120)

X = torch.arange(12.0).view(4, 3)


# at module level, so that worker processes can import them
def empty_tuple(row: torch.Tensor) -> Any:
    return ()


def empty_dict(row: torch.Tensor) -> Any:
    return {}


def double(row: torch.Tensor) -> torch.Tensor:
    return row * 2


EMPTY = {"tuple": empty_tuple, "dict": empty_dict}


def _words(kind: str) -> str:
    """What the error says: the first row, what it returned, and what it must return."""
    return f"on row 0, returned an empty {kind} ({EMPTY[kind](X[0])!r}), which holds no tensor"


@pytest.fixture(scope="module")
def pools() -> Iterator[Callable[[str], prep.Pool]]:
    """A warm pool per executor, for the streams (a fresh process pool per case would
    cost seconds each)."""
    made: dict[str, prep.Pool] = {}

    def pool(executor: str) -> prep.Pool:
        if executor not in made:
            made[executor] = prep.Pool(executor, workers=2)
        return made[executor]

    yield pool
    for p in made.values():
        p.close()
    prep.shutdown()


def _refused_and_survived(call: Callable[[Callable[..., Any]], Any], kind: str) -> None:
    """``call(fn)`` runs ``double`` right, refuses the empty result with the one
    error, and runs ``double`` right again with every process it had still there."""
    want = X * 2  # the reference, as a loop gives it
    assert torch.equal(call(double), want)
    before = pool_children()
    with pytest.raises(TypeError) as raised:
        call(EMPTY[kind])
    text = str(raised.value)
    assert _words(kind) in text, text
    assert "it must return a Tensor, a tuple of Tensors or a dict of Tensors" in text
    assert torch.equal(call(double), want)
    gone = set(before) - set(pool_children())
    assert not gone, f"processes died of the empty result: {[before[p] for p in gone]}"


# executors that run a plain row function (vectorized needs a twin), and with pad=
# those that also pad one (vmap's rows have one shape): tests/registry.py says why
CASES = [
    pytest.param(ex, pad, kind, id=f"{ex}-pad={pad}-{kind}")
    for pad, needs in ((None, (registry.NO_TWIN,)), (0, (registry.NO_TWIN, registry.PAD)))
    for ex in registry.executors(*needs)
    for kind in EMPTY
]


@pytest.mark.parametrize(("executor", "pad", "kind"), CASES)
def test_map_rows_refuses_a_result_without_tensors(executor, pad, kind):
    options = {} if pad is None else {"pad": pad}

    def call(fn: Callable[..., Any]) -> Any:
        return prep.map_rows(fn, X, executor=executor, workers=2, **options)

    _refused_and_survived(call, kind)


def _streams(executor: str) -> list[str]:
    whole = registry.executors(registry.NO_TWIN, registry.WHOLE)
    return ["split", "whole"] if executor in whole else ["split"]


@pytest.mark.parametrize(
    ("executor", "pad", "kind", "strategy"),
    [
        pytest.param(*case.values, strategy, id=f"{case.id}-{strategy}")
        for case in CASES
        for strategy in _streams(case.values[0])
    ],
)
def test_imap_refuses_a_result_without_tensors(pools, executor, pad, kind, strategy):
    options = {} if pad is None else {"pad": pad}

    def call(fn: Callable[..., Any]) -> Any:
        (out,) = list(pools(executor).imap(fn, [X], strategy=strategy, **options))
        return out

    _refused_and_survived(call, kind)
