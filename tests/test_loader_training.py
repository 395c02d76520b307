"""prep.Loader in the patterns every training script uses, the behaviours the
DataLoader's and torchdata's own suites check, written here against prep.Loader:
a Loader used inline, a batch that fails mid-epoch, ranks, a batch-level collate,
samplers, the dataset's own state, a resume at another batch size or world size.

References are plain loops over the dataset; nothing waits on a clock. Datasets
and row functions live at module level: worker processes import them.
"""

from __future__ import annotations

import gc
import glob
import os
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import prep
from tests import registry

SAMPLE_EXECUTORS = registry.executors(registry.SAMPLES)
PER_ROW_ERRORS = registry.executors(registry.SAMPLES, registry.PER_ROW_ERRORS)


class Numbers:
    """Sample ``i`` is ``[i, i * i]``; ``bad`` indices raise in ``__getitem__``."""

    def __init__(self, n: int, bad: tuple[int, ...] = ()) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise ValueError(f"sample {i} is broken")
        return torch.tensor([float(i), float(i * i)])


class Vocabulary(Numbers):
    """A dataset with a state of its own: the offset it adds, which a training script
    changes between epochs and expects back after a resume."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.offset = 0.0

    def __getitem__(self, i: int) -> torch.Tensor:
        return super().__getitem__(i) + self.offset

    def state_dict(self) -> dict[str, float]:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.offset = state["offset"]


def double(sample: Any) -> torch.Tensor:
    return torch.as_tensor(sample) * 2


def noisy(sample: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.cat([sample, torch.rand(2, generator=rng)])


def tokens(sample: torch.Tensor) -> torch.Tensor:
    """A sequence whose length depends on the sample: 1 to 4 tokens."""
    i = int(sample[0])
    return torch.arange(i % 4 + 1) + i


def first(batch: torch.Tensor) -> list[int]:
    return [int(x) for x in batch[:, 0]]


def plain(dataset: Numbers, fn: Any, indices: list[int]) -> torch.Tensor:
    return torch.stack([fn(dataset[i]) for i in indices])


# ------------------------------------------------------------------ inline


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("executor", SAMPLE_EXECUTORS)
@pytest.mark.timeout(180)
def test_a_loader_used_inline_runs_every_batch(executor, workers):
    """``for batch in prep.Loader(...)`` with no name for the Loader: the epoch keeps
    what its workers need (the Loader was collected while the stream still ran)."""
    data = list(range(8))
    for _ in range(3):
        got = [b for b in prep.Loader(data, double, batch_size=2, executor=executor,
                                      workers=workers)]  # fmt: skip
        assert torch.equal(torch.cat(got), torch.tensor(data) * 2)
    got = next(iter(prep.Loader(data, double, batch_size=3, executor=executor, workers=workers)))
    assert torch.equal(got, torch.tensor([0, 2, 4]))


@pytest.mark.timeout(120)
def test_a_loader_dropped_mid_epoch_leaves_its_epoch_whole():
    data = Numbers(12)
    loader = prep.Loader(data, double, batch_size=2, executor="processes", workers=2)
    epoch = iter(loader)
    taken = [next(epoch)]
    pattern = os.path.join(tempfile.gettempdir(), f"prep-loader-{os.getpid()}-*")
    written = set(glob.glob(pattern))
    assert written  # the workers' copy of the dataset
    del loader
    gc.collect()
    assert written <= set(glob.glob(pattern))  # still there while the epoch runs
    taken += list(epoch)
    assert torch.equal(torch.cat(taken), plain(data, double, list(range(12))))
    del epoch
    gc.collect()
    assert not written & set(glob.glob(pattern))  # gone with the epoch


# ------------------------------------------------------------------ a batch that fails


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("executor", SAMPLE_EXECUTORS)
@pytest.mark.timeout(180)
def test_after_a_batch_fails_the_state_points_at_it_and_a_resume_loses_nothing(executor, workers):
    broken, fixed = Numbers(20, bad=(9,)), Numbers(20)
    make = lambda data: prep.Loader(  # noqa: E731
        data, double, batch_size=4, shuffle=True, seed=1, executor=executor, workers=workers
    )
    loader = make(broken)
    order = loader.order(0).tolist()
    failing = order.index(9) // 4  # the batch that holds sample 9
    taken = []
    with pytest.raises(prep.RowError) as raised:
        for batch in loader:
            taken.append(batch)
    assert len(taken) == failing
    assert raised.value.index == 9 and "dataset[9]" in str(raised.value)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, 4 * failing)
    resumed = make(fixed)
    resumed.load_state_dict(state)
    rest = list(resumed)
    want = [plain(fixed, double, order[k : k + 4]) for k in range(0, 20, 4)]
    assert len(taken) + len(rest) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(taken + rest, want))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("executor", SAMPLE_EXECUTORS)
@pytest.mark.timeout(180)
def test_a_loop_that_catches_the_error_gets_the_rest_of_the_epoch(executor, workers):
    data = Numbers(20, bad=(6, 13))
    loader = prep.Loader(data, double, batch_size=4, executor=executor, workers=workers)
    epoch, got, failed = iter(loader), [], []
    while True:
        try:
            got.append(next(epoch))
        except StopIteration:
            break
        except prep.RowError as exc:
            failed.append(exc.index)
            assert loader.state_dict()["position"] == 4 * (len(got) + len(failed) - 1)
    assert failed == [6, 13]
    want = [plain(data, double, list(range(k, k + 4))) for k in (0, 8, 16)]
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert loader.state_dict() == {**loader.state_dict(), "epoch": 1, "position": 0}


# ------------------------------------------------------------------ ranks


def ranks_of(world: int, **kwargs: Any) -> list[prep.Loader]:
    """The ranks of a job, in this one process: each in the caller's thread (prefetch=0),
    as one serial stream's seeded run would see another's draws on the process's global
    generators (a job runs one rank a process)."""
    return [prep.Loader(Numbers(23), noisy, batch_size=3, shuffle=True, seed=4, rank=r,
                        world_size=world, executor="serial", prefetch=0, **kwargs)
            for r in range(world)]  # fmt: skip


def by_index(batches: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    return {int(row[0]): row for batch in batches for row in batch}


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_take_disjoint_shares_and_draw_what_one_process_draws(world):
    one = by_index(list(ranks_of(1)[0]))
    shares = [list(loader) for loader in ranks_of(world)]
    seen = [int(row[0]) for batches in shares for batch in batches for row in batch]
    assert sorted(seen) == list(range(23))  # every sample once, over the ranks
    together = by_index([b for batches in shares for b in batches])
    assert all(torch.equal(together[i], one[i]) for i in range(23))  # draws keyed by index
    assert [len(loader) for loader in ranks_of(world)] == [len(s) for s in shares]


def test_drop_last_gives_every_rank_the_same_full_batches():
    loaders = ranks_of(2, drop_last=True)
    shares = [list(loader) for loader in loaders]
    assert [len(s) for s in shares] == [len(x) for x in loaders] == [3, 3]
    assert all(len(b) == 3 for s in shares for b in s)


@pytest.mark.parametrize(("saved", "resumed"), [(2, 1), (1, 2), (2, 3)])
def test_a_state_saved_at_one_world_size_resumes_at_another(saved, resumed):
    before = ranks_of(saved)
    epochs = [iter(loader) for loader in before]
    taken = [next(e) for e in epochs for _ in range(2)]  # two steps on every rank
    state = before[0].state_dict()
    assert all(loader.state_dict() == {**state, "world_size": saved} for loader in before)
    for e in epochs:
        e.close()
    after = ranks_of(resumed)
    for loader in after:
        loader.load_state_dict(state)
    rest = [b for loader in after for b in loader]
    seen = [int(row[0]) for batch in taken + rest for row in batch]
    assert sorted(seen) == list(range(23))  # none lost, none twice
    one = by_index(list(ranks_of(1)[0]))
    assert all(torch.equal(row, one[i]) for i, row in by_index(taken + rest).items())


def test_a_bad_rank_is_named_with_its_fix():
    for rank, world in [(2, 2), (-1, 2), (0, 0), (1, None), (0.0, 1)]:
        with pytest.raises(prep.ConfigError, match="0 <= rank < world_size"):
            prep.Loader(Numbers(3), double, rank=rank, world_size=world)


GLOO = """
import os, sys
import torch, torch.distributed as dist
import prep
from tests.test_loader_training import Numbers, noisy

dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
loader = prep.Loader(Numbers(23), noisy, batch_size=3, shuffle=True, seed=4,
                     executor=sys.argv[3], workers=2)
assert (loader.rank, loader.world_size) == (dist.get_rank(), 2)
torch.save([b for b in loader], sys.argv[4])
dist.destroy_process_group()
"""


@pytest.mark.parametrize("executor", ["serial", "processes"])
@pytest.mark.timeout(240)
def test_two_processes_of_a_distributed_job_share_an_epoch(tmp_path, executor):
    init = f"file://{tmp_path / 'rendezvous'}"
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", GLOO, init, str(r), executor, str(outs[r])],
                         cwd=os.getcwd(), stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=200)
        assert p.returncode == 0, err[-2000:]
    shares = [torch.load(out) for out in outs]
    seen = [int(row[0]) for batches in shares for batch in batches for row in batch]
    assert sorted(seen) == list(range(23))
    one = by_index(list(ranks_of(1)[0]))
    assert all(torch.equal(row, one[i]) for i, row in by_index(shares[0] + shares[1]).items())


# ------------------------------------------------------------------ collate, sampler


class Batch:
    """A custom batch class a training script collates into."""

    def __init__(self, padded: torch.Tensor, lengths: torch.Tensor) -> None:
        self.padded, self.lengths = padded, lengths


def to_batch(sequences: list[torch.Tensor]) -> Batch:
    lengths = torch.tensor([len(s) for s in sequences])
    return Batch(pad_sequence(sequences, batch_first=True, padding_value=-1), lengths)


def pair(sample: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"ids": tokens(sample), "label": sample[:1].long()}


@pytest.mark.parametrize("executor", SAMPLE_EXECUTORS)
@pytest.mark.timeout(180)
def test_collate_gets_each_samples_own_result(executor):
    data = Numbers(11)
    loader = prep.Loader(data, tokens, batch_size=4, collate=to_batch, executor=executor,
                         workers=2)  # fmt: skip
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    for k, batch in enumerate(batches):
        sequences = [tokens(data[i]) for i in range(4 * k, min(4 * k + 4, 11))]
        assert isinstance(batch, Batch)
        assert torch.equal(batch.padded, pad_sequence(sequences, True, padding_value=-1))
        assert batch.lengths.tolist() == [len(s) for s in sequences]
    packed = prep.Loader(data, pair, batch_size=5, collate=list, executor=executor, workers=2)
    for k, samples in enumerate(packed):
        for i, got in zip(range(5 * k, 5 * k + 5), samples):
            want = pair(data[i])
            assert got.keys() == want.keys()
            assert all(torch.equal(got[key], want[key]) for key in want)


def test_collate_refuses_the_options_that_shape_prep_s_own_batch():
    with pytest.raises(prep.ConfigError, match="drop pad="):
        prep.Loader(Numbers(3), tokens, collate=to_batch, pad=0)
    with pytest.raises(prep.ConfigError, match="return_valid="):
        prep.Loader(Numbers(3), tokens, collate=to_batch, return_valid=True)
    with pytest.raises(TypeError, match="collate=3"):
        prep.Loader(Numbers(3), tokens, collate=3)


def weighted(n: int) -> torch.utils.data.WeightedRandomSampler:
    weights = torch.linspace(0.1, 1.0, n)
    return torch.utils.data.WeightedRandomSampler(weights, num_samples=15, replacement=True)


@pytest.mark.parametrize("executor", ["serial", "threads", "processes"])
@pytest.mark.timeout(120)
def test_a_seeded_weighted_sampler_repeats_and_resumes(executor):
    data = Numbers(10)
    make = lambda: prep.Loader(data, double, batch_size=4, sampler=weighted(10), seed=2,  # noqa: E731
                               executor=executor, workers=2)  # fmt: skip
    loader = make()
    first, second = [first_of(loader) for _ in range(2)]
    assert len(first) == 15 and first != second  # each epoch its own draw
    assert [first_of(make()) for _ in range(1)] == [first]
    resumed = make()
    epoch = iter(resumed)
    head = first_col(next(epoch))
    state = resumed.state_dict()
    epoch.close()
    again = make()
    again.load_state_dict(state)
    assert head + [i for b in again for i in first_col(b)] == first


def first_col(batch: torch.Tensor) -> list[int]:
    return [int(x) // 2 for x in batch[:, 0]]


def first_of(loader: prep.Loader) -> list[int]:
    return [i for b in loader for i in first_col(b)]


def test_a_sampler_is_refused_beside_shuffle_and_without_a_length():
    with pytest.raises(prep.ConfigError, match="one of them"):
        prep.Loader(Numbers(3), double, sampler=[0, 1], shuffle=True)
    with pytest.raises(prep.ConfigError, match="with a length"):
        prep.Loader(Numbers(3), double, sampler=iter([0, 1]))
    plain_order = prep.Loader(Numbers(6), double, sampler=[5, 1, 3], executor="serial")
    assert [first_col(b) for b in plain_order] == [[5], [1], [3]]


# ------------------------------------------------------------------ the dataset's state


@pytest.mark.parametrize("executor", ["serial", "processes"])
@pytest.mark.timeout(120)
def test_the_dataset_s_own_state_is_saved_and_restored(executor):
    data = Vocabulary(8)
    loader = prep.Loader(data, double, batch_size=4, executor=executor, workers=2)
    data.offset = 100.0
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    epoch.close()
    assert state["dataset"] == {"offset": 100.0}
    again = prep.Loader(Vocabulary(8), double, batch_size=4, executor=executor, workers=2)
    list(again)  # its workers hold the dataset without the offset
    again.load_state_dict(state)
    (rest,) = list(again)
    assert torch.equal(rest, plain(data, double, [4, 5, 6, 7]))


# ------------------------------------------------------------------ another batch size


@pytest.mark.parametrize("executor", ["serial", "processes"])
@pytest.mark.timeout(120)
def test_a_resume_at_another_batch_size_yields_the_rest_of_the_samples(executor):
    data = Numbers(30)
    make = lambda size: prep.Loader(data, noisy, batch_size=size, shuffle=True, seed=9,  # noqa: E731
                                    executor=executor, workers=2)  # fmt: skip
    whole = by_index(list(make(5)))
    loader = make(4)
    epoch = iter(loader)
    taken = [next(epoch) for _ in range(3)]
    state = loader.state_dict()
    epoch.close()
    again = make(7)
    again.load_state_dict(state)
    got = by_index(taken + list(again))
    assert sorted(got) == list(range(30))
    assert all(torch.equal(got[i], whole[i]) for i in got)


# ------------------------------------------------------------------ the DataLoader's names


@pytest.mark.parametrize("name", sorted(prep.loader.DATALOADER))
def test_a_dataloader_argument_is_named_with_the_loader_s_own(name):
    instead = prep.loader.DATALOADER[name].split(" ")[0]
    with pytest.raises(TypeError, match=f"DataLoader's {name}=.*pass {instead}"):
        prep.Loader(Numbers(3), double, **{name: 2})


FILLED_FROM_STDIN = """
import torch, prep

