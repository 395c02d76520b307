"""prep.Collate inside real DataLoaders: workers 0 and 2, fork and spawn, persistent."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import prep
from tests import rowfns

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
@pytest.mark.parametrize("executor", ["serial", "threads", "processes"])
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
