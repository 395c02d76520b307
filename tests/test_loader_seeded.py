"""``seed=`` where draws are made outside the row function, and on threads (issue 48).

A torchvision-style dataset (``ImageFolder(root, transform=...)`` in small) applies
a random crop and flip in ``__getitem__``, drawing from torch's global generator.
Under ``prep.Loader(seed=)`` a sample's draws are keyed by ``(seed, epoch, index)``
wherever they are made. The reference is a plain loop this file writes: sample ``i``
of epoch ``e`` has the key ``s = mix(mix(seed, e), i)``; the global generators are
seeded with ``s`` before ``dataset[i]`` (``mix(s, 1)`` where ``fn`` takes ``rng``,
which is seeded with ``s``), as docs/api.md says.

Threads share the global generators with the whole process, so nothing seeds them
there: a function (or dataset) that draws nothing gives a plain loop's rows, and one
that draws is stopped in one line at the draw. The datasets and functions live at
module level: worker processes import them. Nothing here waits on a clock.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import prep
from prep.core.seeding import mix
from prep.executors._base import split
from prep.executors.threads import PARTS
from tests import registry

SEED = 21
N = 18
BATCH = 4
F64 = torch.float64
WORKERS = [1, 2, 3]
#: the executors that seed what a dataset draws (threads watch it: tested apart)
SEEDING = [
    name
    for name in registry.executors(registry.SAMPLES, registry.TORCH_DRAWS, registry.GLOBAL_DRAWS)
    if not prep.EXECUTORS[name].traits.shares_generators
]


# ---------------------------------------------------------------- the dataset


def crop_and_flip(image: torch.Tensor) -> torch.Tensor:
    """RandomCrop(6) and RandomHorizontalFlip, drawing from torch's global generator as
    torchvision's transforms do."""
    top, left = (int(v) for v in torch.randint(0, 3, (2,)))
    crop = image[:, top : top + 6, left : left + 6]
    return crop.flip(-1) if bool(torch.rand(()) < 0.5) else crop


def center_crop(image: torch.Tensor) -> torch.Tensor:
    """CenterCrop(6): no draw."""
    return image[:, 1:7, 1:7]


class Photos:
    """Sample ``i`` is an 8x8 image made from ``i``, through ``transform`` in
    ``__getitem__``; its index first, so that a row shows which sample it is."""

    def __init__(self, transform: Callable[[torch.Tensor], torch.Tensor] = crop_and_flip) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        image = torch.arange(64, dtype=F64).view(1, 8, 8) + 100 * i
        return torch.cat([torch.tensor([float(i)], dtype=F64), self.transform(image).flatten()])


def keep(sample: torch.Tensor) -> torch.Tensor:
    """No draw."""
    return sample.clone()


def jitter(sample: torch.Tensor) -> torch.Tensor:
    """Draws from torch's global generator, after the dataset's own draws."""
    return torch.cat([sample, torch.rand(2, dtype=F64)])