def sample(i):
    if i == 2:
        raise ValueError("bad sample")
    return torch.tensor([i])

loader = prep.Loader(list(range(4)), sample, batch_size=4, on_error="fill", fill=0,
                     executor="serial")
print([b.flatten().tolist() for b in loader])
"""


@pytest.mark.timeout(120)
def test_a_filled_sample_warns_at_the_users_line_in_code_read_from_stdin():
    """A stream's warning points at the user's line; code read from stdin has no source
    to show, which must not turn the warning into an ImportError."""
    done = subprocess.run([sys.executable, "-"], input=FILLED_FROM_STDIN, text=True,
                          capture_output=True, timeout=100)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[[0, 1, 0, 3]]" in done.stdout
    assert "<stdin>" in done.stderr and "1 of 4 rows failed" in done.stderr


# ------------------------------------------------------------------ what the loop sees


@pytest.mark.timeout(120)
def test_each_loader_explains_its_own_stream():
    """Two Loaders on one shared pool: each tells of its own epoch, not the pool's
    latest stream (which ``pool.explain()`` describes, mixed)."""
    short = prep.Loader(Numbers(8), double, batch_size=4, executor="threads", workers=2)
    long = prep.Loader(Numbers(30), double, batch_size=3, executor="threads", workers=2)
    assert "no epoch yet" in short.explain()
    list(short)
    epoch = iter(long)
    next(epoch)
    said, other = str(short.explain()), str(long.explain())
    assert "Numbers of 8 samples, 2 batches of 4" in said and "executor='threads'" in said
    assert "epoch 0 (ended): 2 batches handed over" in said
    assert "stream: strategy=" in said and "bound" in said.splitlines()[-1]
    assert "epoch 0 (running): 1 batches handed over" in other
    epoch.close()


class Bar:
    """A progress bar that records the total it was made with."""

    made: list[int | None] = []

    def __init__(self, unit: str, total: int | None = None) -> None:
        Bar.made.append(total)

    def advance(self, rows: int, note: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_progress_bar_counts_to_the_epoch_s_batches(monkeypatch):
    monkeypatch.setattr(prep.stream.streams, "CountBar", Bar)
    Bar.made = []
    loader = prep.Loader(Numbers(10), double, batch_size=4, executor="serial", progress=True)
    assert len(list(loader)) == 3
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    epoch.close()
    loader.load_state_dict(state)  # resumed after one batch: two to come
    list(loader)
    with prep.Pool("serial") as pool:
        list(pool.imap(torch.neg, [torch.ones(2, 2)] * 5, progress=True))
    assert Bar.made == [3, 3, 2, 5]
