"""One engine: a Pool's batches, streams and crash isolation run on one set of workers.

``map_rows`` on ``processes`` or ``threads`` is a stream of one batch: its parts are
tickets on the same workers a stream keeps several batches in flight on. Each
test compares with a reference it builds itself (a plain loop, ``torch.stack``).
"""

from __future__ import annotations

import os

import pytest
import torch

import prep
from tests import rowfns

pytestmark = pytest.mark.timeout(120)


def pid_row(row: torch.Tensor) -> torch.Tensor:
    """The row, and the process that computed it."""
    return torch.cat([row, torch.tensor([float(os.getpid())])])


def worker_pids(out: torch.Tensor) -> set[int]:
    return {int(p) for p in out[:, -1].tolist()}


# a worker's pid is not serial's: the check of other interpreters says so, as it must
@pytest.mark.filterwarnings("ignore:executor=.* computed row 0 of:RuntimeWarning")
def test_a_process_pool_runs_map_rows_and_streams_on_the_same_workers(no_leaks):
    x = torch.arange(32.0).view(16, 2)
    want = torch.stack([torch.cat([r, torch.zeros(1)]) for r in x])
    seen: set[int] = set()
    with prep.Pool("processes", workers=2) as pool:
        out = pool.map_rows(pid_row, x)
        seen |= worker_pids(out)
        for strategy in ("split", "whole"):
            for got in pool.imap(pid_row, [x] * 4, strategy=strategy):
                assert torch.equal(got[:, :2], want[:, :2])
                seen |= worker_pids(got)
        collate = pool.map_samples(lambda s: pid_row(s), list(x))
        seen |= worker_pids(collate)
        workers = set(pool._get("processes").engine.pids)
        assert len(workers) == 2 and workers == set(pool._get("processes").engine.pids)
    assert seen <= workers and os.getpid() not in seen


def test_a_thread_pool_runs_map_rows_and_streams_on_the_same_threads():
    import threading

    names: set[str] = set()

    def named(row: torch.Tensor) -> torch.Tensor:
        names.add(threading.current_thread().name)
        return row * 2

    x = torch.arange(64.0).view(32, 2)
    with prep.Pool("threads", workers=2) as pool:
        assert torch.equal(pool.map_rows(named, x), x * 2)
        for strategy in ("split", "whole"):
            for got in pool.imap(named, [x] * 3, strategy=strategy):
                assert torch.equal(got, x * 2)
        threads = {t.name for t in pool._get("threads").engine._threads}
    assert len(threads) == 2 and names <= threads


def test_a_worker_that_forgot_a_function_is_sent_it_again(no_leaks):
    # a worker keeps a few functions; a sixth evicts the first, which must travel again
    x = torch.arange(8.0).view(8, 1)
    adders = [lambda r, k=k: r + k for k in range(6)]
    with prep.Pool("processes", workers=2) as pool:
        for _ in range(2):
            for k, add in enumerate(adders):
                assert torch.equal(pool.map_rows(add, x), x + k)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crash_under_fill_is_isolated_on_the_same_workers(no_leaks, workers):
    x = torch.arange(6.0).view(6, 1)
    with prep.Pool("processes", workers=workers) as pool:
        pool.map_rows(rowfns.affine, x)
        before = len(pool._get("processes").engine.pids)
        with pytest.warns(RuntimeWarning, match="1 of 6 rows failed"):
            out, valid = pool.map_rows(
                rowfns.suicide, x, on_error="fill", fill=-1, return_valid=True
            )
        want = torch.stack([r if int(r[0]) != 1 else torch.full_like(r, -1.0) for r in x])
        assert torch.equal(out, want)
        assert valid.tolist() == [True, False, True, True, True, True]
        assert len(pool._get("processes").engine.pids) == before  # no second pool


def test_a_worker_found_dead_while_sending_is_replaced(no_leaks, monkeypatch):
    import signal

    from tests.conftest import wait_until

    x = torch.arange(8.0).view(8, 1)
    with prep.Pool("processes", workers=2) as pool:
        pool.map_rows(rowfns.affine, x)
        lanes = pool._get("processes").engine._lanes
        proc = lanes.all[0].worker.proc
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not proc.is_alive(), 10)
        # as if it died after the pool last looked: the next message meets a broken pipe
        monkeypatch.setattr(proc, "is_alive", lambda: True)
        assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)
        assert lanes.all[0].worker.proc is not proc


def cut(row: torch.Tensor) -> torch.Tensor:
    """The row's first value is the result's width: a shape that changes with the data."""
    return row[: int(row[0])]


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_map_rows_and_streams_learn_one_output_shape_and_drop_a_wrong_guess(executor):
    # wide enough that a guessed output is made for the workers to write in place
    a, b = torch.full((64, 500), 300.0), torch.full((64, 500), 400.0)
    want_a = torch.stack([cut(r) for r in a])
    want_b = torch.stack([cut(r) for r in b])
    with prep.Pool(executor, workers=2) as pool:
        assert torch.equal(pool.map_rows(cut, a), want_a)  # learns 300 wide
        # the stream's first batch is guessed 300 wide from map_rows, proves 400: run again
        got = list(pool.imap(cut, [b, a, b], strategy="split"))
        assert [torch.equal(g, w) for g, w in zip(got, [want_b, want_a, want_b])] == [True] * 3
        assert torch.equal(pool.map_rows(cut, b), want_b)


