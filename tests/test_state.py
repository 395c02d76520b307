"""``setup=``: per-worker state, built once where each worker runs."""

from __future__ import annotations

import functools
import os
import threading

import pytest
import torch

import prep
from prep.executors import available_cores
from tests import registry, statefns
from tests.conftest import wait_until
from tests.registry import NO_TWIN, PER_ROW_ERRORS, PROCESSES, READS_VALUES, STATE

pytestmark = pytest.mark.timeout(120)


def rows(n: int = 32) -> torch.Tensor:
    return torch.arange(n).view(n, 1)


#: statefns.where reads values and has no twin: the executors that refuse these cases
#: are tested in tests/test_refusals_registry.py
SETUPS = registry.executors(NO_TWIN, READS_VALUES, STATE)
#: the executors that run rows in the caller's own process (a setup there may be a closure)
IN_PROCESS = [e for e in SETUPS if e in registry.without(PROCESSES)]


@pytest.mark.parametrize("executor", SETUPS)
def test_setup_runs_once_per_worker_and_the_state_is_kept(no_leaks, executor):
    with prep.Pool(executor, workers=2, setup=statefns.make_tracked) as pool:
        first = pool.map_rows(statefns.where, rows())
        second = pool.map_rows(statefns.where, rows())
    assert torch.equal(first[:, 3], rows().flatten()) and torch.equal(
        second[:, 3], rows().flatten()
    )
    states = {tuple(r[:3].tolist()) for r in torch.cat([first, second])}
    # one state per worker over both batches: the second reuses what the first built. (Not
    # "the second's states are the first's": on a busy machine one worker may take every
    # part of the first batch, and the other then builds its one state in the second.)
    assert len(states) == len({(pid, thread) for pid, thread, _ in states}) <= 2
    pids = [pid for pid, _, _ in states]
    if executor == "serial":
        assert len(states) == 1  # one per pool
    elif executor == "threads":  # one per thread, each thread its own
        threads = {(pid, thread) for pid, thread, _ in states}
        assert len(states) == len(threads) <= 2 and {p for p, _ in threads} == {os.getpid()}
    elif executor in registry.executors(PROCESSES):  # one per worker process, not ours
        assert len(set(pids)) == len(pids) and os.getpid() not in pids
    else:  # wherever it runs: in this process, or one state per worker process
        assert set(pids) == {os.getpid()} or (
            len(set(pids)) == len(pids) and os.getpid() not in pids
        )


def test_threads_each_see_their_own_state():
    seen: dict[int, set[int]] = {}

    def record(row: torch.Tensor, *, state: statefns.Tracked) -> torch.Tensor:
        seen.setdefault(threading.get_ident(), set()).add(id(state))
        return row.clone()

    with prep.Pool("threads", workers=2, setup=statefns.make_tracked) as pool:
        for _ in range(3):
            pool.map_rows(record, rows(64))
    assert all(len(ids) == 1 for ids in seen.values())  # a thread keeps its state
    assert len({next(iter(ids)) for ids in seen.values()}) == len(seen)  # none shared


@pytest.mark.parametrize("executor", IN_PROCESS)
def test_states_are_closed_when_the_pool_closes(executor):
    made: list[statefns.Tracked] = []

    def setup() -> statefns.Tracked:
        made.append(statefns.Tracked())
        return made[-1]

    pool = prep.Pool(executor, workers=2, setup=setup)
    pool.map_rows(statefns.where, rows())
    assert made and not any(s.closed for s in made)
    pool.close()
    assert all(s.closed for s in made)


@pytest.mark.parametrize("executor", [e for e in SETUPS if e in registry.executors(PROCESSES)])
def test_worker_processes_close_their_states_as_they_stop(no_leaks, executor, tmp_path):
    setup = functools.partial(statefns.Tracked, str(tmp_path))
    with prep.Pool(executor, workers=2, setup=setup) as pool:
        out = pool.map_rows(statefns.where, rows())
    pids = {int(p) for p in out[:, 0].tolist()}
    assert wait_until(lambda: {int(f.name.split("-")[0]) for f in tmp_path.iterdir()} >= pids)


@pytest.mark.parametrize(
    "executor", registry.executors(NO_TWIN, READS_VALUES, STATE, PER_ROW_ERRORS)
)
def test_a_failing_setup_names_setup_and_a_new_pool_works(no_leaks, executor):
    bad = prep.Pool(executor, workers=2, setup=statefns.broken_setup)
    with bad, pytest.raises(prep.ConfigError, match="setup=broken_setup raised RuntimeError"):
        bad.map_rows(statefns.where, rows(), on_error="fill")  # not a row error either
    with prep.Pool(executor, workers=2, setup=statefns.make_tracked) as pool:
        assert pool.map_rows(statefns.where, rows()).shape == (32, 4)


def test_map_rows_keeps_a_warm_state_per_setup():
    a = prep.map_rows(statefns.where, rows(), executor="serial", setup=statefns.make_tracked)
    b = prep.map_rows(statefns.where, rows(), executor="serial", setup=statefns.make_tracked)
    assert torch.equal(a[:, 2], b[:, 2])  # the same state both times
    prep.shutdown()


def test_setup_must_be_callable():
    with pytest.raises(TypeError, match="setup=3 is not callable"):
        prep.Pool("serial", setup=3)


def test_collate_passes_setup():
    collate = prep.Collate(statefns.where, executor="serial", setup=statefns.make_tracked)
    out = collate([torch.tensor([5]), torch.tensor([6])])
    assert out[:, 3].tolist() == [5, 6]
    collate.close()


@pytest.mark.skipif(available_cores() < 2, reason="auto weighs processes on 2+ cores only")
def test_auto_counts_setup_once_a_worker_in_a_pools_start(monkeypatch):
    """setup= measured at 2 s (injected) makes a pool's start 2 x 2 s more, and explain
    says so; the start itself is injected too, so the test does not depend on speed."""
    from prep.auto.models import ProcessesModel
    from prep.core.state import WorkerState

    monkeypatch.setattr(ProcessesModel, "start_cost", classmethod(lambda cls, ex: 0.3))
    real_get = WorkerState.get

    def slow_get(self):
        state = real_get(self)
        self.seconds = 2.0
        return state

    monkeypatch.setattr(WorkerState, "get", slow_get)
    from tests.test_auto import gil_5ms

    def fn(row, *, state):
        return gil_5ms(row)

    with prep.Pool("auto", workers=2, setup=statefns.make_tracked) as pool:
        for _ in range(3):
            pool.map_rows(fn, torch.arange(64.0).view(64, 1))
        (cal,) = pool.choices()
    assert cal.setup_seconds == 2.0 and cal.start["processes"] == pytest.approx(0.3 + 2 * 2.0)
    assert "processes" not in cal.started  # three batches of ~0.16 s saved cannot pay 4.3 s
    assert "setup= takes 2,000.0 ms here" in str(cal)
