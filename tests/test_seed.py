"""``seed=`` (issue 39): a row's random draws are a property of the row, not of the
worker that runs it.

The reference is a plain loop this file writes itself (never prep's serial path):
row ``i`` of a ``map_rows`` batch is computed after seeding torch's default CPU
generator, Python's ``random`` and numpy's global generator with
``mix(seed, i)`` (or, for a function that takes ``rng``, with a fresh
``torch.Generator`` seeded so), and the rows are stacked; batch ``k`` of a stream
is keyed under ``mix(seed, k)``. Every executor in the registry either returns
the loop's rows bit for bit or is refused with a ``ConfigError``, as its traits say:
a batched call (``per_row`` False) cannot seed each row, and threads
(``shares_generators``) cannot seed the global generators, only a function's ``rng``:
a function that draws from the global generators there is stopped at its first draw
(tests/test_loader_seeded.py has the rest of threads under ``seed=``).
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import prep
from prep.core.seeding import mix
from tests import registry, statefns

ROWS = 24
SEED = 7
F64 = torch.float64


# ---------------------------------------------------------------- row functions
# module level: worker processes (processes, joblib) import them by name


def torch_draw(row: torch.Tensor) -> torch.Tensor:
    """The row's first value (to see its order), then three draws from torch.rand."""
    return torch.cat([row[:1], torch.rand(3, dtype=F64)])


def random_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.cat([row[:1], torch.tensor([random.random() for _ in range(3)], dtype=F64)])


def numpy_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.cat([row[:1], torch.from_numpy(np.random.rand(3))])


def rng_draw(row: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    return torch.cat([row[:1], torch.rand(3, dtype=F64, generator=rng)])


#: one function for each generator a row may draw from
FNS: dict[str, Callable[..., torch.Tensor]] = {
    "torch": torch_draw,
    "random": random_draw,
    "numpy": numpy_draw,
    "rng": rng_draw,
}
GLOBAL = ("torch", "random", "numpy")


def sample_draw(sample: dict[str, Any]) -> torch.Tensor:
    """A sample (a dict) and a draw from each global generator."""
    x = torch.tensor([sample["x"]], dtype=F64)
    drawn = torch.tensor([torch.rand(()).item(), random.random(), np.random.rand()], dtype=F64)
    return torch.cat([x, drawn])


def sample_rng_draw(sample: dict[str, Any], rng: torch.Generator) -> torch.Tensor:
    x = torch.tensor([sample["x"]], dtype=F64)
    return torch.cat([x, torch.rand(3, dtype=F64, generator=rng)])


def random_on_row_3(row: torch.Tensor) -> torch.Tensor:
    """Draws from Python's random on row 3 only (not on row 0, the first of a run)."""
    extra = random.random() if int(row[0]) == 3 else 0.0
    return torch.cat([row[:1], torch.rand(2, dtype=F64), torch.tensor([extra], dtype=F64)])


def fails_on_5(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) == 5:
        raise ValueError("row 5 is bad")
    return torch_draw(row)


def state_draw(row: torch.Tensor, *, state: dict[str, float]) -> torch.Tensor:
    return torch_draw(row) + state["offset"]


def state_rng_draw(
    row: torch.Tensor, *, state: dict[str, float], rng: torch.Generator
) -> torch.Tensor:
    return rng_draw(row, rng) + state["offset"]


def slow_random(row: torch.Tensor) -> torch.Tensor:
    """A few milliseconds a row: enough for auto to weigh threads and processes."""
    time.sleep(0.003)
    return random_draw(row)


def slow_rng(row: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    time.sleep(0.003)
    return rng_draw(row, rng)


#: the rows each call of counted_draw saw (threads run in this process)
CALLS: list[int] = []


def counted_draw(row: torch.Tensor) -> torch.Tensor:
    CALLS.append(int(row[0]))
    return torch_draw(row)


def _twin_draw_batch(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:, :1], torch.rand(len(x), 3, dtype=F64)], dim=1)


@prep.rowwise(batched=_twin_draw_batch)
def twin_draw(row: torch.Tensor) -> torch.Tensor:
    """A random function with a batched twin: vectorized would run it, were it not seeded."""
    return torch_draw(row)


def double(row: torch.Tensor) -> torch.Tensor:
    """No draw at all: vmap runs it, were it not seeded."""
    return row * 2


