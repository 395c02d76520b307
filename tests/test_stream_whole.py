"""Streams with several batches in flight: whole batches per worker (``strategy='whole'``),
and ``auto``'s choice between that and splitting each batch (``prep.stream.strategy``).

Mechanics only, never speed: order, values against serial bit for bit, bounds,
errors, crashes, timeouts and stopping, each bounded by a timeout and waiting on
events or counters. The row functions live here, importable by the workers.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import prep
from prep.stream.strategy import (
    StrategyFigures,
    StrategyPlan,
    check_strategy,
    choose_among,
    choose_strategy,
    together,
)
from prep.stream.stream import THREAD_NAME
from tests import refs, registry, rowfns, statefns
from tests.conftest import pool_children, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (pool executor, strategy): every way a stream can run its batches, from the registry
#: (tests/registry.py says which executors refuse strategy='whole', and why)
STRATEGIES = ("split", "whole", "auto")
WHOLE = [(e, "whole") for e in registry.executors(registry.WHOLE)]
#: every way with several batches in flight: whole batches, and a split into parts on
#: the stream's workers (``prep.executors.Parts``)
IN_FLIGHT = [*WHOLE, *((e, "split") for e in registry.executors(registry.PARTS))]


def ways(*needs: str) -> list[tuple[str, str]]:
    """Every (executor, strategy) that runs a row function needing ``needs``."""
    return [
        (e, s)
        for e in registry.executors(*needs)
        for s in STRATEGIES
        if s != "whole" or e in registry.executors(registry.WHOLE)
    ]


def busy_threads() -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name == THREAD_NAME or t.name.startswith("prep-batch")
    ]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert wait_until(lambda: not [t for t in busy_threads() if t.name == THREAD_NAME])


def batch(k: int, rows: int = 4) -> torch.Tensor:
    """Batch k: rows 4k, 4k+1, ... (each row full of its number)."""
    return torch.arange(k * rows, (k + 1) * rows, dtype=torch.float32)[:, None].repeat(1, 3)


def even_batches_nap(row: torch.Tensor) -> torch.Tensor:
    """Rows of even batches take a little longer, so that later batches finish first."""
    if (int(row[0]) // 4) % 2 == 0:
        time.sleep(0.005)
    return row * 2 + 1


def exit_on_9(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) == 9:
        os._exit(3)
    return row * 2 + 1


#: what a hanging row waits for (threads cannot be killed: the test lets it go at its end)
RELEASE = threading.Event()


def hang_on_13(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) == 13:
        RELEASE.wait(3600)
    return row * 2 + 1


def fail_on_9(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) == 9:
        raise ValueError("cannot handle 9")
    return row * 2 + 1


def tokens(sample: int) -> torch.Tensor:
    return torch.arange(sample % 7 + 1) * sample


# ------------------------------------------------------------------ order and values


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), ways(registry.NO_TWIN, registry.READS_VALUES))
def test_results_come_in_order_with_batches_in_flight(executor, strategy, no_leaks):
    batches = [batch(k) for k in range(16)]
    with prep.Pool(executor, workers=2) as pool:
        outs = list(pool.imap(even_batches_nap, batches, strategy=strategy, prefetch=4))
    assert len(outs) == 16
    for out, b in zip(outs, batches):
        assert torch.equal(out, b * 2 + 1)


OPTIONS = [
    {},
    {"pad": -1, "return_lengths": True},
    {"pad": 0, "pad_to": (9,)},
    {"on_error": "fill", "fill": -7, "return_valid": True},
    {"on_error": "skip", "return_valid": True},
    {"pad": -1, "on_error": "fill", "return_lengths": True},
]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def failing(sample: int) -> torch.Tensor:
    if sample % 11 == 5:
        raise ValueError(f"sample {sample} is bad")
    return torch.tensor([sample, sample * sample])


def ragged_failing(sample: int) -> torch.Tensor:
    if sample % 11 == 5:
        raise ValueError(f"sample {sample} is bad")
    return tokens(sample)


def square(sample: int) -> torch.Tensor:
    return torch.tensor([sample, sample * sample])


FNS = {(False, False): square, (True, False): tokens, (False, True): failing}
FNS[True, True] = ragged_failing


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_batches_in_flight_equal_a_loop_bit_for_bit(executor, strategy, options):
    batches = [list(range(k * 6, k * 6 + 6)) for k in range(8)]
    fn = FNS["pad" in options, "on_error" in options]
    warned = pytest.warns if options.get("on_error") else _nothing
    want = [refs.loop(fn, b, **options) for b in batches]  # no prep code
    with prep.Pool(executor, workers=2) as pool, warned():
        got = list(pool.imap_samples(fn, batches, strategy=strategy, **options))
    assert len(got) == len(want)
    assert all(_same(g, w) for g, w in zip(got, want))


class _nothing:
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> None: ...


@pytest.mark.timeout(120)
def test_tuple_dict_results_and_tensor_columns_equal_serial():
    x = torch.arange(40.0).reshape(20, 2)
    y = torch.arange(20.0)
    batches = [(x[k : k + 5], y[k : k + 5]) for k in range(0, 20, 5)]
    named = [{"x": a, "y": b} for a, b in batches]
    with prep.Pool("processes", workers=2) as pool:
        pairs = list(pool.imap(rowfns.pair, batches, strategy="whole"))
        dicts = list(pool.imap(rowfns.named, named, strategy="whole"))
    for (a, b), got in zip(batches, pairs):
        assert _same(got, prep.map_rows(rowfns.pair, (a, b), executor="serial"))
    for d, got in zip(named, dicts):
        assert _same(got, prep.map_rows(rowfns.named, d, executor="serial"))


@pytest.mark.timeout(120)
def test_setup_state_is_built_once_per_worker_process_and_kept():
    batches = [batch(k) for k in range(12)]
    with prep.Pool("processes", workers=2, setup=statefns.make_tracked) as pool:
        outs = list(pool.imap(statefns.where, batches, strategy="whole", prefetch=4))
        whole_pids = set(pool._get("processes").engine.pids)
    seen = {(int(o[0]), int(o[2])) for out in outs for o in out}
    pids = {pid for pid, _ in seen}
    assert pids <= whole_pids and os.getpid() not in pids
    assert len(seen) == len(pids)  # one state per worker process, for every batch
    values = torch.cat([out[:, 3] for out in outs])
    assert values.tolist() == list(range(48))


# ------------------------------------------------------------------ bounds


class Source:
    """Batches 0..n-1, counting how far the pulls ran ahead of the consumer."""

    def __init__(self, n: int) -> None:
        self.n, self.pulled, self.asked, self.most_ahead = n, 0, 0, 0

    def __iter__(self) -> Source:
        return self

    def __next__(self) -> torch.Tensor:
        if self.pulled == self.n:
            raise StopIteration
        self.pulled += 1
        self.most_ahead = max(self.most_ahead, self.pulled - self.asked)
        return batch(self.pulled - 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
@pytest.mark.parametrize("prefetch", [1, 3])
def test_at_most_prefetch_batches_in_flight_and_nothing_kept(executor, strategy, prefetch):
    source = Source(10)
    refs = []
    with prep.Pool(executor, workers=2) as pool:
        stream = pool.imap(rowfns.affine, source, strategy=strategy, prefetch=prefetch)
        for k in range(10):
            source.asked += 1
            out = next(stream)
            assert torch.equal(out, batch(k) * 2 + 1)
            target = min(10, k + 1 + prefetch)
            assert wait_until(lambda: source.pulled == target)  # noqa: B023
            assert source.pulled <= k + 1 + prefetch
            refs.append(weakref.ref(out))
            del out
        with pytest.raises(StopIteration):
            next(stream)
        gc.collect()
        assert wait_until(lambda: all(r() is None for r in refs))  # the stream keeps none
    assert source.most_ahead <= prefetch


# ------------------------------------------------------------------ errors


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
def test_an_error_in_batch_k_leaves_the_next_batches_intact(executor, strategy):
    source = Source(12)
    got = []
    with prep.Pool(executor, workers=2) as pool:
        with pytest.raises(prep.RowError, match="row 1: ValueError: cannot handle 9"):
            for out in pool.imap(fail_on_9, source, strategy=strategy, prefetch=4):
                got.append(out)
        assert [torch.equal(o, batch(k) * 2 + 1) for k, o in enumerate(got)] == [True] * 2
        assert source.pulled <= 2 + 1 + 4  # batch 2 failed; at most prefetch after it began
        # the same pool, a new stream: nothing left over from the batches in flight
        again = list(pool.imap(rowfns.affine, [batch(k) for k in range(6)], strategy=strategy))
    assert all(torch.equal(o, batch(k) * 2 + 1) for k, o in enumerate(again))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["whole", "split"])
def test_a_crashed_worker_fails_its_batch_and_the_pool_goes_on(strategy, no_leaks):
    got = []
    with prep.Pool("processes", workers=2) as pool:
        with pytest.raises(prep.WorkerCrashed, match="died with exit code 3"):
            for out in pool.imap(exit_on_9, Source(10), strategy=strategy, prefetch=4):
                got.append(out)
        assert len(got) == 2
        again = list(pool.imap(rowfns.affine, [batch(k) for k in range(6)], strategy=strategy))
    assert all(torch.equal(o, batch(k) * 2 + 1) for k, o in enumerate(again))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["whole", "split"])
def test_a_crashed_worker_under_fill_is_one_failed_row(strategy, no_leaks):
    warned = pytest.warns(RuntimeWarning, match="1 of 4 rows failed")
    with prep.Pool("processes", workers=2) as pool, warned:
        outs = list(pool.imap(exit_on_9, Source(8), strategy=strategy, prefetch=4, on_error="fill"))
    assert len(outs) == 8
    for k, out in enumerate(outs):
        want = batch(k) * 2 + 1
        if k == 2:
            want[1] = 0  # row 9 killed its worker alone: filled
        assert torch.equal(out, want)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
def test_a_timeout_mid_stream(executor, strategy, no_leaks):
    got = []
    RELEASE.clear()
    try:
        with prep.Pool(executor, workers=2, timeout=5) as pool:
            with pytest.raises(prep.BatchTimeout, match="timeout=5"):
                for out in pool.imap(hang_on_13, Source(10), strategy=strategy, prefetch=4):
                    got.append(out)
            assert len(got) == 3
            again = list(pool.imap(rowfns.affine, [batch(k) for k in range(4)], strategy=strategy))
    finally:
        RELEASE.set()  # the abandoned thread's row returns; the thread retires
    assert all(torch.equal(o, batch(k) * 2 + 1) for k, o in enumerate(again))
    assert wait_until(lambda: not busy_threads())


# ------------------------------------------------------------------ stopping


def _stop_after_two(how: str, pool: prep.Pool, source: Source, strategy: str) -> None:
    stream = pool.imap(even_batches_nap, source, strategy=strategy, prefetch=4)
    if how == "break":
        for k, _ in enumerate(stream):
            if k == 1:
                break
        del stream
    else:
        next(stream), next(stream)
        if how == "close":
            stream.close()
        else:
            del stream
            gc.collect()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
@pytest.mark.parametrize("how", ["break", "close", "del"])
def test_stopping_with_batches_in_flight_leaves_nothing(executor, strategy, how, no_leaks):
    prep.shutdown()  # the warm pools of earlier tests are not this test's business
    before = set(pool_children())
    source = Source(100)
    with prep.Pool(executor, workers=2) as pool:
        _stop_after_two(how, pool, source, strategy)
        assert wait_until(lambda: not [t for t in busy_threads() if t.name == THREAD_NAME])
        assert source.pulled <= 2 + 4
        # the pool serves a new stream at once, its answers not mixed with the dropped ones
        again = list(pool.imap(rowfns.affine, [batch(k) for k in range(6)], strategy=strategy))
    assert all(torch.equal(o, batch(k) * 2 + 1) for k, o in enumerate(again))
    assert wait_until(lambda: not busy_threads())
    assert wait_until(lambda: not set(pool_children()) - before), pool_children()


CTRL_C = """
    import os, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    import torch, prep

    def left():
        return [t.name for t in threading.enumerate()
                if t.name == "prep-imap" or t.name.startswith("prep-batch")]

    def batches():
        for k in range(10_000):
            yield torch.full((8, 2), float(k))

    with prep.Pool({executor!r}, workers=2) as pool:
        try:
            stream = pool.imap(lambda r: r * 2, batches(), strategy={strategy!r})
            for seen, out in enumerate(stream):
                if seen == 1:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(30)
        except KeyboardInterrupt:
            del stream  # the user's last reference: the stream closes as it goes
    end = time.monotonic() + 20
    while left() and time.monotonic() < end:
        time.sleep(0.05)
    print("OK" if not left() else left(), flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), IN_FLIGHT)
