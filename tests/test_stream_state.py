"""A stream's position (``Stream.state_dict``, ``Pool.imap(..., state=...)``): the batches
handed to the loop and the source's state as it gave the last of them, never as it
is when the loop saves (a prefetching stream has read ahead by then). Checked by
counters and events, and in a fresh interpreter against a real ``StatefulDataLoader``.
"""

from __future__ import annotations

import copy
import itertools
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import prep
from prep.stream.stream import THREAD_NAME
from tests.conftest import run_script, wait_until

ROOT = str(Path(__file__).resolve().parents[1])


class Counter:
    """Batches 0..n-1 (batch k full of k) with a state: how many it gave. Its
    ``state_dict()`` returns the same dict it keeps changing, as some sources do."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.state = {"given": 0}
        self.pulled = threading.Semaphore(0)  # released once a batch is given

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        k = self.state["given"]
        if k == self.n:
            raise StopIteration
        self.state["given"] = k + 1
        self.pulled.release()
        return torch.full((2, 3), float(k))

    def state_dict(self) -> dict[str, int]:
        return self.state

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = copy.deepcopy(state)


def producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@pytest.fixture(params=["serial", "threads"])
def pool(request: pytest.FixtureRequest) -> Iterator[prep.Pool]:
    with prep.Pool(request.param, workers=2) as p:
        yield p
    assert wait_until(lambda: not producers()), f"threads left: {producers()}"


def firsts(batches: list[torch.Tensor]) -> list[int]:
    return [int(b[0, 0]) for b in batches]


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.timeout(60)
def test_the_state_is_the_sources_as_it_gave_the_last_batch_taken(pool, k):
    source = Counter(10)
    stream = pool.imap(torch.neg, source, prefetch=4)
    taken = [next(stream) for _ in range(k)]
    for _ in range(k + 4):  # the stream has read ahead of the loop: 4 more than taken
        assert source.pulled.acquire(timeout=30)
    assert source.state["given"] == k + 4
    state = stream.state_dict()
    stream.close()
    assert state == {"batches": k, "source": {"given": k}}
    resumed = Counter(10)
    rest = list(pool.imap(torch.neg, resumed, prefetch=4, state=state))
    assert firsts(taken + rest) == [-b for b in range(10)]
    assert rest and firsts(rest)[0] == -k


@pytest.mark.timeout(60)
def test_a_resumed_stream_counts_on_from_its_state(pool):
    stream = pool.imap(
        torch.neg, Counter(6), prefetch=2, state={"batches": 2, "source": {"given": 2}}
    )
    assert stream.state_dict() == {"batches": 2, "source": {"given": 2}}
    next(stream)
    assert stream.state_dict() == {"batches": 3, "source": {"given": 3}}
    list(stream)
    assert stream.state_dict() == {"batches": 6, "source": {"given": 6}}


@pytest.mark.timeout(60)
def test_prefetch_0_keeps_the_same_position(pool):
    stream = pool.imap(torch.neg, Counter(5), prefetch=0)
    next(stream), next(stream)
    assert stream.state_dict() == {"batches": 2, "source": {"given": 2}}


@pytest.mark.timeout(60)
def test_a_plain_iterator_has_the_count_and_the_docs_way_to_skip(pool):
    batches = [torch.full((2, 3), float(k)) for k in range(6)]
    stream = pool.imap(torch.neg, iter(batches), prefetch=3)
    next(stream), next(stream)
    state = stream.state_dict()
    stream.close()
    assert state == {"batches": 2}
    with pytest.raises(prep.ConfigError, match=r"islice\(batches, 2, None\)"):
        pool.imap(torch.neg, iter(batches), state=state)
    rest = pool.imap(torch.neg, itertools.islice(iter(batches), state["batches"], None))
    assert firsts(list(rest)) == [-2, -3, -4, -5]


@pytest.mark.timeout(60)
def test_a_source_whose_state_dict_fails_fails_its_batch_in_place(pool):
    class Failing(Counter):
        def state_dict(self) -> dict[str, int]:
            if self.state["given"] == 3:
                raise OSError("cannot read the position")
            return self.state

    stream = pool.imap(torch.neg, Failing(6), prefetch=2)
    assert firsts([next(stream), next(stream)]) == [0, -1]
    with pytest.raises(OSError, match="cannot read the position"):
        next(stream)


BAD_STATES = [
    (Counter(3), {"given": 1}, "not a stream's state_dict"),
    (Counter(3), {"batches": 1}, "plain iterator's"),
    ([torch.ones(2)], {"batches": 1, "source": {"given": 1}}, "list without load_state_dict"),
]


@pytest.mark.parametrize(("source", "state", "words"), BAD_STATES)
def test_a_state_that_cannot_resume_is_named(source, state, words):
    with prep.Pool("serial") as pool, pytest.raises(prep.ConfigError, match=words):
        pool.imap(torch.neg, source, state=state)


# ------------------------------------------------------------------ a fresh interpreter

SCRIPT = """
import sys, warnings
sys.path.insert(0, {root!r})
warnings.filterwarnings("ignore", message=".*set_vital.*")
import torch, prep
from torchdata.stateful_dataloader import StatefulDataLoader

mode, executor, folder = sys.argv[1:]
data = torch.arange(120.0).view(40, 3)

def fn(row):  # a function of __main__: sent by value to worker processes
    return row * 2 + 1

def source():
    generator = torch.Generator().manual_seed(7)
    return StatefulDataLoader(data, batch_size=4, shuffle=True, generator=generator)

with prep.Pool(executor, workers=2) as pool:
    if mode == "save":
        torch.save(list(pool.imap(fn, source(), prefetch=4)), f"{{folder}}/whole.pt")
        for k in (0, 1, 7):
            stream = pool.imap(fn, source(), prefetch=4)
            taken = [next(stream) for _ in range(k)]
            torch.save(stream.state_dict(), f"{{folder}}/state{{k}}.pt")
            stream.close()
    else:
        for k in (0, 1, 7):
            state = torch.load(f"{{folder}}/state{{k}}.pt", weights_only=False)
            rest = list(pool.imap(fn, source(), prefetch=4, state=state))
            torch.save(rest, f"{{folder}}/rest{{k}}.pt")
print("OK")
"""


@pytest.mark.parametrize("executor", ["serial", "threads", "processes"])
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
@pytest.mark.timeout(300)
def test_a_stateful_dataloader_resumes_in_a_fresh_interpreter(executor, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader import StatefulDataLoader

    script = textwrap.dedent(SCRIPT.format(root=ROOT))
    run_script(script, "save", executor, str(tmp_path))
    run_script(script, "resume", executor, str(tmp_path))
    data = torch.arange(120.0).view(40, 3)
    generator = torch.Generator().manual_seed(7)
    plain = [
        b * 2 + 1 for b in StatefulDataLoader(data, batch_size=4, shuffle=True, generator=generator)
    ]
    whole = torch.load(tmp_path / "whole.pt")
    assert len(whole) == len(plain) == 10
    assert all(torch.equal(a, b) for a, b in zip(whole, plain))
    for k in (0, 1, 7):
        rest: list[Any] = torch.load(tmp_path / f"rest{k}.pt")
        assert len(rest) == 10 - k, k
        assert all(torch.equal(a, b) for a, b in zip(rest, plain[k:])), k
