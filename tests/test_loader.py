"""prep.Loader: a map-style dataset in batches, an epoch per loop, fetched by index on the
pool's stream; its order, its seeds, its position and resuming from it, and what it
refuses. References are plain loops over the dataset; nothing waits on a clock.

The datasets and row functions live at module level: worker processes import them.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import prep
from prep.stream.stream import THREAD_NAME
from tests import registry
from tests.conftest import wait_until

SAMPLE_EXECUTORS = registry.executors(registry.SAMPLES)
IN_PROCESS = ["serial", "threads"]


class Numbers:
    """Sample ``i`` is ``[i, i * i]``: its index is in its first value."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor([float(i), float(i * i)])


class Counted(Numbers):
    """:class:`Numbers` that counts its picklings here, and its unpicklings (in worker
    processes) as lines in ``log``."""

    pickled = 0

    def __init__(self, n: int, log: str) -> None:
        super().__init__(n)
        self.log = log

    def __getstate__(self) -> dict[str, Any]:
        Counted.pickled += 1
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


def affine(sample: torch.Tensor) -> torch.Tensor:
    return sample * 2 + 1


def noisy(sample: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.cat([sample, torch.rand(2, generator=rng)])


def noisy_global(sample: torch.Tensor) -> torch.Tensor:
    return torch.cat([sample, torch.rand(2)])


def ragged(sample: torch.Tensor) -> torch.Tensor:
    return torch.arange(int(sample[0]) % 3 + 1)


def producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert wait_until(lambda: not producers()), f"threads left: {producers()}"


def reference(dataset: Numbers, fn: Any, indices: list[int]) -> torch.Tensor:
    return torch.stack([fn(dataset[i]) for i in indices])


def indices_of(batch: torch.Tensor) -> list[int]:
    return [int(x) for x in ((batch[:, 0] - 1) / 2)]  # affine's first value is 2i + 1


# ------------------------------------------------------------------ results


@pytest.mark.parametrize("executor", SAMPLE_EXECUTORS)
@pytest.mark.timeout(180)
def test_an_epoch_is_a_plain_loop_over_the_dataset(executor):
    data = Numbers(23)
    loader = prep.Loader(data, affine, batch_size=4, executor=executor, workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == 6
    for k, batch in enumerate(batches):
        indices = list(range(4 * k, min(4 * k + 4, 23)))
        assert torch.equal(batch, reference(data, affine, indices))


@pytest.mark.parametrize("executor", ["serial", "processes", "auto"])  # threads: below
@pytest.mark.timeout(120)
def test_shuffle_is_a_permutation_of_the_seed_and_the_epoch(executor):
    data = Numbers(30)
    make = lambda: prep.Loader(  # noqa: E731
        data, affine, batch_size=8, shuffle=True, seed=5, executor=executor, workers=2
    )
    loader, again = make(), make()
    first, second = [indices_of(b) for b in loader], [indices_of(b) for b in loader]
    for epoch in (first, second):
        assert sorted(i for b in epoch for i in b) == list(range(30))
    assert first != second  # each epoch its own order
    assert [indices_of(b) for b in again] == first  # the same seed, the same order
    assert first == [loader.order(0)[k : k + 8].tolist() for k in range(0, 30, 8)]


def test_drop_last_leaves_the_short_batch_out():
    loader = prep.Loader(Numbers(10), affine, batch_size=4, drop_last=True, executor="serial")
    assert len(loader) == 2 and [len(b) for b in loader] == [4, 4]
    assert len(prep.Loader(Numbers(10), affine, batch_size=5, drop_last=True)) == 2
    assert len(prep.Loader(Numbers(3), affine, batch_size=4, drop_last=True)) == 0


def test_a_list_is_a_dataset_and_the_batch_is_what_map_samples_returns():
    words = ["a", "bcd", "ef"]
    loader = prep.Loader(
        words, lambda w: torch.tensor([ord(c) for c in w]), batch_size=3, pad=0,
        return_lengths=True, executor="serial",
    )  # fmt: skip
    (out, lengths), = list(loader)  # fmt: skip
    assert out.tolist() == [[97, 0, 0], [98, 99, 100], [101, 102, 0]]
    assert lengths.tolist() == [1, 3, 2]


@pytest.mark.parametrize("executor", IN_PROCESS + ["processes"])
@pytest.mark.timeout(120)
def test_options_reach_each_batch(executor):
    data = Numbers(9)
    loader = prep.Loader(data, ragged, batch_size=3, pad=-1, executor=executor, workers=2)
    for k, batch in enumerate(loader):
        rows = [ragged(data[i]) for i in range(3 * k, 3 * k + 3)]
        expected = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=-1)
        assert torch.equal(batch, expected)


def with_state(sample: torch.Tensor, *, state: dict[str, int]) -> torch.Tensor:
    return sample + state["offset"]


def offset_state() -> dict[str, int]:
    return {"offset": 100}


@pytest.mark.parametrize("executor", IN_PROCESS + ["processes"])
@pytest.mark.timeout(120)
def test_setup_gives_each_worker_its_state(executor):
    data = Numbers(6)
    loader = prep.Loader(
        data, with_state, batch_size=3, setup=offset_state, executor=executor, workers=2
    )
    assert torch.equal(torch.cat(list(loader)), reference(data, lambda s: s + 100, range(6)))


# ------------------------------------------------------------------ indices, not samples


@pytest.mark.parametrize("executor", ["processes", "joblib", "auto"])
@pytest.mark.timeout(180)
def test_worker_processes_get_the_dataset_once_then_indices(executor, tmp_path):
    """The dataset is pickled once per Loader, whatever the batches and epochs; each
    worker reads it once (joblib's may be more workers than asked)."""
    log = str(tmp_path / "unpickled")
    Counted.pickled = 0
    data = Counted(48, log)
    loader = prep.Loader(data, affine, batch_size=4, executor=executor, workers=2)
    for _ in range(2):
        assert torch.equal(torch.cat(list(loader)), reference(data, affine, range(48)))
    assert Counted.pickled <= 1
    unpickled = Path(log).read_text().split() if os.path.exists(log) else []
    assert len(unpickled) <= 4 and len(set(unpickled)) == len(unpickled)
    written = loader._fetch._file  # the file the workers read, while the Loader lives
    if written is not None:
        assert os.path.exists(written[0])
        del loader
        gc.collect()
        assert not os.path.exists(written[0])


def test_threads_index_the_dataset_itself():
    class Unpicklable(Numbers):
        def __reduce__(self):
            raise TypeError("no pickling")

    loader = prep.Loader(Unpicklable(8), affine, batch_size=4, executor="threads", workers=2)
    assert torch.equal(torch.cat(list(loader)), reference(Numbers(8), affine, range(8)))


@pytest.mark.timeout(120)
def test_a_dataset_processes_cannot_get_is_named():
    class Local(Numbers):  # picklable by value, but it holds a lock
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.lock = threading.Lock()

    loader = prep.Loader(Local(8), affine, batch_size=4, executor="processes", workers=2)
    with pytest.raises(prep.ConfigError, match=r"dataset \(Local\).*executor='threads'"):
        list(loader)


# ------------------------------------------------------------------ seeds


@pytest.mark.parametrize("fn", [noisy, noisy_global])
@pytest.mark.parametrize("executor", ["serial", "processes", "auto"])
@pytest.mark.timeout(180)
def test_a_samples_draws_are_its_own_in_any_batch_or_order(executor, fn):
    """Keyed by (seed, epoch, index): the same for batch size 4 shuffled on
    ``executor`` as for batch size 3 in order, serially; another epoch draws anew."""
    data = Numbers(14)

    def by_index(loader: prep.Loader) -> dict[int, torch.Tensor]:
        rows = torch.cat(list(loader))
        return {int(r[0]): r for r in rows}

    plain = prep.Loader(data, fn, batch_size=3, seed=9, executor="serial")
    shuffled = prep.Loader(
        data, fn, batch_size=4, shuffle=True, seed=9, executor=executor, workers=2
    )
    first, other = by_index(plain), by_index(shuffled)
    assert sorted(first) == list(range(14))
    for i in range(14):
        assert torch.equal(first[i], other[i]), i
    assert len({tuple(r[2:].tolist()) for r in first.values()}) == 14  # each its own draw
    second = by_index(plain)  # epoch 1
    assert all(not torch.equal(first[i][2:], second[i][2:]) for i in range(14))
    reseeded = by_index(prep.Loader(data, fn, batch_size=3, seed=10, executor="serial"))
    assert not torch.equal(first[0], reseeded[0])


def test_seeded_rows_leave_the_global_generators_as_they_were():
    before = torch.random.get_rng_state()
    loader = prep.Loader(Numbers(8), noisy_global, batch_size=4, seed=1, executor="serial")
    list(loader)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_global_draws_on_threads_are_stopped_as_map_samples_stops_them():
    loader = prep.Loader(Numbers(8), noisy_global, batch_size=4, seed=1, executor="threads")
    with pytest.raises(prep.ConfigError, match="rng parameter"):
        list(loader)
    threads = prep.Loader(Numbers(8), noisy, batch_size=4, seed=1, executor="threads")
    serial = prep.Loader(Numbers(8), noisy, batch_size=4, seed=1, executor="serial")
    assert torch.equal(torch.cat(list(threads)), torch.cat(list(serial)))


# ------------------------------------------------------------------ position


@pytest.mark.parametrize("executor", ["serial", "threads", "processes"])
@pytest.mark.parametrize("k", [0, 1, 7])
@pytest.mark.timeout(120)
def test_a_loader_resumes_where_its_state_was_taken(executor, k):
    data = Numbers(40)

    def make() -> prep.Loader:
        return prep.Loader(
            data, noisy, batch_size=4, shuffle=True, seed=3, executor=executor, workers=2,
            prefetch=4,
        )  # fmt: skip

    whole = list(make())
    loader = make()
    epoch = iter(loader)
    taken = [next(epoch) for _ in range(k)]
    state = loader.state_dict()
    epoch.close()
    assert state["epoch"] == 0 and state["position"] == k * 4
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(taken) + len(rest) == len(whole)
    for got, want in zip(taken + rest, whole):
        assert torch.equal(got, want)


def test_an_epoch_run_to_its_end_resumes_at_the_next():
    data = Numbers(12)
    loader = prep.Loader(data, affine, batch_size=4, shuffle=True, executor="serial")
    list(loader)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 4)
    want = list(epoch)
    again = prep.Loader(data, affine, batch_size=4, shuffle=True, executor="serial")
    again.load_state_dict(state)  # the order's drawn seed is in the state
    got = list(again)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert again.state_dict()["epoch"] == 2
    state["position"] = 12  # every sample handed over: the next epoch, at its start
    again.load_state_dict(state)
    assert again.state_dict()["epoch"] == 2 and again.state_dict()["position"] == 0
    assert len(list(again)) == 3 and again.state_dict()["epoch"] == 3