def test_auto_stops_a_process_pool_no_function_may_use_any_more(tmp_path, monkeypatch, no_leaks):
    """auto drops processes for a function whose rows differ there (a global set at run
    time); with no other function that may use them, the workers are stopped, and the
    answer is still serial's."""
    from prep.auto import wisdom
    from prep.core.policy import RAISE
    from prep.executors import _spawn
    from tests import trustfns

    monkeypatch.setattr(trustfns, "SCALE", 3)  # as main() would; workers import SCALE = 1
    monkeypatch.setenv(wisdom.ENV, str(tmp_path / "wisdom.json"))
    _spawn.ensure_server()  # a known start cost: auto starts the pool within the call
    x = torch.ones(32, 3)
    rows = prep.core.rows.rows_of(x)
    key = wisdom.key(trustfns.scaled, rows.layout(), len(rows), 2, (False, repr(RAISE)))
    assert key is not None
    figures = {"processes": 1e-4, "serial": 1.0, "threads": 1.0}
    assert wisdom.remember(key, {"choice": "processes", "rows": 32, "figures": figures})
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(2):
            assert torch.equal(pool.map_rows(trustfns.scaled, x), x * 3)
        (cal,) = pool.choices()
        assert "processes" in cal.dropped
        processes = pool._get("processes")
        assert processes.engine.pids == [], "the dropped pool's workers are still up"
        # a later batch on them starts them again
        from prep.executors import Job

        out = processes.run(Job.new(torch.neg, rows))
        assert out is not None and torch.equal(out.buffers[0], -x)
        assert len(processes.engine.pids) == 2


def test_prep_forkserver_ends_without_finalizing_torch():
    """The server holds the caller's stderr: it must end as soon as the caller has
    gone, not after finalizing the torch it preloaded (``_server_end``). An exit
    handler registered before the module is imported never runs: the module's
    ``os._exit`` runs first."""
    import subprocess
    import sys

    from prep.executors import _spawn

    assert _spawn.PRELOAD[-1] == "prep.executors._server_end"
    code = (
        "import atexit; atexit.register(print, 'finalized', flush=True); "
        "import prep.executors._server_end; print('imported', flush=True)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["imported"])


def test_row_costs_cut_a_batch_into_as_many_parts_as_pay_for_their_messages():
    from prep.executors import PART_WORK, Known

    f, g = Known("f", shared=True), Known("g", shared=True)
    assert f.parts(64, 4) == 4  # never timed: one part per worker
    f.timed(busy=PART_WORK / 100, rows=10)  # a thousandth of PART_WORK a row
    assert f.parts(64, 4) == 1  # 64 rows: 0.064 PART_WORK, one part
    assert f.parts(2000, 4) == 2  # 2 PART_WORK: two parts
    assert f.parts(100_000, 4) == 4  # never more than the workers
    f.timed(busy=PART_WORK, rows=1)  # the newest batch counts
    assert f.parts(3, 4) == 3
    assert g.parts(3, 4) == 4  # another function: its own figure


# a worker's pid is not serial's: the check of other interpreters says so, as it must
@pytest.mark.filterwarnings("ignore:executor=.* computed row 0 of:RuntimeWarning")
@pytest.mark.parametrize(("per_row", "parts"), [(0.0, 1), (1.0, 2)])
def test_map_rows_on_processes_sends_light_rows_whole_to_one_worker(no_leaks, per_row, parts):
    # the measurement is injected before each batch (a batch then records its own)
    x = torch.arange(32.0).view(16, 2)
    with prep.Pool("processes", workers=2) as pool:
        ex = pool._get("processes")
        known = ex.engine.prepare(pid_row)
        for _ in range(3):
            known.timed(busy=per_row * 16, rows=16)
            out = pool.map_rows(pid_row, x)
            assert torch.equal(out[:, :2], x)
            assert len(worker_pids(out)) == parts


def test_a_function_that_travels_by_name_is_pickled_once_and_a_closure_each_batch(
    monkeypatch,
):
    from prep.executors import _lanes

    pickled: list[object] = []
    real = _lanes.pickle_fn
    monkeypatch.setattr(_lanes, "pickle_fn", lambda fn: pickled.append(fn) or real(fn))
    scale = torch.tensor(2.0)

    def closure(row: torch.Tensor) -> torch.Tensor:
        return row * scale

    fns = _lanes.Functions()
    keys = {fns.add(f).key for f in [torch.neg, pid_row, torch.neg, pid_row]}
    assert pickled == [torch.neg, pid_row] and len(keys) == 2
    first = fns.add(closure).key
    scale.fill_(3.0)  # what it captures changed: the workers must see the new value
    assert fns.add(closure).key != first and pickled[2:] == [closure, closure]


def test_a_measurement_on_its_own_intra_op_threads_runs_in_a_daemon_thread():
    # a daemon: Ctrl-C in the caller's join returns at once, and a row that hangs there
    # never blocks the interpreter's exit; the caller's own setting is left as it was
    import threading

    from prep.executors._daemons import on_intra_op_threads

    before = torch.get_num_threads()
    seen = on_intra_op_threads(
        lambda: (threading.current_thread().daemon, torch.get_num_threads()), 1
    )
    assert seen == (True, 1) and torch.get_num_threads() == before
    with pytest.raises(ZeroDivisionError):
        on_intra_op_threads(lambda: 1 / 0, 1)


def test_a_worker_s_parent_watch_sees_live_and_ended_processes():
    # what a worker's watch asks (prep._writers.running): no start time, so a wall clock
    # stepped forward cannot make a live parent look gone
    import subprocess

    from prep._writers import running

    assert running(os.getpid()) and running(os.getppid())
    child = subprocess.Popen(["true"])
    child.wait()
    assert not running(child.pid)
