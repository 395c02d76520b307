"""Workers follow the caller: an environment variable set or removed, and a directory
changed, between batches give serial's values on every executor (prep.executors._context).

The reference is computed here, in this process, by a plain loop after each change.
"""

from __future__ import annotations

import os

import pytest
import torch

import prep
from tests import registry

pytestmark = pytest.mark.timeout(180)


def _scale_all(x: torch.Tensor) -> torch.Tensor:
    return x * float(os.environ.get("PREP_TEST_SCALE", "1")) + len(os.getcwd())


@prep.rowwise(batched=_scale_all)
def scaled(row: torch.Tensor) -> torch.Tensor:
    """The row times $PREP_TEST_SCALE, plus the length of the working directory's path."""
    return row * float(os.environ.get("PREP_TEST_SCALE", "1")) + len(os.getcwd())


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.stack(
        [r * float(os.environ.get("PREP_TEST_SCALE", "1")) + len(os.getcwd()) for r in x]
    )


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Two directories whose paths differ in length; the caller's own restored after."""
    short = tmp_path / "a"
    long = tmp_path / "a_much_longer_directory_name"
    short.mkdir()
    long.mkdir()
    monkeypatch.chdir(short)
    monkeypatch.delenv("PREP_TEST_SCALE", raising=False)
    return short, long


# a batch's first rows that differ from serial's get a warning from a named executor:
# here there must be none, so it fails the test
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("executor", registry.executors(registry.FOLLOWS))
def test_workers_see_the_callers_environment_and_directory_at_every_batch(
    executor, places, monkeypatch, no_leaks
):
    short, long = places
    x = torch.arange(32.0).view(16, 2)
    with prep.Pool(executor, workers=2) as pool:
        assert torch.equal(pool.map_rows(scaled, x), reference(x))  # workers up, as started
        steps = [
            lambda: monkeypatch.setenv("PREP_TEST_SCALE", "3"),
            lambda: monkeypatch.chdir(long),
            lambda: monkeypatch.setenv("PREP_TEST_SCALE", "5"),
            lambda: monkeypatch.delenv("PREP_TEST_SCALE"),
            lambda: monkeypatch.chdir(short),
        ]
        for step in steps:
            step()
            want = reference(x)
            assert torch.equal(pool.map_rows(scaled, x), want), f"map_rows on {executor}"
            for got in pool.imap(scaled, [x, x]):
                assert torch.equal(got, want), f"imap on {executor}"


def test_a_compiled_form_keeps_what_it_read_at_its_compile(places, monkeypatch):
    """The documented limit behind registry.FOLLOWS: a change after the compile is not
    seen (torch.compile guards neither the environment nor the directory)."""
    x = torch.arange(8.0).view(4, 2)
    with prep.Pool("compiled") as pool:
        first = pool.map_rows(scaled, x)
        assert torch.equal(first, reference(x))
        monkeypatch.setenv("PREP_TEST_SCALE", "3")
        assert torch.equal(pool.map_rows(scaled, x), first)  # not reference(x): the limit


def test_the_context_is_one_object_until_something_changes(places, monkeypatch):
    """What makes following free: a sender compares the context by identity, and a
    new one is made only when the environment or the directory changed."""
    from prep.executors._context import OWN, Follower

    short, long = places
    follower = Follower()
    first = follower.now()
    assert follower.now() is first and first.cwd == str(short)
    monkeypatch.setenv("PREP_TEST_SCALE", "2")
    second = follower.now()
    assert second is not first and second.env["PREP_TEST_SCALE"] == "2"
    monkeypatch.chdir(long)
    assert follower.now().cwd == str(long)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a worker's own: never sent
    assert not OWN & set(follower.now().env)
