"""tests/registry.py holds the one list of what an executor may refuse: here each
listed refusal is checked to happen (with its error and words), and every executor not
listed for a need is checked to run a case of that need and give a loop's result. A
stale excuse fails here, and so does a new executor that refuses without a line there."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import prep
from tests import refs, registry

pytestmark = pytest.mark.timeout(120)


def _twin_batch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@prep.rowwise(batched=_twin_batch)
def twin(row: torch.Tensor) -> torch.Tensor:
    return row * 2 + 1


def plain(row: torch.Tensor) -> torch.Tensor:
    return row * 2 + 1


def _reads_batch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@prep.rowwise(batched=_reads_batch)
def reads(row: torch.Tensor) -> torch.Tensor:
    return row * 2 + 1 if int(row[0]) >= 0 else row


def _draws_batch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1 + 0 * torch.rand(x.shape)


@prep.rowwise(batched=_draws_batch)
def draws(row: torch.Tensor) -> torch.Tensor:
    """A draw from torch's generator that changes no value: every executor's rows can
    be compared with a loop's."""
    return row * 2 + 1 + 0 * torch.rand(row.shape)


def _python_draws_batch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1 + 0 * random.random()


@prep.rowwise(batched=_python_draws_batch)
def python_draws(row: torch.Tensor) -> torch.Tensor:
    """A draw from Python's random that changes no value."""
    return row * 2 + 1 + 0 * random.random()


X = torch.arange(12.0).view(4, 3)

#: need -> a call that needs it and nothing else the registry lists, and its loop
CASES: dict[str, tuple[Callable[[str], Any], Callable[[], Any]]] = {
    registry.NO_TWIN: (
        lambda ex: prep.map_rows(plain, X, executor=ex, workers=2),
        lambda: refs.loop(plain, list(X)),
    ),
    registry.READS_VALUES: (
        lambda ex: prep.map_rows(reads, X, executor=ex, workers=2),
        lambda: refs.loop(reads, list(X)),
    ),
    registry.SAMPLES: (
        lambda ex: prep.map_samples(twin, list(X), executor=ex, workers=2),
        lambda: refs.loop(twin, list(X)),
    ),
    registry.PAD: (
        lambda ex: prep.map_rows(twin, X, executor=ex, workers=2, pad=0),
        lambda: refs.loop(twin, list(X), pad=0),
    ),
    registry.TORCH_DRAWS: (
        lambda ex: prep.map_rows(draws, X, executor=ex, workers=2),
        lambda: refs.loop(draws, list(X)),
    ),
    registry.GLOBAL_DRAWS: (
        lambda ex: prep.map_rows(python_draws, X, executor=ex, workers=2),
        lambda: refs.loop(python_draws, list(X)),
    ),
    registry.PER_ROW_ERRORS: (
        lambda ex: prep.map_rows(twin, X, executor=ex, workers=2, on_error="fill"),
        lambda: refs.loop(twin, list(X), on_error="fill"),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    yield
    prep.shutdown()


@pytest.mark.parametrize("need", sorted(CASES))
@pytest.mark.parametrize("executor", registry.EVERY)
def test_an_executor_refuses_a_need_only_as_listed(executor, need):
    call, loop = CASES[need]
    listed = registry.refusals(executor, need)
    if not listed:
        got = call(executor)
        assert torch.equal(got, loop()), f"{executor} on {need}: {got}"
        return
    (refusal,) = listed
    with pytest.raises(refusal.error) as raised:
        call(executor)
    assert refusal.words in str(raised.value)


@pytest.mark.parametrize("refusal", [r for r in registry.REFUSALS if r.need == registry.WHOLE],
                         ids=lambda r: r.executor)  # fmt: skip
def test_a_stream_of_whole_batches_is_refused_as_listed(refusal):
    pool = prep.Pool(refusal.executor, workers=2)
    with pool, pytest.raises(refusal.error, match=refusal.words):
        pool.imap(twin, [X], strategy="whole")


def test_every_listed_refusal_is_checked_here():
    assert {r.need for r in registry.REFUSALS} <= {*CASES, registry.WHOLE}