# ---------------------------------------------------------------- the reference


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """The three global generators put back afterwards (the loop is no part of a test's
    caller state)."""
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    try:
        yield
    finally:
        torch.set_rng_state(before[0])
        random.setstate(before[1])
        np.random.set_state(before[2])


def takes_rng(fn: Callable[..., Any]) -> bool:
    return "rng" in inspect.signature(fn).parameters


def seed_row(s: int) -> None:
    """Seed every global generator for one row (seeding one a function does not draw
    from changes nothing it returns)."""
    torch.random.default_generator.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


def loop(fn: Callable[..., Any], items: Any, seed: int, **kwargs: Any) -> torch.Tensor:
    """What ``seed=`` promises: row ``i`` drawn from generators seeded with
    ``mix(seed, i)``, the results stacked."""
    out = []
    with generators_kept():
        for i, item in enumerate(items):
            s = mix(seed, i)
            if takes_rng(fn):
                rng = torch.Generator()
                rng.manual_seed(s)
                out.append(fn(item, rng=rng, **kwargs))
            else:
                seed_row(s)
                out.append(fn(item, **kwargs))
    return torch.stack(out)


def stream_loop(fn: Callable[..., Any], batches: list[Any], seed: int) -> list[torch.Tensor]:
    """A stream's batch ``k``: the loop under ``mix(seed, k)``."""
    return [loop(fn, batch, mix(seed, k)) for k, batch in enumerate(batches)]


def batch(n: int = ROWS, start: int = 0) -> torch.Tensor:
    """Rows whose first value is their number (``start`` on), float64 throughout."""
    return torch.arange(start, start + n, dtype=F64).repeat_interleave(4).view(n, 4)


def exact(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def distinct(rows: torch.Tensor) -> int:
    """How many different draws (the part of each row after its number)."""
    return len({tuple(r[1:].tolist()) for r in rows})


def refusal(executor: str, fn: Callable[..., Any]) -> str | None:
    """The words of the ConfigError ``executor`` must give ``fn`` under ``seed=``, from
    its traits (on threads, at the function's first draw); None where it must return
    the loop's rows."""
    traits = prep.EXECUTORS[executor].traits
    if not traits.per_row:
        return "cannot be seeded row by row"
    if traits.shares_generators and not takes_rng(fn):
        return "rng"
    return None


def states() -> tuple[torch.Tensor, Any, Any]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def same_states(a: tuple[torch.Tensor, Any, Any], b: tuple[torch.Tensor, Any, Any]) -> bool:
    na, nb = a[2], b[2]
    numpy_same = na[0] == nb[0] and np.array_equal(na[1], nb[1]) and na[2:] == nb[2:]
    return torch.equal(a[0], b[0]) and a[1] == b[1] and bool(numpy_same)


def test_the_reference_draws_differ_by_row_and_seed():
    """The loop is a reference worth matching: every row draws anew, and another seed
    draws other numbers (so a match cannot come from constant or unseeded draws)."""
    for fn in FNS.values():
        ref = loop(fn, batch(), SEED)
        assert distinct(ref) == ROWS
        assert exact(ref, loop(fn, batch(), SEED))
        assert not torch.equal(ref[:, 1:], loop(fn, batch(), SEED + 1)[:, 1:])
    assert exact(loop(torch_draw, batch(), SEED)[:, 1:], loop(rng_draw, batch(), SEED)[:, 1:])


# ---------------------------------------------------------------- map_rows


# the first batch of a named executor in other interpreters is checked against serial:
# seeded rows agree, so no "computed differently" warning may come
@pytest.mark.filterwarnings("error")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("executor", registry.EVERY)
def test_map_rows_gives_the_loops_rows_or_is_refused(executor, workers):
    x = batch()
    with prep.Pool(executor, workers=workers) as pool:
        for name, fn in FNS.items():
            words = refusal(executor, fn)
            if words is not None:
                with pytest.raises(prep.ConfigError, match=words):
                    pool.map_rows(fn, x, seed=SEED)
                continue
            want = loop(fn, x, SEED)
            assert exact(pool.map_rows(fn, x, seed=SEED), want), name
            # again, on workers that are up and have run seeded rows
            assert exact(pool.map_rows(fn, x, seed=SEED), want), name
            assert exact(pool.map_rows(fn, x, seed=SEED + 1), loop(fn, x, SEED + 1)), name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_map_rows_through_the_shared_pools(no_leaks, executor):
    x = batch()
    for fn in FNS.values():
        got = prep.map_rows(fn, x, executor=executor, workers=2, seed=SEED)
        assert exact(got, loop(fn, x, SEED))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [0, -5, 2**70])