def test_ctrl_c_with_batches_in_flight(executor, strategy):
    code = textwrap.dedent(CTRL_C.format(root=ROOT, executor=executor, strategy=strategy))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split("\n")[-1] == "OK", done.stdout + done.stderr


SCRIPT = """
    import sys
    sys.path.insert(0, {root!r})
    import torch, prep

    print("main ran", flush=True)  # workers never run this: it prints once
    scale = 3

    def times_scale(row):
        return row * scale

    batches = [torch.full((5, 2), float(k)) for k in range(8)]
    pool = prep.Pool("processes", workers=2)
    a = list(pool.imap(times_scale, batches, strategy={strategy!r}))
    b = list(pool.imap(lambda r: r + scale, batches, strategy={strategy!r}))
    ok = all(torch.equal(x, k * 3 * torch.ones(5, 2)) for k, x in enumerate(a))
    ok = ok and all(torch.equal(x, (k + 3) * torch.ones(5, 2)) for k, x in enumerate(b))
    pool.close()
    print("OK" if ok else "WRONG", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["whole", "split"])
def test_a_row_function_in_an_unguarded_main_script(tmp_path, strategy):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(root=ROOT, strategy=strategy)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["main", "ran", "OK"], done.stdout + done.stderr


# ------------------------------------------------------------------ choosing


def test_choose_whole_when_it_beats_split_by_the_margin():
    f = StrategyFigures(workers=2, split=10_000, whole_worker=8_000, whole_take=100_000)
    choice = choose_strategy(f)
    assert choice.strategy == "whole"
    assert re.search(
        r"16,000 rows/s .*1\.60x splitting each batch \(10,000 rows/s\)", choice.reason
    )


@pytest.mark.parametrize(
    ("split", "worker", "take", "expected"),
    [
        (10_000, 5_100, 100_000, "split"),  # 10,200 < 1.05 x 10,000
        (10_000, 8_000, 9_000, "split"),  # the stream's thread cannot take them faster
        (10_000, 8_000, 12_000, "whole"),
        (None, 8_000, 12_000, "whole"),
        (10_000, None, None, "split"),
    ],
)
def test_choose_from_injected_figures(split, worker, take, expected):
    f = StrategyFigures(workers=2, split=split, whole_worker=worker, whole_take=take)
    assert choose_strategy(f).strategy == expected


def test_the_plan_trials_split_then_whole_then_keeps_its_choice():
    plan = StrategyPlan("auto", workers=2)
    order = []
    for _ in range(plan.SPLIT_TRIAL):
        order.append(plan.next())
        plan.split_ran(100, 0.01)  # 10,000 rows/s (the first is not counted)
    while plan.choice is None:
        order.append(plan.next())
        plan.whole_taken(100, busy=0.0125, take=0.001)  # 8,000 a worker, 100,000 taken
    assert order[: plan.SPLIT_TRIAL] == ["split"] * plan.SPLIT_TRIAL
    assert set(order[plan.SPLIT_TRIAL :]) == {"whole"}
    assert len(order) == plan.SPLIT_TRIAL + plan.workers + plan.whole_trial
    assert plan.choice.strategy == "whole" and plan.next() == "whole"
    assert "chose whole" in plan.describe()


def test_explain_says_which_strategy_a_stream_took():
    with prep.Pool("threads", workers=2) as pool:
        list(pool.imap(rowfns.affine, [batch(k) for k in range(20)], strategy="auto"))
        text = pool.explain()
    assert re.search(r"stream: strategy='auto' chose (whole|split): ", text), text
    # short streams of one function go on with the same trial, then keep its choice
    with prep.Pool("threads", workers=2) as pool:
        for _ in range(5):
            list(pool.imap(rowfns.affine, [batch(k) for k in range(3)], strategy="auto"))
        text = pool.explain()
    assert re.search(r"strategy='auto' chose (whole|split) \(5 streams of this function\)", text)


@pytest.mark.parametrize(
    ("strategy", "executor", "prefetch", "match"),
    [
        ("fast", "threads", 2, r"strategy='fast' is not one of 'split', 'whole', 'auto'"),
        ("whole", "serial", 2, r"executor='serial' has no workers .* or strategy='split'"),
        ("whole", "threads", 0, r"prefetch=0 runs each batch in your loop's thread"),
    ],
)
def test_a_bad_strategy_says_what_to_pass(strategy, executor, prefetch, match):
    with pytest.raises(prep.ConfigError, match=match):
        check_strategy(strategy, prep.EXECUTORS[executor], 2, prefetch)
    with prep.Pool(executor, workers=2) as pool, pytest.raises(prep.ConfigError, match=match):
        pool.imap(rowfns.affine, [batch(0)], strategy=strategy, prefetch=prefetch)


def test_auto_is_split_where_whole_batches_cannot_help():
    assert check_strategy("auto", prep.EXECUTORS["serial"], 4, 8) == "split"
    assert check_strategy("auto", prep.EXECUTORS["vectorized"], 4, 8) == "split"
    assert check_strategy("auto", prep.EXECUTORS["processes"], 1, 8) == "split"
    assert check_strategy("auto", prep.EXECUTORS["processes"], 4, 1) == "split"
    assert check_strategy("auto", prep.EXECUTORS["processes"], 4, 8) == "auto"


def test_batches_must_be_an_iterable():
    with (
        prep.Pool("threads", workers=2) as pool,
        pytest.raises(TypeError, match=r"^batches must be an iterable .*got int 5$"),
    ):
        pool.imap(rowfns.affine, 5)


# ------------------------------------------------------------------ split: the output's shape


def width_of_batch(row: torch.Tensor) -> torch.Tensor:
    """Rows of batch k return k + 1 values: the shape changes from batch to batch."""
    return torch.full((int(row[0]) // 4 + 1,), float(row[0]))


def odd_row_wider(row: torch.Tensor) -> torch.Tensor:
    """Row 5 returns one value more than the others: a StackError that names it."""
    return torch.zeros(3 if int(row[0]) == 5 else 2)


@pytest.mark.timeout(120)
def test_processes_remember_the_output_shape_and_relearn_it_when_it_changes():
    batches = [batch(k) for k in range(4)]
    with prep.Pool("processes", workers=2) as pool, prep.Pool("serial") as ref:
        for b in batches + batches[::-1]:
            assert _same(pool.map_rows(width_of_batch, b), ref.map_rows(width_of_batch, b))
        pool.map_rows(odd_row_wider, batch(0))  # its shape remembered: 2 values a row
        with pytest.raises(prep.StackError) as got:
            pool.map_rows(odd_row_wider, batch(1))  # rows 4-7: row 5 differs
        with pytest.raises(prep.StackError) as want:
            ref.map_rows(odd_row_wider, batch(1))
    assert str(got.value) == str(want.value)


def test_auto_splits_untimed_while_any_workers_start():
    # prep's forkserver starting takes a core for seconds: a figure taken meanwhile
    # (the first JPEG runs rated threads at half their rate) would decide wrongly
    plan = StrategyPlan("auto", workers=2, flavours=("threads", "processes"))
    got = []
    for _ in range(5):
        got.append(plan.next(ready=False))
        assert not plan.timed
    assert got == ["split"] * 5  # none counts towards the trial
    assert plan.split.submitted == 0 and plan.whole["threads"].submitted == 0
    got = [plan.next() for _ in range(plan.SPLIT_TRIAL)]
    assert got == ["split"] * plan.SPLIT_TRIAL and plan.timed
    assert plan.next() == "whole" and plan.flavour == "threads"
    assert StrategyPlan("whole", workers=2).next(ready=False) == "whole"  # as asked


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i * i])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("executor", "strategy"), WHOLE)
def test_a_dataset_through_a_samplers_index_batches(executor, strategy):
    """The DataLoader-shaped use: a sampler's index batches, the dataset's __getitem__."""
    ds = Squares()
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 8, False)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler)
    with prep.Pool(executor, workers=2) as pool:
        got = list(pool.imap_samples(ds.__getitem__, sampler, strategy=strategy))
    assert len(got) == 5 and all(torch.equal(g, w) for g, w in zip(got, loader))


def test_auto_tries_each_whole_flavour_and_keeps_the_fastest():
    plan = StrategyPlan("auto", workers=2, flavours=("threads", "processes"))
    rates = {"threads": 0.05, "processes": 0.0125}  # busy seconds a batch of 100 rows
    order = []
    for _ in range(plan.SPLIT_TRIAL):
        order.append(plan.next())
        plan.split_ran(100, 0.01)  # 10,000 rows/s
    while plan.choice is None:
        name = plan.next()
        order.append(f"whole on {plan.flavour}")
        assert name == "whole"
        plan.whole_taken(100, busy=rates[plan.flavour], take=0.001, flavour=plan.flavour)
    each = plan.workers + plan.whole_trial
    assert order == ["split"] * 3 + ["whole on threads"] * each + ["whole on processes"] * each
    assert (plan.choice.strategy, plan.choice.flavour) == ("whole", "processes")
    assert re.search(
        r"whole batches on processes: 16,000 rows/s .*on threads: 2,000", plan.describe()
    )
    assert plan.next() == "whole" and plan.flavour == "processes"


def test_choose_among_flavours_from_injected_figures():
    fig = lambda worker: StrategyFigures(2, split=10_000, whole_worker=worker, whole_take=1e6)  # noqa: E731
    assert choose_among({"threads": fig(4_000), "processes": fig(8_000)}).flavour == "processes"
    assert choose_among({"threads": fig(9_000), "processes": fig(8_000)}).flavour == "threads"
    split = choose_among({"threads": fig(5_000), "processes": fig(5_100)})
    assert (split.strategy, split.flavour) == ("split", "")


def test_whole_is_rated_by_what_the_workers_built_together():
    # workers that each report 8,000 rows/s but, sharing the cores, built 9,000 at once
    f = StrategyFigures(2, split=10_000, whole_worker=8_000, whole_take=1e6, whole_together=9_000)
    assert f.whole == 9_000 and choose_strategy(f).strategy == "split"
    assert "9,000 rows/s (as 2 workers built batches at once" in choose_strategy(f).reason


def test_threads_never_seen_together_are_not_assumed_to_share_out_the_gil():
    # the overlap job's trap: a slow training step let each thread run alone, at the
    # serial rate; two of them may take turns at the GIL, so they count as one
    threads = StrategyFigures(
        2, split=10_000, whole_worker=9_000, whole_take=1e6, independent=False
    )
    assert threads.whole == 9_000 and choose_strategy(threads).strategy == "split"
    assert "never seen running together" in choose_strategy(threads).reason
    procs = StrategyFigures(2, split=10_000, whole_worker=9_000, whole_take=1e6)
    assert procs.whole == 18_000
    pick = choose_among({"threads": threads, "processes": procs})
    assert (pick.strategy, pick.flavour) == ("whole", "processes")


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        # two batches of 100 rows over the same second: 200 rows/s together
        ([(0.0, 1.0, 100), (0.0, 1.0, 100)], 200.0),
        # turns at the GIL: each stretched to 2 s when together, 100 rows/s in all
        ([(0.0, 2.0, 100), (0.0, 2.0, 100)], 100.0),
        # one after the other: never together
        ([(0.0, 1.0, 100), (1.0, 2.0, 100), (2.0, 3.0, 100)], None),
        # together a tenth of a batch only: too little to tell
        ([(0.0, 1.0, 100), (0.9, 1.9, 100)], None),
        # together half the time: the rows built in that half, over it
        ([(0.0, 1.0, 100), (0.5, 1.5, 100), (1.5, 2.5, 100)], 200.0),
    ],
)
def test_the_together_rate_counts_only_the_stretches_all_workers_ran(spans, expected):
    got = together(spans, workers=2)
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_plan_rates_whole_batches_from_their_spans():
    plan = StrategyPlan("auto", workers=2, flavours=("threads",))
    for _ in range(plan.SPLIT_TRIAL):
        plan.next()
        plan.split_ran(100, 0.01)  # 10,000 rows/s
    while plan.choice is None:  # pairs of batches running together, 20 ms each
        plan.next()
        start = 100.0 + 0.02 * (plan.whole["threads"].taken // 2)
        span = (start, start + 0.02)
        plan.whole_taken(100, busy=0.02, take=0.0001, flavour="threads", span=span)
    assert plan.all_figures()["threads"].whole_together == pytest.approx(10_000)
    assert plan.choice.strategy == "split"  # 10,000 together: no better than splitting
    taken = plan.whole["threads"].taken
    plan.whole_taken(100, busy=0.02, take=0.0001, flavour="threads", span=(200.0, 200.02))
    assert len(plan.whole["threads"].spans) == plan.whole_trial  # chosen: nothing more is kept
    assert plan.whole["threads"].taken == taken + 1


def hold_row_one_until(path: str, row: torch.Tensor) -> torch.Tensor:
    """Row 1 waits (30 s at most) until ``path`` exists: a batch the test holds."""
    end = time.monotonic() + 30
    while int(row[0]) == 1 and not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)
    return row * 2


@pytest.mark.timeout(120)
def test_a_batch_goes_to_the_worker_that_is_free_even_before_its_reply_is_read(tmp_path):
    import functools

    from prep.core.policy import RAISE
    from prep.executors import ProcessBatches, Whole

    release = tmp_path / "release"
    fn = functools.partial(hold_row_one_until, str(release))
    workers = ProcessBatches(2)
    try:
        key = workers.prepare(fn).key

        def whole(x: torch.Tensor) -> Whole:
            return Whole(key, prep.core.rows.rows_of(x), RAISE, None)

        held, quick = (
            workers.submit(whole(torch.ones(2, 1))),
            workers.submit(whole(torch.zeros(2, 1))),
        )
        assert held.lane is not quick.lane
        # the quick batch's reply waits in its pipe, unread: its worker is free all the same
        assert wait_until(lambda: quick.lane.worker.conn.poll())
        after = workers.submit(whole(torch.full((2, 1), 3.0)))
        assert after.wait(60) and not held.done()  # it did not queue behind the held batch
        assert torch.equal(after.result()[0].buffers[0], torch.full((2, 1), 6.0))
    finally:
        release.touch()
        workers.close()


def test_the_next_flavour_starts_once_the_last_ones_figures_are_in():
    # its workers' start (a process each) must not land in the figures of batches
    # still running on the flavour before it
    plan = StrategyPlan("auto", workers=2, flavours=("threads", "processes"))
    for _ in range(plan.SPLIT_TRIAL):
        plan.next()
        plan.split_ran(100, 0.01)
    sent = [(plan.next(), plan.flavour) for _ in range(7)]  # none taken in yet
    assert sent == [("whole", "threads")] * 7
    for _ in range(plan.workers + plan.whole_trial):
        plan.whole_taken(100, busy=0.01, take=0.001, flavour="threads")
    assert (plan.next(), plan.flavour) == ("whole", "processes")
    plan.whole_taken(100, busy=1.0, take=0.001, flavour="threads")  # one of the extra two
    assert len(plan.whole["threads"].worker_rates) == plan.whole_trial  # not counted


@pytest.mark.timeout(120)
def test_batches_travel_in_reused_shared_memory_and_each_keeps_its_own_values():
    from prep.executors import _ring

    made = []
    real = _ring.Ring._take

    def take(self, nbytes):
        buf = real(self, nbytes)
        made.append(buf)  # held here, so that no freed buffer's address comes back
        return buf

    big = [torch.full((64, 300), float(k)) for k in range(24)]  # 76.8 KB a batch: lent
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_ring.Ring, "_take", take)
        with prep.Pool("processes", workers=2) as pool:
            got = list(pool.imap(rowfns.affine, big, strategy="whole", prefetch=4))
            ring = pool._get("processes").engine._ring
            assert len(ring._idle) <= ring.keep
    assert all(torch.equal(g, b * 2 + 1) for g, b in zip(got, big))  # none overwritten
    assert len(made) == len(big)  # every batch lent a buffer...
    distinct = {b.data_ptr() for b in made}
    assert len(distinct) <= 4 + 2  # ...from a few, reused (prefetch 4, the stream's ends)