def jitter_rng(sample: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.cat([sample, torch.rand(2, dtype=F64, generator=rng)])


# ---------------------------------------------------------------- the reference


def states() -> tuple[torch.Tensor, Any, Any]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def same_states(a: tuple[torch.Tensor, Any, Any], b: tuple[torch.Tensor, Any, Any]) -> bool:
    na, nb = a[2], b[2]
    numpy_same = na[0] == nb[0] and np.array_equal(na[1], nb[1]) and na[2:] == nb[2:]
    return torch.equal(a[0], b[0]) and a[1] == b[1] and bool(numpy_same)


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """The loop's seeding is no part of the test's own generators."""
    before = states()
    try:
        yield
    finally:
        torch.set_rng_state(before[0])
        random.setstate(before[1])
        np.random.set_state(before[2])


def seed_globals(s: int) -> None:
    torch.random.default_generator.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


def sample(dataset: Any, fn: Callable[..., torch.Tensor], epoch: int, i: int) -> torch.Tensor:
    """``fn(dataset[i])`` in epoch ``epoch`` under the documented key."""
    s = mix(mix(SEED, epoch), i)
    if "rng" in inspect.signature(fn).parameters:
        seed_globals(mix(s, 1))
        return fn(dataset[i], rng=torch.Generator().manual_seed(s))
    seed_globals(s)
    return fn(dataset[i])


def order(epoch: int, shuffle: bool = True) -> list[int]:
    """Epoch ``epoch``'s order: a permutation drawn from ``(seed, epoch)``."""
    if not shuffle:
        return list(range(N))
    return torch.randperm(N, generator=torch.Generator().manual_seed(mix(SEED, epoch))).tolist()


def reference(
    dataset: Any, fn: Callable[..., torch.Tensor], epoch: int, shuffle: bool = True
) -> list[torch.Tensor]:
    """Epoch ``epoch``'s batches, as a plain loop builds them."""
    with generators_kept():
        rows = [sample(dataset, fn, epoch, i) for i in order(epoch, shuffle)]
    return [torch.stack(rows[k : k + BATCH]) for k in range(0, N, BATCH)]


def same_batches(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(
        g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want)
    )


def loader(
    dataset: Any, fn: Callable[..., torch.Tensor], executor: str, workers: int = 2, **kw: Any
) -> prep.Loader:
    return prep.Loader(
        dataset, fn, batch_size=BATCH, shuffle=True, seed=SEED, executor=executor,
        workers=workers, **kw,
    )  # fmt: skip


def one_line(error: BaseException) -> bool:
    return len(str(error).splitlines()) == 1


def test_the_reference_is_worth_matching():
    """The loop's draws differ by sample and by epoch (a match cannot come from
    constant or unseeded draws)."""
    photos = Photos()
    first, second = reference(photos, jitter, 0), reference(photos, jitter, 1)
    crops = {tuple(r[1:37].tolist()) for b in first for r in b}
    assert len(crops) > N // 2, "the crop and flip draw anew for each sample"
    by_index = {int(r[0]): r for b in second for r in b}
    assert all(not torch.equal(r[1:], by_index[int(r[0])][1:]) for b in first for r in b)
    assert same_batches(first, reference(photos, jitter, 0))


# ---------------------------------------------------------------- draws in __getitem__


@pytest.mark.filterwarnings("error")  # a processes Loader's first batch agrees with serial's
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fn", [jitter, jitter_rng])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("executor", SEEDING)
def test_draws_in_getitem_are_keyed_by_seed_epoch_and_index(executor, workers, fn):
    photos = Photos()
    before = states()
    data = loader(photos, fn, executor, workers)
    epochs = [list(data) for _ in range(2)]
    assert same_states(states(), before), "the caller's generators put back"
    for epoch, got in enumerate(epochs):
        assert same_batches(got, reference(photos, fn, epoch)), epoch
    crops = [{int(r[0]): r[1:37] for b in got for r in b} for got in epochs]
    assert any(not torch.equal(crops[0][i], crops[1][i]) for i in range(N)), "epochs differ"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fn", [jitter, jitter_rng])
def test_a_samples_draws_do_not_follow_the_batch_size(fn):
    """Independent of the reference's key: the same sample draws the same at batch
    sizes 3 and 5, in order and shuffled."""
    photos = Photos()

    def by_index(batch_size: int, shuffle: bool) -> dict[int, torch.Tensor]:
        data = prep.Loader(
            photos, fn, batch_size=batch_size, shuffle=shuffle, seed=SEED, executor="serial"
        )
        return {int(r[0]): r for b in data for r in b}

    threes, fives = by_index(3, False), by_index(5, True)
    assert sorted(threes) == list(range(N))
    assert all(torch.equal(threes[i], fives[i]) for i in range(N))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("executor", SEEDING)
def test_a_resume_mid_epoch_and_again_gives_the_rest_of_the_epoch(executor):
    photos = Photos()
    want = reference(photos, jitter_rng, 0)
    first = loader(photos, jitter_rng, executor, prefetch=4)
    with iter(first) as epoch:
        taken = [next(epoch) for _ in range(2)]
    second = loader(photos, jitter_rng, executor, prefetch=4)
    second.load_state_dict(first.state_dict())
    with iter(second) as epoch:
        taken.append(next(epoch))
    third = loader(photos, jitter_rng, executor, prefetch=4)
    third.load_state_dict(second.state_dict())  # a second resume in the same epoch
    assert third.state_dict()["position"] == 3 * BATCH
    assert same_batches(taken + list(third), want)
    assert same_batches(list(third), reference(photos, jitter_rng, 1))  # and on, in epoch 1


# ---------------------------------------------------------------- threads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", WORKERS)
def test_threads_give_the_loops_batches_where_getitem_draws_nothing(workers):
    photos = Photos(center_crop)
    before = states()
    for fn in (keep, jitter_rng):
        data = loader(photos, fn, "threads", workers)
        for epoch in range(2):
            assert same_batches(list(data), reference(photos, fn, epoch)), (fn, epoch)
    assert same_states(states(), before), "nothing seeded the process's generators"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fn", [keep, jitter, jitter_rng])
@pytest.mark.parametrize("workers", WORKERS)
def test_threads_stop_a_getitem_that_draws_in_one_line(workers, fn):
    data = loader(Photos(), fn, "threads", workers)
    with pytest.raises(prep.ConfigError, match="moved while") as caught:
        list(data)
    text = str(caught.value)
    assert one_line(caught.value) and "rng" in text and "processes" in text, text


@pytest.mark.timeout(120)
def test_a_seeded_shuffle_on_threads():
    """The seed orders the epoch on threads too: each epoch is the permutation drawn
    from (seed, epoch), the same as serial's."""
    photos = Photos(center_crop)
    threads = loader(photos, keep, "threads")
    serial = loader(photos, keep, "serial")
    for epoch in range(2):
        got = list(threads)
        assert [int(r[0]) for b in got for r in b] == order(epoch)
        assert same_batches(got, list(serial))


# ---------------------------------------------------------------- map_rows, imap, Collate


def double(row: torch.Tensor) -> torch.Tensor:
    return row * 2


def torch_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.cat([row, torch.rand(2, dtype=F64)])


def random_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.cat([row, torch.tensor([random.random()], dtype=F64)])


def numpy_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.cat([row, torch.from_numpy(np.random.rand(1))])


#: the rows each call of counted_draw saw (threads run in this process)
CALLS: list[int] = []


def counted_draw(row: torch.Tensor) -> torch.Tensor:
    CALLS.append(int(row[0]))
    return torch_draw(row)


def rows(n: int = 24, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=F64).repeat_interleave(3).view(n, 3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", WORKERS)
def test_map_rows_on_threads_with_seed_is_a_plain_loop_for_a_function_that_draws_nothing(
    workers,
):
    x = rows()
    before = states()
    assert torch.equal(prep.map_rows(double, x, executor="threads", workers=workers, seed=3), x * 2)
    samples = [{"x": float(i)} for i in range(8)]
    got = prep.map_samples(
        lambda s: torch.tensor([s["x"]]), samples, executor="threads", workers=workers, seed=3
    )
    assert got.flatten().tolist() == [s["x"] for s in samples]
    assert same_states(states(), before)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fn", [torch_draw, random_draw, numpy_draw])
@pytest.mark.parametrize("workers", WORKERS)
def test_a_draw_on_threads_is_stopped_in_one_line(workers, fn):
    for on_error in ("raise", "fill"):  # a draw is the call's error, never a row's
        with pytest.raises(prep.ConfigError, match="moved while") as caught:
            prep.map_rows(
                fn, rows(), executor="threads", workers=workers, seed=3, on_error=on_error
            )
        assert one_line(caught.value) and "rng" in str(caught.value)


@pytest.mark.timeout(120)
def test_no_row_of_a_run_runs_after_a_draw():
    """As soon as a draw is seen: each thread's run of rows (a part of the batch, or a
    whole batch of a stream) stops at the row after the one that drew."""
    CALLS.clear()
    with pytest.raises(prep.ConfigError, match="moved while"):
        prep.map_rows(counted_draw, rows(), executor="threads", workers=2, seed=3)
    firsts = {start for start, _ in split(0, 24, 2 * PARTS)}
    assert CALLS and set(CALLS) <= firsts, CALLS
    CALLS.clear()
    batches = [rows(6, start=100 * k) for k in range(3)]
    with prep.Pool("threads", workers=2) as pool, pytest.raises(prep.ConfigError, match="moved"):
        list(pool.imap(counted_draw, batches, strategy="whole", prefetch=2, seed=3))
    assert CALLS and all(c % 100 == 0 for c in CALLS), CALLS


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", [("split", 0), ("split", 2), ("whole", 2)])
def test_a_stream_on_threads_with_seed(how):
    strategy, prefetch = how
    batches = [rows(6, start=100 * k) for k in range(4)]
    with prep.Pool("threads", workers=2) as pool:
        got = list(pool.imap(double, batches, strategy=strategy, prefetch=prefetch, seed=3))
        assert all(torch.equal(g, b * 2) for g, b in zip(got, batches, strict=True))
        with pytest.raises(prep.ConfigError, match="moved while"):
            list(pool.imap(torch_draw, batches, strategy=strategy, prefetch=prefetch, seed=3))


@pytest.mark.timeout(120)
def test_collate_with_seed_on_threads():
    samples = [torch.full((3,), float(i), dtype=F64) for i in range(12)]
    collate = prep.Collate(double, executor="threads", workers=2, seed=5)
    try:
        got = torch.cat(list(DataLoader(samples, batch_size=4, collate_fn=collate)))
        assert torch.equal(got, torch.stack(samples) * 2)
    finally:
        collate.close()
    drawing = prep.Collate(torch_draw, executor="threads", workers=2, seed=5)
    try:
        with pytest.raises(prep.ConfigError, match="moved while") as caught:
            list(DataLoader(samples, batch_size=4, collate_fn=drawing))
        assert one_line(caught.value)
    finally:
        drawing.close()


@pytest.mark.timeout(60)
def test_another_threads_draw_is_named_as_a_cause():
    """The watch sees the process's generator, not the row's draws: a draw by another
    thread while a row runs stops the run too, and the error says so (a documented
    limit: a training step's dropout on CPU, beside a Loader on threads)."""
    started, drawn = threading.Event(), threading.Event()

    def waits(row: torch.Tensor) -> torch.Tensor:
        started.set()
        assert drawn.wait(30), "the other thread drew"
        return row * 2

    def other() -> None:
        if started.wait(30):
            torch.rand(1)
            drawn.set()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    try:
        with pytest.raises(prep.ConfigError, match="another thread") as caught:
            prep.map_rows(waits, rows(1), executor="threads", workers=1, seed=3)
        assert one_line(caught.value)
    finally:
        drawn.set()
        thread.join(30)