def test_any_int_is_a_seed(seed):
    """0 is a seed like any other (not "no seed"), and so are negative and big ints."""
    x = batch(8)
    for fn in (torch_draw, random_draw, rng_draw):
        assert exact(prep.map_rows(fn, x, executor="serial", seed=seed), loop(fn, x, seed))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_a_failed_row_keeps_the_others_keys(executor):
    """on_error='fill': the rows around a failed one are still the loop's."""
    x = batch(12)
    want = loop(torch_draw, x, SEED)
    with prep.Pool(executor, workers=2) as pool, pytest.warns(RuntimeWarning, match="failed"):
        got, valid = pool.map_rows(
            fails_on_5, x, seed=SEED, on_error="fill", fill=-1.0, return_valid=True
        )
    assert valid.tolist() == [i != 5 for i in range(12)]
    assert exact(got[valid], want[valid])
    assert (got[5] == -1).all()


# ---------------------------------------------------------------- map_samples


@pytest.mark.filterwarnings("error")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", registry.EVERY)
def test_map_samples_gives_the_loops_rows_or_is_refused(executor):
    samples = [{"x": float(i)} for i in range(ROWS)]
    with prep.Pool(executor, workers=2) as pool:
        for fn in (sample_draw, sample_rng_draw):
            words = refusal(executor, fn)
            if words is not None:
                # a batched form refuses a list of samples too: either refusal will do
                batched = not prep.EXECUTORS[executor].traits.per_row
                with pytest.raises(prep.ConfigError, match=None if batched else words):
                    pool.map_samples(fn, samples, seed=SEED)
                continue
            want = loop(fn, samples, SEED)
            assert distinct(want) == ROWS
            assert exact(pool.map_samples(fn, samples, seed=SEED), want)
            assert exact(pool.map_samples(fn, samples, seed=SEED), want)


# ---------------------------------------------------------------- streams

#: (executor, strategy, prefetch): whole batches need prefetch >= 1
STREAMS = [
    (ex, how, prefetch)
    for ex in ("processes", "threads", "auto")
    for how, prefetch in (("split", 0), ("split", 2), ("whole", 2))
] + [("processes", "auto", 2)]


def stream_batches(n: int = 5, rows: int = 8) -> list[torch.Tensor]:
    """Batch k's rows numbered from 100 k: a batch out of order shows."""
    return [batch(rows, start=100 * k) for k in range(n)]


@pytest.mark.filterwarnings("error")
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "how", "prefetch"), STREAMS)
def test_imap_batch_k_is_the_loop_under_mix_of_seed_and_k(executor, how, prefetch):
    batches = stream_batches()
    with prep.Pool(executor, workers=2) as pool:
        for name, fn in FNS.items():
            words = refusal(executor, fn)
            if words is not None:
                with pytest.raises(prep.ConfigError, match=words):
                    list(pool.imap(fn, batches, strategy=how, prefetch=prefetch, seed=SEED))
                continue
            want = stream_loop(fn, batches, SEED)
            for _ in range(2):  # a second stream numbers its batches from 0 again
                got = list(pool.imap(fn, batches, strategy=how, prefetch=prefetch, seed=SEED))
                assert len(got) == len(want)
                for k, (g, w) in enumerate(zip(got, want)):
                    assert exact(g, w), (name, k)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_imap_samples_batch_k_is_the_loop_under_mix_of_seed_and_k(executor):
    batches = [[{"x": float(100 * k + i)} for i in range(6)] for k in range(4)]
    with prep.Pool(executor, workers=2) as pool:
        for fn in (sample_draw, sample_rng_draw):
            if refusal(executor, fn) is not None:
                continue
            got = list(pool.imap_samples(fn, batches, strategy="split", prefetch=2, seed=SEED))
            for g, w in zip(got, stream_loop(fn, batches, SEED), strict=True):
                assert exact(g, w)


