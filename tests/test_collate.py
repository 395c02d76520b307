"""prep.Collate inside real DataLoaders: workers 0 and 2, fork and spawn, persistent."""

from __future__ import annotations

import os
import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import prep
from tests import registry, rowfns

pytestmark = pytest.mark.timeout(120)


class Tokens(Dataset):
    """Variable-length token rows (1 to 9 tokens), as tensors, tuples or dicts."""

    def __init__(self, kind: str = "tensor", n: int = 24) -> None:
        self.kind, self.n = kind, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        tokens = torch.arange(1, 2 + i % 9, dtype=torch.int64) * (i + 1)
        if self.kind == "tuple":
            return tokens, torch.tensor(i)
        if self.kind == "dict":
            return {"tokens": tokens}
        return tokens


FNS = {"tensor": rowfns.pad_tokens, "tuple": rowfns.pad_pair, "dict": rowfns.pad_dict}


def plain(kind: str, order: list[int]) -> object:
    """What a plain loop over the same samples gives."""
    data, fn = Tokens(kind), FNS[kind]
    results = [fn(data[i]) for i in order]
    if kind == "tensor":
        return torch.stack(results)
    if kind == "tuple":
        return tuple(torch.stack(r) for r in zip(*results))
    return {k: torch.stack([r[k] for r in results]) for k in results[0]}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict"])
@pytest.mark.parametrize("executor", registry.executors(registry.NO_TWIN, registry.SAMPLES))
def test_main_process_matches_a_plain_loop(kind, executor):
    collate = prep.Collate(FNS[kind], executor=executor, workers=2)
    loader = DataLoader(Tokens(kind), batch_size=5, collate_fn=collate)
    starts = range(0, 24, 5)
    for start, batch in zip(starts, loader):
        assert same(batch, plain(kind, list(range(start, min(start + 5, 24)))))
    collate.close()


@pytest.mark.parametrize(
    ("context", "persistent"), [("fork", False), ("spawn", True), ("forkserver", False)]
)
def test_worker_processes_fall_back_and_match(context, persistent):
    collate = prep.Collate(rowfns.pad_pair, executor="processes")
    loader = DataLoader(
        Tokens("tuple"),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        collate_fn=collate,
        multiprocessing_context=context,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(1),
    )
    for _ in range(2 if persistent else 1):  # persistent workers serve two epochs
        seen = []
        for tokens, labels in loader:
            order = labels.tolist()
            assert same((tokens, labels), plain("tuple", order))
            seen += order
        assert sorted(seen) == list(range(24))


def test_collate_then_map_rows():
    collate = prep.Collate(rowfns.row_sum, executor="threads", workers=2, collate=default_collate)
    samples = [torch.full((3, 2), float(i)) for i in range(5)]
    got = collate(samples)
    assert torch.equal(got, torch.stack(samples).sum(1, keepdim=True))
    collate.close()


def test_pickles_without_its_pool_and_reports_itself():
    collate = prep.Collate(rowfns.pad_tokens, executor="threads", workers=2)
    collate([torch.tensor([1, 2])])  # the pool now exists
    clone = pickle.loads(pickle.dumps(collate))
    assert clone._pool is None
    assert torch.equal(clone([torch.tensor([7])]), torch.tensor([[7, 0, 0, 0, 0, 0]]))
    assert repr(collate).startswith("prep.Collate(pad_tokens, executor='threads', workers=2")
    collate.close()
    clone.close()


class Recording:
    """Wraps a collate_fn; returns its batch and how many device warnings it gave."""

    def __init__(self, inner: prep.Collate) -> None:
        self.inner = inner

    def __call__(self, samples):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batch = self.inner(samples)
        return batch, sum("returns plain CPU tensors" in str(w.message) for w in caught)


def test_device_stays_on_cpu_inside_workers_with_one_warning():
    collate = prep.Collate(rowfns.pad_tokens, executor="threads", device="meta")
    loader = DataLoader(
        Tokens(),
        batch_size=6,
        num_workers=1,
        collate_fn=Recording(collate),
        multiprocessing_context="fork",
    )
    batches = list(loader)
    assert all(b.device.type == "cpu" for b, _ in batches)
    assert [n for _, n in batches] == [1, 0, 0, 0]  # once per worker process
    # in the main process the batch goes to the device
    assert collate([torch.tensor([1])]).device.type == "meta"
    collate.close()


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        prep.Collate(42)
    with pytest.raises(prep.ConfigError, match="executor='nope'"):
        prep.Collate(rowfns.pad_tokens, executor="nope")
    with pytest.raises(prep.ConfigError, match="workers=0"):
        prep.Collate(rowfns.pad_tokens, workers=0)


class PoolSize:
    def __init__(self, inner: prep.Collate) -> None:
        self.inner = inner

    def __call__(self, samples):
        batch = self.inner(samples)
        return batch, self.inner._get_pool().workers, torch.get_num_threads()


def test_threads_inside_workers_stay_within_the_cores():
    import os

    collate = prep.Collate(rowfns.pad_tokens, executor="threads")
    loader = DataLoader(
        Tokens(),
        batch_size=6,
        num_workers=2,
        collate_fn=PoolSize(collate),
        multiprocessing_context="fork",
    )
    cores = len(os.sched_getaffinity(0))
    for _, workers, intra in loader:
        assert workers == max(1, cores // 2)  # num_workers x threads <= cores
        assert intra == 1  # the DataLoader already gives each worker one intra-op thread


# ------------------------------------------------------------------ auto in a real worker


def heavy_pair(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """pad_pair after a pure-Python loop that holds the GIL: where processes would pay,
    so that auto would start them if it forgot it runs inside a DataLoader worker."""
    total = 0
    for i in range(20_000):
        total += i % 7
    tokens, label = rowfns.pad_pair(sample)
    return tokens + (total - total), label


class AutoInWorker:
    """``prep.Collate(heavy_pair, executor="auto")`` as a DataLoader's collate_fn: the
    batch, with the pid it ran in, the worker's live child processes after it, and what
    auto chose (picklable: spawn and forkserver send it to the worker)."""

    def __init__(self) -> None:
        self.inner = prep.Collate(heavy_pair, executor="auto", workers=2)

    def __call__(self, samples):
        from tests.conftest import descendants

        batch = self.inner(samples)
        choices = sorted(cal.choice for cal in self.inner._get_pool().choices())
        return batch, os.getpid(), len(descendants()), choices


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_auto_inside_a_real_dataloader_worker(no_leaks, context):
    """Not faked with in_worker_process: a DataLoader worker of each start method runs
    Collate(executor="auto"); every batch is the plain loop's, computed in the worker,
    which starts no process of its own (auto leaves processes out there)."""
    loader = DataLoader(
        Tokens("tuple"), batch_size=8, num_workers=1, collate_fn=AutoInWorker(),
        multiprocessing_context=context,
    )  # fmt: skip
    seen = []
    for (tokens, labels), pid, children, choices in loader:
        order = labels.tolist()
        want = tuple(torch.stack(r) for r in zip(*[heavy_pair(Tokens("tuple")[i]) for i in order]))
        assert same((tokens, labels), want)
        assert pid != os.getpid() and children == 0, (pid, children, choices)
        assert choices and not set(choices) & {"processes", "joblib"}, choices
        seen += order
    assert seen == list(range(24))