def test_breaking_out_stops_the_stream_and_keeps_the_position():
    loader = prep.Loader(Numbers(40), affine, batch_size=2, executor="threads", workers=2)
    for seen, _ in enumerate(loader):
        if seen == 2:
            break
    gc.collect()
    assert wait_until(lambda: not producers())
    assert loader.state_dict()["position"] == 6
    with iter(loader) as epoch:  # a new loop is the next epoch
        next(epoch)
    assert not producers() and loader.state_dict()["epoch"] == 1


# ------------------------------------------------------------------ refusals


class NoLength:
    def __getitem__(self, i: int) -> int:
        return i


class Stream_(torch.utils.data.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


BAD = [
    (lambda: prep.Loader(NoLength(), affine), TypeError, "map-style dataset .* NoLength"),
    (lambda: prep.Loader(Stream_(), affine), TypeError, "imap_samples"),
    (lambda: prep.Loader(affine, Numbers(3)), TypeError, "swapped"),
    (lambda: prep.Loader(Numbers(3), 5), TypeError, "row function second"),
    (lambda: prep.Loader(Numbers(3), lambda a, b: a), TypeError, "cannot take a sample"),
    (lambda: prep.Loader(Numbers(3), noisy, seed=1, setup=dict), TypeError, "state"),
    (lambda: prep.Loader(Numbers(3), affine, batch_size=0), prep.ConfigError, "batch_size=0"),
    (lambda: prep.Loader(Numbers(3), affine, batch_size=2.0), prep.ConfigError, "batch_size"),
    (lambda: prep.Loader(Numbers(3), affine, shuffle=1), TypeError, "shuffle=1"),
    (lambda: prep.Loader(Numbers(3), affine, seed="7"), TypeError, "seed='7'"),
    (lambda: prep.Loader(Numbers(3), affine, prefetch=-1), prep.ConfigError, "prefetch=-1"),
    (lambda: prep.Loader(Numbers(3), affine, executor="gpu"), prep.ConfigError, "gpu"),
    (lambda: prep.Loader(Numbers(3), affine, padd=0), TypeError, "padd"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "error", "words"), BAD)
def test_a_bad_argument_is_named_with_its_fix(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_a_state_of_another_loader_is_refused():
    state = prep.Loader(Numbers(12), affine, batch_size=4, seed=1).state_dict()
    for other, words in [
        (prep.Loader(Numbers(13), affine, batch_size=4, seed=1), "samples=12"),
        (prep.Loader(Numbers(12), affine, batch_size=4, seed=2), "seed=1"),
    ]:
        with pytest.raises(prep.ConfigError, match=words):
            other.load_state_dict(state)
    with pytest.raises(prep.ConfigError, match="state_dict"):
        prep.Loader(Numbers(12), affine).load_state_dict({"epoch": 1})
    with pytest.raises(prep.ConfigError, match="position=-1"):
        prep.Loader(Numbers(12), affine, batch_size=4).load_state_dict({**state, "position": -1})


@pytest.mark.timeout(120)
def test_the_loaders_stats_are_its_latest_epochs_and_name_what_bounds_the_loop():
    loader = prep.Loader(list(range(12)), torch.tensor, batch_size=4, executor="threads")
    assert loader.stats().batches == 0  # no epoch yet
    epoch = iter(loader)
    next(epoch)
    assert loader.stats().batches == 1  # the running epoch, so far
    rest = list(epoch)
    assert len(rest) == 2 and loader.stats().batches == 3 and loader.stats().rows == 12
    del epoch
    assert loader.stats().batches == 3  # kept once the epoch is gone
    assert "bound" in str(loader.stats())  # the verdict in one sentence
    assert sum(1 for _ in loader) == 3 and loader.stats().batches == 3  # the next epoch's


LEFT_BY_THE_DEAD = """
import glob, os, sys
import torch, prep
from tests.test_loader import Numbers

loader = prep.Loader(Numbers(8), torch.neg, batch_size=4, executor="processes", workers=2)
got = torch.cat(list(loader))
assert torch.equal(got, -torch.stack([Numbers(8)[i] for i in range(8)])), got
print("DURING", sorted(os.path.basename(p) for p in glob.glob(sys.argv[1] + "/prep-loader-*")))
"""


@pytest.mark.timeout(120)
def test_a_loader_file_left_by_a_killed_process_is_removed_by_the_next_one(tmp_path):
    """A process killed before its exit (a Jupyter kernel ended while prep's forkserver
    ran) leaves the file its workers read the dataset from; the next Loader that writes
    one removes the files of writers that are gone, never those of a live process."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f"prep-loader-{int(gone.stdout)}-abcd1234.pkl"
    live = tmp_path / f"prep-loader-{os.getpid()}-efgh5678.pkl"  # this test's own process
    stale.write_bytes(b"left")
    live.write_bytes(b"in use")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", LEFT_BY_THE_DEAD, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=100)  # fmt: skip
    assert done.returncode == 0, done.stderr
    during = done.stdout.split("DURING ", 1)[1].splitlines()[0]
    assert stale.name not in during and live.name in during, during
    assert during.count("prep-loader-") == 2, during  # the live one, and the run's own
    # at its exit the run removed its own; the stale one is gone, the live one kept
    assert sorted(p.name for p in tmp_path.glob("prep-loader-*")) == [live.name]