# ---------------------------------------------------------------- the caller's generators


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["serial", "processes", "auto"])
def test_the_callers_generators_are_as_they_were(executor):
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    before = states()
    x = batch(12)
    with prep.Pool(executor, workers=2) as pool:
        for fn in FNS.values():
            pool.map_rows(fn, x, seed=SEED)
            assert same_states(states(), before), f"map_rows {fn.__name__}"
            for how in ("split", "whole") if executor != "serial" else ("split",):
                list(pool.imap(fn, stream_batches(3, 6), strategy=how, prefetch=2, seed=SEED))
                assert same_states(states(), before), f"imap {how} {fn.__name__}"
            pool.map_samples(sample_draw, [{"x": 1.0}] * 6, seed=SEED)
            assert same_states(states(), before), "map_samples"


# ---------------------------------------------------------------- refusals


@pytest.mark.timeout(60)
def test_threads_stop_a_global_function_at_its_first_draw():
    """Nothing seeds the global generators on threads: a row that drew from them stops
    its thread's run of rows before the next row, in one line naming the fix."""
    CALLS.clear()
    with prep.Pool("threads", workers=1) as pool:
        with pytest.raises(prep.ConfigError, match="rng") as caught:
            pool.map_rows(counted_draw, batch(), seed=SEED)
        assert "threads" in str(caught.value) and len(str(caught.value).splitlines()) == 1
        assert len(CALLS) < ROWS, "stopped at the draw, not at the end"
        for how, prefetch in (("split", 0), ("split", 2), ("whole", 2)):
            with pytest.raises(prep.ConfigError, match="rng"):
                list(pool.imap(counted_draw, stream_batches(2), strategy=how,
                               prefetch=prefetch, seed=SEED))  # fmt: skip
        with pytest.raises(prep.ConfigError, match="rng"):
            prep.map_rows(counted_draw, batch(), executor="threads", workers=2, seed=SEED)
        # without seed= the same function runs on threads as before
        CALLS.clear()
        assert len(pool.map_rows(counted_draw, batch(4))) == 4
    assert sorted(CALLS) == [0, 1, 2, 3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "executor", [n for n in registry.EVERY if not prep.EXECUTORS[n].traits.per_row]
)
def test_a_batched_executor_refuses_seed(executor):
    # functions it runs without seed=: a twin for vectorized, no draw for vmap
    fn = twin_draw if prep.EXECUTORS[executor].traits.calls_twin else double
    x = batch(8)
    with prep.Pool(executor) as pool:
        assert len(pool.map_rows(fn, x)) == 8
        with pytest.raises(prep.ConfigError, match="cannot be seeded row by row"):
            pool.map_rows(fn, x, seed=SEED)
        with pytest.raises(prep.ConfigError, match="cannot be seeded row by row"):
            list(pool.imap(fn, stream_batches(2), prefetch=0, seed=SEED))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [True, False, 1.5, "7", 7.0])
def test_a_seed_that_is_not_an_int_is_a_type_error_naming_seed(bad):
    x = batch(4)
    calls = [
        lambda: prep.map_rows(torch_draw, x, executor="serial", seed=bad),
        lambda: prep.map_samples(sample_draw, [{"x": 1.0}], executor="serial", seed=bad),
    ]
    with prep.Pool("serial") as pool:
        calls += [
            lambda: pool.map_rows(torch_draw, x, seed=bad),
            lambda: pool.map_samples(sample_draw, [{"x": 1.0}], seed=bad),
            lambda: list(pool.imap(torch_draw, [x], seed=bad)),
            lambda: list(pool.imap_samples(sample_draw, [[{"x": 1.0}]], seed=bad)),
        ]
        for call in calls:
            with pytest.raises(TypeError, match=r"seed="):
                call()


# ---------------------------------------------------------------- without seed=


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_without_seed_draws_are_unseeded(executor):
    """Nothing of seed= leaks into the default path: rows draw anew, call after call,
    also after a seeded call on the same workers."""
    x = batch()
    with prep.Pool(executor, workers=2) as pool:
        for name in GLOBAL:
            fn = FNS[name]
            seeded = pool.map_rows(fn, x, seed=SEED)
            first, second = pool.map_rows(fn, x), pool.map_rows(fn, x)
            assert distinct(first) == ROWS and distinct(second) == ROWS, name
            assert distinct(torch.cat([first, second, seeded])) == 3 * ROWS, name
            for i in range(ROWS):  # no unseeded row is a seeded row's (under any key)
                assert not torch.equal(first[i], seeded[i])


@pytest.mark.timeout(120)
def test_a_seeded_call_leaves_the_workers_generators_as_they_were():
    """A worker's generators are put back after its seeded rows: what it draws next,
    unseeded, is its own stream, not the continuation of the last seeded row's (which
    would be the same in every pool)."""
    after: list[list[torch.Tensor]] = []
    for _ in range(2):
        torch.rand(1)  # another caller state: workers started from other seeds
        with prep.Pool("processes", workers=1) as pool:
            drawn = []
            for name in GLOBAL:
                pool.map_rows(FNS[name], batch(8), seed=SEED)
                drawn.append(pool.map_rows(FNS[name], batch(8)))
            after.append(drawn)
    for name, a, b in zip(GLOBAL, *after, strict=True):
        assert not torch.equal(a, b), name


# ---------------------------------------------------------------- a later row's draw


@pytest.mark.timeout(60)
def test_a_draw_from_random_on_a_later_row_only_is_an_error_naming_rng():
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    before = states()
    with pytest.raises(RuntimeError, match="rng") as caught:
        prep.map_rows(random_on_row_3, batch(8), executor="serial", seed=SEED)
    assert "random" in str(caught.value)
    assert same_states(states(), before), "the caller's generators put back after the error"
    # the same function drawing on row 0 too is seeded and matches the loop
    x = batch(8, start=3)
    assert exact(prep.map_rows(random_on_row_3, x, executor="serial", seed=SEED),
                 loop(random_on_row_3, x, SEED))  # fmt: skip


# ---------------------------------------------------------------- setup= and seed=


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_setup_and_seed_together(executor):
    x, state = batch(), statefns.offset_state()
    with prep.Pool(executor, workers=2, setup=statefns.offset_state) as pool:
        for fn in (state_draw, state_rng_draw):
            want = loop(fn, x, SEED, state=state)
            assert exact(pool.map_rows(fn, x, seed=SEED), want), fn.__name__
            got = list(pool.imap(fn, stream_batches(3), prefetch=2, seed=SEED))
            for k, (g, b) in enumerate(zip(got, stream_batches(3), strict=True)):
                assert exact(g, loop(fn, b, mix(SEED, k), state=state)), (fn.__name__, k)


# ---------------------------------------------------------------- auto


@pytest.mark.timeout(120)
def test_auto_leaves_threads_and_batched_forms_out_for_a_global_function():
    x = batch(64)
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(3):  # later batches may run on processes once they are up
            assert exact(pool.map_rows(slow_random, x, seed=SEED), loop(slow_random, x, SEED))
        dropped = pool.explain().dropped
    assert "seed=" in dropped.get("threads", ""), dropped
    assert "seed=" in dropped.get("vmap", ""), dropped


@pytest.mark.timeout(120)
def test_auto_may_use_threads_for_a_function_that_takes_rng():
    x = batch(64)
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(2):
            assert exact(pool.map_rows(slow_rng, x, seed=SEED), loop(slow_rng, x, SEED))
        dropped = pool.explain().dropped
    assert "threads" not in dropped, dropped
    assert "seed=" in dropped.get("vmap", ""), dropped


@pytest.mark.timeout(60)
def test_explain_with_seed_says_what_auto_leaves_out():
    dropped = prep.explain(slow_random, batch(64), workers=2, seed=SEED).dropped
    assert "seed=" in dropped.get("vmap", ""), dropped
    assert "seed=" in dropped.get("threads", ""), dropped


@pytest.mark.parametrize("kind", ["tensors", "samples"])
def test_autos_probe_of_later_rows_draws_under_their_own_keys(kind):
    """What auto compares a pool's rows with: serial's rows ``start, start + 1`` of the
    batch, computed here; under seed= those are the loop's rows, keyed by their index."""
    from prep.core.rows import rows_of, samples_of
    from prep.core.seeding import Seeding
    from prep.core.trust import Probe

    if kind == "tensors":
        items, fn = batch(), torch_draw
        rows = rows_of(items)
    else:
        items, fn = [{"x": float(i)} for i in range(ROWS)], sample_draw
        rows = samples_of(items)
    start = 10
    probe = Probe.take(fn, rows.seeding(Seeding(SEED)).window(start, ROWS))
    assert probe is not None
    want = loop(fn, items, SEED)
    for i, result in enumerate(probe.results):
        assert result is not None
        assert exact(result[1][0], want[start + i]), start + i
