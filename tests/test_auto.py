"""executor="auto": it measures, picks the clear winner, caches, and explains."""

from __future__ import annotations

import ctypes
import functools
import math
import subprocess
import sys
import time
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prep
import prep.api
from prep.executors import available_cores
from prep.ops import side_context_row
from tests import rowfns

pytestmark = pytest.mark.timeout(120)


def gil_5ms(row: torch.Tensor) -> torch.Tensor:
    """GIL-bound whatever the machine's speed: 5 ms in a C call that keeps the GIL
    (``ctypes.PyDLL`` does not release it), so threads cannot overlap its rows and
    two processes halve them, on a fast machine, a slow one or a busy one (a sleep
    needs no CPU); ``int()`` keeps vmap out."""
    ctypes.PyDLL(None).usleep(5000 + 0 * int(row[0]))
    return row.clone()


TWO_CORES = available_cores() >= 2


def waits_2ms(row: torch.Tensor) -> torch.Tensor:
    """Releases the GIL (like I/O); ``float(row[0])`` keeps vmap out."""
    time.sleep(0.002 + 0 * float(row[0]))
    return row * 2


def tiny(row: torch.Tensor) -> torch.Tensor:
    """A few microseconds (about 15 with prep's own cost a row); ``numpy()`` keeps vmap
    out, so only serial and the pools remain."""
    return torch.from_numpy(row.numpy() * 2)


def pure(row: torch.Tensor) -> torch.Tensor:
    """Many small ops a row: one vmapped call of each beats a loop over rows by far."""
    return torch.tanh(row) * row.sin() + row.square().mean()


def side_batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    from benchmarks.workloads import side_context_batch

    return side_context_batch(rows, 64, 16)


KINDS = [
    ("twin", functools.partial(side_context_row, max_len=16), lambda: side_batch(512)),
    ("gil-bound 5 ms", gil_5ms, lambda: torch.arange(128.0).view(128, 1)),
    ("gil-releasing", waits_2ms, lambda: torch.arange(128.0).view(128, 1)),
    ("15 us a row", tiny, lambda: torch.randn(2048, 4)),
    ("vmap-able", pure, lambda: torch.randn(4096, 4)),
]


@pytest.mark.parametrize(("fn", "batch"), [c[1:] for c in KINDS], ids=[c[0] for c in KINDS])
def test_auto_on_each_kind_of_row_function_gives_serials_output(fn, batch):
    """Mechanics: calibration rows and the rest land in one output equal to serial's.
    Which executor wins is the machine's call, measured by scripts/bench_auto.py (the
    decisions themselves are tested below on injected figures)."""
    data = batch()
    with prep.Pool("auto", workers=2) as pool:
        got = pool.map_rows(fn, data)
        (cal,) = pool._get("auto").choices().values()
        assert cal.choice in cal.predicted, str(cal)
        want = prep.map_rows(fn, data, executor="serial")
        assert torch.equal(got, want)


def test_no_row_is_computed_twice_and_the_choice_is_cached():
    calls = []

    def counted(row: torch.Tensor) -> torch.Tensor:
        calls.append(int(row[0]))
        return row * 3

    x = torch.arange(300.0).view(300, 1)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(counted, x), x * 3)
        assert sorted(calls) == list(range(300))  # every row exactly once
        first = pool._get("auto").choices()
        calls.clear()
        pool.map_rows(counted, x)
        assert pool._get("auto").choices() == first  # same signature: no new calibration
        assert sorted(calls) == list(range(300))


def test_recalibrates_when_the_batch_size_changes_4x():
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(tiny, torch.randn(100, 3))
        (cal,) = pool._get("auto").choices().values()
        pool.map_rows(tiny, torch.randn(300, 3))  # 3x: keeps the choice
        assert next(iter(pool._get("auto").choices().values())) is cal
        pool.map_rows(tiny, torch.randn(1000, 3))  # 10x: measures again
        (again,) = pool._get("auto").choices().values()
        assert again is not cal and again.rows == 1000


def test_processes_are_left_out_inside_dataloader_workers(monkeypatch):
    monkeypatch.setattr(prep.api, "in_worker_process", lambda: True)
    cal = prep.explain(gil_5ms, torch.arange(64.0).view(64, 1), workers=2)
    assert "processes" not in cal.predicted
    assert "DataLoader worker" in cal.dropped["processes"]


def test_explain_reads_well():
    cal = prep.explain(waits_2ms, torch.arange(64.0).view(64, 1), workers=2)
    text = str(cal)
    first, second = text.splitlines()[:2]
    assert first.startswith(f"{cal.choice}: ") and first.endswith(".")  # why, in a sentence
    assert second.startswith("auto: 64 rows, 2 workers; calibrated in ")
    assert "serial" in text and "predicted for a whole batch" in text
    assert "choice: " in text.splitlines()[-1]
    assert "vmap" in text  # and why it was not considered


def test_auto_on_samples_and_zero_rows():
    samples = [torch.full((2,), float(i)) for i in range(300)]  # enough to time threads
    got = prep.map_samples(tiny, samples, executor="auto", workers=2)
    assert torch.equal(got, torch.stack([tiny(s) for s in samples]))
    out = torch.empty(0, 3)
    assert prep.map_rows(tiny, torch.empty(0, 3), out=out) is out


def test_a_twin_that_wins_outright_runs_the_batch_in_one_call():
    calls = {"row": 0, "twin": 0}

    def twin(x: torch.Tensor) -> torch.Tensor:
        calls["twin"] += 1
        return x * 2 + 1

    @prep.rowwise(batched=twin)
    def double_plus_one(row: torch.Tensor) -> torch.Tensor:
        calls["row"] += 1
        return row * 2 + 1

    x = torch.randn(512, 8)
    with prep.Pool("auto", workers=2) as pool:
        got = pool.map_rows(double_plus_one, x)
        (cal,) = pool._get("auto").choices().values()
    assert torch.equal(got, x * 2 + 1)
    assert cal.choice == "vectorized" and cal.settled, str(cal)
    # the twin made the whole output; the row function ran on a few rows, once each
    assert calls["twin"] == 1 and 1 <= calls["row"] <= 4


@pytest.mark.skipif(not TWO_CORES, reason="on one core no pool can beat a twin as fast as serial")
def test_a_twin_that_does_not_win_outright_has_the_pools_measured_next_batch():
    def slow_twin(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002 * len(x))  # no faster than the rows, and it releases the GIL
        return x * 2

    @prep.rowwise(batched=slow_twin)
    def doubled(row: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return row * 2

    x = torch.arange(128.0).view(128, 1)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(doubled, x), x * 2)
        (first,) = pool._get("auto").choices().values()
        assert not first.settled and "threads" not in first.speedup, str(first)
        assert torch.equal(pool.map_rows(doubled, x), x * 2)
        (second,) = pool._get("auto").choices().values()
    assert second.settled and "threads" in second.speedup, str(second)
    assert second.choice == "threads", str(second)  # sleeping rows overlap on two threads


@pytest.mark.skipif(not TWO_CORES, reason="processes are left out on one core")
def test_processes_start_after_a_few_batches_in_a_pool(monkeypatch):
    from prep.auto.models import ProcessesModel

    # a pool that costs 0.3 s to start (injected) loses one 64-row batch of 5 ms rows
    # (0.32 s serially, about 0.16 s on two processes) but pays for itself over three
    started = ProcessesModel.start_cost
    monkeypatch.setattr(
        ProcessesModel,
        "start_cost",
        classmethod(lambda cls, ex: 0.3 if not ex.engine.pids else started(ex)),
    )
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(gil_5ms, x), x)
        (cal,) = pool._get("auto").choices().values()
        assert cal.choice != "processes" and "processes" not in cal.started, str(cal)
        assert cal.start["processes"] == 0.3, str(cal)
        for _ in range(4):
            assert torch.equal(pool.map_rows(gil_5ms, x), x)
    assert "processes" in cal.started and cal.choice == "processes", str(cal)
    assert "processes started in" in str(cal) and "paid for it" in str(cal), str(cal)


def test_one_noisy_serial_block_does_not_make_threads_win(monkeypatch):
    """The fastest serial block counts, not the last: rows 16-31 (one of calibration's
    blocks) take 20x longer, as if another process had taken the core. Timed on a
    clock the rows themselves advance, so the figure is exact on any machine."""
    clock = [0.0]

    def hiccup(row: torch.Tensor) -> torch.Tensor:  # int(): no vmap
        clock[0] += 2e-4 if 16 <= int(row[0]) < 32 else 1e-5
        return row + 1

    monkeypatch.setattr(prep.auto.Sample, "now", lambda self: clock[0])
    why = prep.explain(hiccup, torch.arange(2048.0).view(2048, 1), workers=2)
    assert why.serial_row == pytest.approx(1e-5), why


def big_sin(row: torch.Tensor) -> torch.Tensor:
    """Large rows: one vmapped call is no faster than a loop over them."""
    return torch.sin(row)


def test_vmap_runs_the_first_batch_and_the_pools_are_measured_next_if_it_does_not_win(
    monkeypatch,
):
    import prep.auto

    # whether vmap beats serial by more than the cores is the machine's call: say it did not
    from prep.auto.calibrator import Calibrator

    monkeypatch.setattr(Calibrator, "_won_outright", lambda self, per_row=None: False)
    x = torch.randn(32, 256, 1024)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(big_sin, x), torch.sin(x))
        (first,) = pool._get("auto").choices().values()
        # vmap (checked bit for bit against serial) made the whole output in one call
        assert "vmap" in first.batched_rows and first.sample == 32, str(first)
        assert not first.settled and "threads" not in first.speedup, str(first)
        assert torch.equal(pool.map_rows(big_sin, x), torch.sin(x))
        (second,) = pool._get("auto").choices().values()
    assert second.settled and "threads" in second.speedup, str(second)
    assert "vmap" in second.batched_rows, str(second)  # and vmap ran that batch's rest


def test_rows_that_are_nan_under_serial_agree_with_vmap_at_every_check(monkeypatch):
    # one rule for "the same": NaN where serial has NaN agrees, on the first batch's check
    # (vmap_first) and on the later ones (vmap_agrees) alike
    from prep.auto.calibrator import Calibrator

    monkeypatch.setattr(Calibrator, "_won_outright", lambda self, per_row=None: False)
    x = torch.randn(32, 256, 1024)
    x[::3, 0, :5] = math.nan  # NaN in the rows serial measures first, too
    want = torch.sin(x)
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(2):
            got = pool.map_rows(big_sin, x)
            assert torch.allclose(got, want, rtol=0, atol=0, equal_nan=True)
            (cal,) = pool._get("auto").choices().values()
            assert "vmap" in cal.batched_rows and "vmap" not in cal.dropped, str(cal)


@pytest.mark.skipif(not TWO_CORES, reason="processes are left out on one core")
def test_with_the_forkserver_up_a_pool_starts_during_the_first_batch(monkeypatch):
    from prep.auto.models import ProcessesModel

    # with prep's forkserver up, workers start in milliseconds (injected: how many is
    # the machine's call): the rest of the first batch already runs on them
    prep.map_rows(rowfns.affine, torch.ones(2, 1), executor="processes", workers=2)
    started = ProcessesModel.start_cost
    monkeypatch.setattr(
        ProcessesModel,
        "start_cost",
        classmethod(lambda cls, ex: 0.001 if not ex.engine.pids else started(ex)),
    )
    x = torch.arange(48.0).view(48, 1)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(gil_5ms, x), x)
        (cal,) = pool._get("auto").choices().values()
        assert "processes" in cal.started and cal.choice == "processes", str(cal)
        assert len(pool._get("auto")._get("processes").engine.pids) == 2
        assert torch.equal(pool.map_rows(gil_5ms, x), x)
    assert "processes" in cal.observed, str(cal)  # the second batch ran on them, timed


def spread_by_torch(row: torch.Tensor) -> torch.Tensor:
    """Like a torch op that splits each row over torch's intra-op threads: 4 ms of
    work, divided by their number (a wait, so the machine's load does not matter);
    ``float()`` keeps vmap out."""
    time.sleep(0.004 / torch.get_num_threads() + 0 * float(row[0]))
    return row * 2


@pytest.mark.skipif(
    available_cores() < 2 or torch.get_num_threads() < 2,
    reason="needs torch on two cores",
)
def test_processes_do_not_divide_work_that_torch_already_spreads_over_the_cores():
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(spread_by_torch, x), x * 2)
        (cal,) = pool._get("auto").choices().values()
    # serial again on one intra-op thread (each of two workers' share) took twice as long
    assert cal.one_thread_row is not None and cal.serial_cores >= 1.5, str(cal)
    # so two workers do the rows no faster than serial did on two threads
    warm = cal.predicted["processes"]  # a started pool's: the start-up is apart
    assert warm >= cal.predicted["serial"] / 1.3, str(cal)


def test_a_row_function_that_changes_its_row_in_place_runs_once_a_row():
    def twin(x: torch.Tensor) -> torch.Tensor:
        return x.sub_(1)

    @prep.rowwise(batched=twin)
    def dec(row: torch.Tensor) -> torch.Tensor:
        return row.sub_(1)

    def double(row: torch.Tensor) -> torch.Tensor:  # vmap-able, in place
        return row.mul_(2)

    for fn, want in ((dec, lambda x: x - 1), (double, lambda x: x * 2)):
        x = torch.arange(512.0).view(256, 2)
        before = x.clone()
        with prep.Pool("auto", workers=2) as pool:
            got = pool.map_rows(fn, x)
        # calibration's extra runs (serial's timing rows beside a twin, the vmap check)
        # work on copies: every row of the caller's batch changed exactly once
        assert torch.equal(got, want(before)), fn.__name__
        assert torch.equal(x, want(before)), fn.__name__


def test_a_new_function_is_never_taken_for_an_old_one_whose_id_it_reuses():
    x = torch.randn(512, 4)
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(20):  # fresh lambdas: CPython reuses a freed one's address
            assert torch.equal(pool.map_rows(lambda r: torch.tanh(r) * 2, x), torch.tanh(x) * 2)
            # boolean masks break vmap: a cached vmap choice of the other lambda would raise
            got = pool.map_rows(lambda r: r[r > 0].sum().expand(1), x)
            assert torch.equal(got, torch.stack([r[r > 0].sum().expand(1) for r in x]))


class Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self, row: torch.Tensor) -> torch.Tensor:
        return row * self.k

    def apply(self, row: torch.Tensor) -> torch.Tensor:
        return row * self.k + int(row[0] > 0)  # int(): no vmap


def test_a_bound_method_keeps_its_choice_and_two_objects_keep_theirs():
    x = torch.randn(300, 3)
    a, b = Scaler(2.0), Scaler(3.0)
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(a.apply, x)
        first = pool._get("auto").choices()
        pool.map_rows(a.apply, x)  # a new bound-method object, the same function
        assert pool._get("auto").choices() == first
        pool.map_rows(b.apply, x)  # another object: measured on its own
        assert len(pool._get("auto").choices()) == 2


def test_a_small_last_batch_does_not_discard_the_full_batches_choice():
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(tiny, torch.randn(1000, 3))
        (full,) = pool._get("auto").choices().values()
        pool.map_rows(tiny, torch.randn(40, 3))  # 25x smaller: measured on its own
        pool.map_rows(tiny, torch.randn(1000, 3))  # the full size again: its choice kept
        kept = pool._get("auto")._choices[next(iter(pool._get("auto")._choices))][1]
    assert [d.cal.rows for d in kept] == [1000, 40] and kept[0].cal is full


def test_inside_a_dataloader_worker_a_kept_choice_with_processes_is_measured_again(monkeypatch):
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(waits_2ms, x)
        (cal,) = pool._get("auto").choices().values()
        cal.predicted["processes"] = cal.predicted["serial"] / 10  # say they would win
        monkeypatch.setattr(prep.auto.executor, "in_worker_process", lambda: True)
        assert torch.equal(pool.map_rows(waits_2ms, x), x * 2)
        (again,) = pool._get("auto").choices().values()
        assert again is not cal and "processes" not in again.predicted, str(again)
        assert "DataLoader worker" in again.dropped["processes"]
        assert not pool._get("auto")._get("processes").engine.pids  # never started here


# ------------------------------------------------------------ decisions, from numbers
# (Decisions moves a report, d.cal, from figures a test chose)


def _cal(**predicted: float) -> prep.auto.Decisions:
    """Decisions on a report whose predictions a test chose."""
    d = prep.auto.Decisions(prep.auto.Calibration(rows=100, workers=2))
    d.cal.predicted = dict(predicted)
    d.cal.choice = d.best()
    return d


def test_an_unobserved_pool_must_be_predicted_clearly_faster():
    assert _cal(serial=0.100, threads=0.095).cal.choice == "serial"  # within POOL_MARGIN
    assert _cal(serial=0.100, threads=0.050).cal.choice == "threads"
    assert _cal(serial=0.100, vmap=0.095).cal.choice == "vmap"  # no pool: no margin


def test_measured_batches_replace_the_predictions():
    d = _cal(serial=0.100, threads=0.060)
    assert d.cal.choice == "threads"
    for _ in range(3):  # threads turn out slower than predicted (and than serial)
        d.observe("threads", 0.150, 100)
    assert d.cal.choice == "serial" and "threads -> serial" in str(d.cal), str(d.cal)
    d.observe("serial", 0.100, 100)
    assert d.cal.choice == "serial"
    assert d.cal.figure("threads") == pytest.approx(0.150)
    assert d.cal.figure("serial") == pytest.approx(0.100)


def test_observed_batches_of_another_size_are_scaled():
    d = _cal(serial=0.100)
    d.observe("serial", 0.050, 50)  # half the rows in half the time
    assert d.cal.figure("serial") == pytest.approx(0.100)


def test_noise_does_not_make_the_choice_flap():
    d = _cal(serial=0.100, vmap=0.098)
    d.cal.choice = "serial"
    d.observe("serial", 0.100, 100)
    d.observe("vmap", 0.098, 100)  # 2% better: within HYSTERESIS
    assert d.cal.choice == "serial"
    d.observe("vmap", 0.080, 100)
    d.observe("vmap", 0.080, 100)
    assert d.cal.choice == "vmap"


def test_a_close_runner_up_is_tried_once_and_kept_if_it_wins():
    d = _cal(serial=0.100, threads=0.140, vmap=0.500)
    assert d.cal.choice == "serial"
    assert d.next_trial() is None  # the choice runs a whole batch first
    d.observe("serial", 0.100, 100)
    assert d.next_trial() == "threads"  # within TRIAL (1.5x); vmap is not
    d.observe("threads", 0.200, 100)  # its first batch, on a cold pool: not a figure
    assert d.cal.choice == "serial" and "threads" not in d.cal.observed
    assert d.next_trial() == "threads"  # so it runs once more, warm
    d.observe("threads", 0.070, 100)  # a whole batch says threads win after all
    assert d.cal.choice == "threads"
    assert d.next_trial() is None  # every close candidate has been measured


def test_a_trial_that_never_shows_a_figure_is_not_run_forever():
    d = _cal(serial=0.100, threads=0.140)
    d.observe("serial", 0.100, 100)
    for _ in range(2):
        assert d.next_trial() == "threads"
        d.warming.add("threads")  # (as if each of its batches were a warm-up)
        d.observe("threads", 0.3, 100)
    assert d.next_trial() is None and d.cal.choice == "serial"


def test_processes_are_not_a_candidate_until_started_and_loaded():
    d = _cal(serial=0.100, processes=0.040)
    assert d.cal.choice == "serial" and d.next_trial() is None
    d.started("processes", 0.02)
    assert d.cal.choice == "processes"


def test_processes_start_once_their_savings_would_have_paid_for_it():
    d = _cal(serial=0.115, processes=0.050)  # warm, 0.0575 s with POOL_MARGIN
    saving = 0.115 - 0.050 * prep.auto.POOL_MARGIN
    assert d.cal.would_save("processes", 100) == pytest.approx(saving)
    starts = [d.plan_start("processes", 0.2, 100) for _ in range(4)]  # 0.2 s to start them
    assert starts == [False, False, False, True]  # 3 x 57.5 ms < 0.2 s <= 4 x 57.5 ms
    d.started("processes", 0.2)
    assert d.cal.choice == "processes" and "processes started in 200 ms" in str(d.cal)


def test_a_start_that_pays_within_the_batch_happens_at_once():
    d = _cal(serial=1.0, processes=0.5)
    assert d.plan_start("processes", 0.02, 100)  # 20 ms to start, 0.42 s saved on this batch


def test_the_forkserver_starts_at_once_while_serial_leaves_the_other_cores_idle():
    d = _cal(serial=0.100, threads=0.105, processes=0.050)
    d.cal.speedup["threads"] = 0.95  # GIL-bound: threads run no faster than serial
    assert d.plan_warm_up(
        "processes", 1.5, 100
    )  # serial runs on one core: the server costs nothing
    d = _cal(serial=0.100, threads=0.105, processes=0.050)
    d.cal.speedup["threads"] = 1.5  # threads use both cores: the choice may move to them
    assert not d.plan_warm_up("processes", 1.5, 100)


def test_the_forkserver_is_rented_while_another_executor_keeps_every_core_busy():
    d = _cal(serial=0.200, threads=0.100, processes=0.050)
    assert d.cal.choice == "threads"
    saving = d.cal.would_save("processes", 100)  # 100 - 57.5 ms a batch
    starts = [d.plan_warm_up("processes", 1.5, 100) for _ in range(40)]
    assert starts.index(True) == math.ceil(1.5 / saving) - 1
    d = _cal(serial=0.100, processes=0.050)
    d.cal.serial_cores = 2.0  # torch's own threads keep both cores busy under serial
    assert not d.plan_warm_up("processes", 1.5, 100)


def test_the_first_batch_of_a_new_pool_is_not_counted():
    d = _cal(serial=0.100, processes=0.040)
    d.started("processes", 0.02)
    d.observe("processes", 0.900, 100)  # its workers were building a tokenizer
    assert "processes" not in d.cal.observed and d.cal.choice == "processes"
    d.observe("processes", 0.045, 100)
    assert d.cal.figure("processes") == pytest.approx(0.045)


def test_processes_that_would_not_save_anything_never_start():
    d = _cal(serial=0.100, processes=0.095)
    assert not any(d.plan_start("processes", 0.001, 100) for _ in range(100))


@given(
    start=st.floats(0.001, 10.0),
    best_other=st.floats(0.001, 1.0),
    speedup=st.floats(1.0, 8.0),
    batches=st.integers(1, 200),
)
@settings(max_examples=300, deadline=None)
def test_rent_or_buy_never_costs_more_than_about_twice_the_best_in_hindsight(
    start, best_other, speedup, batches
):
    warm = best_other / speedup  # processes, once started
    d = _cal(serial=best_other, processes=warm)
    cost, ready = 0.0, False
    for _ in range(batches):
        if not ready and d.plan_start("processes", start, 100):
            cost, ready = cost + start, True
        cost += warm if ready else best_other
    hindsight = min(batches * best_other, start + batches * warm)
    # POOL_MARGIN (noise) makes it count a saving a little smaller than it is
    assert cost <= 2 * prep.auto.POOL_MARGIN * hindsight + 1e-9


def test_a_dropped_executor_leaves_the_candidates_with_its_reason():
    d = _cal(serial=0.100, processes=0.040)
    d.started("processes", 0.02)
    d.drop("processes", "it failed here: no room")
    assert d.cal.choice == "serial" and "processes" not in d.cal.candidates()
    assert "not considered: processes (it failed here: no room)" in str(d.cal)


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_batches_of_a_few_rows(rows):
    x = torch.randn(rows, 64, 64)
    for fn in (big_sin, pure, tiny, functools.partial(side_context_row, max_len=16)):
        batch = side_batch(rows) if isinstance(fn, functools.partial) else x
        with prep.Pool("auto", workers=2) as pool:
            got = pool.map_rows(fn, batch)
        want = prep.map_rows(fn, batch, executor="serial")
        assert torch.equal(got, want), (fn, rows)


def test_a_new_lambda_for_every_batch_does_not_pile_up(monkeypatch):
    import prep.auto

    monkeypatch.setattr(prep.auto.executor, "SIGNATURES", 5)
    x = torch.randn(16, 3)
    with prep.Pool("auto", workers=2) as pool:
        for k in range(12):
            got = pool.map_rows(lambda r, k=k: r * k, x)  # a new function each time
            assert torch.equal(got, x * k)
        assert len(pool._get("auto").choices()) == 5  # the newest five; older ones forgotten


# ------------------------------------------------------------ the executor contract


class InProcessPool(prep.executors.Executor):
    """A stand-in for worker processes that has only the executor contract (and its
    cost model, below): auto must weigh it, start it and run it, never knowing its class."""

    name = "processes"

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)
        self.prepared: list[object] = []
        self.runs = 0

    def run(self, job):
        self.runs += 1
        job.run_range(job.start, len(job.rows))
        return job.sink.output


@pytest.mark.skipif(not TWO_CORES, reason="processes are left out on one core")
def test_auto_starts_and_runs_any_executor_through_the_contract(monkeypatch):
    from prep.core.rows import rows_of
    from prep.executors import REGISTRY, Job

    clock = [0.0]

    def ms_row(row: torch.Tensor) -> torch.Tensor:  # int(): no vmap
        clock[0] += 1e-3  # 1 ms a row on the clock calibration reads: exact anywhere
        return row * 2 + 0 * int(row[0])

    from prep.auto.models import MODELS, ProcessesModel

    class InProcessModel(ProcessesModel):  # what starting the stand-in costs, and doing it
        @classmethod
        def start_cost(cls, ex):
            return 0.0 if ex.prepared else 0.001

        @classmethod
        def dispatch_cost(cls, ex):
            return 0.0

        @classmethod
        def prepare(cls, ex, job):
            ex.prepared.append(job.fn)
            return 0.001

    monkeypatch.setitem(MODELS, "processes", InProcessModel)
    monkeypatch.setattr(prep.auto.Sample, "now", lambda self: clock[0])
    made: dict[str, prep.executors.Executor] = {}

    def executors(name: str) -> prep.executors.Executor:
        if name not in made:
            made[name] = (InProcessPool if name == "processes" else REGISTRY[name])(2)
        return made[name]

    x = torch.arange(64.0).view(64, 1)
    with prep.auto.AutoExecutor(2, executors=executors) as auto:
        job = Job.new(ms_row, rows_of(x))
        out = auto.run(job)
        (cal,) = auto.choices().values()
    pool = made["processes"]
    assert isinstance(pool, InProcessPool)
    # 64 ms of rows, halved by two workers, pays 1 ms of start-up at once: the rest of
    # the first batch ran on it, once it had loaded the function
    assert pool.prepared == [ms_row] and pool.runs == 1, str(cal)
    assert "processes" in cal.started and cal.choice == "processes", str(cal)
    assert torch.equal(out.result(), x * 2)


# ------------------------------------------------------------ fallback and the loading probe


def _say_processes_win(pool: prep.Pool, fn, x: torch.Tensor) -> prep.auto.Calibration:
    """Run a first batch, then make auto's figures say processes (started) win."""
    pool.map_rows(fn, x)
    (cal,) = pool._get("auto").choices().values()
    cal.predicted["processes"] = cal.figure(cal.choice) / 10
    cal.started.add("processes")
    cal.observed.pop("processes", None)
    cal.choice = prep.auto.Decisions(cal).best()
    assert cal.choice == "processes", str(cal)
    return cal


def test_an_executor_that_cannot_run_here_makes_auto_fall_back_with_one_warning(monkeypatch):
    from prep.errors import ExecutorUnavailable
    from prep.executors.processes import ProcessExecutor

    def no_room(self, job):
        raise ExecutorUnavailable("executor='processes' needs 9 MiB of shared memory; no room")

    monkeypatch.setattr(ProcessExecutor, "run", no_room)
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        cal = _say_processes_win(pool, waits_2ms, x)
        with pytest.warns(RuntimeWarning, match=r"chose 'processes', which cannot run here"):
            assert torch.equal(pool.map_rows(waits_2ms, x), x * 2)
        assert cal.choice != "processes" and "processes" not in cal.predicted, str(cal)
        assert "it failed here: executor='processes' needs 9 MiB" in str(cal)
        cal.predicted["processes"] = 1e-6
        cal.started.add("processes")  # once more: no warning
        cal.choice = "processes"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.equal(pool.map_rows(waits_2ms, x), x * 2)


def test_a_row_error_is_not_a_reason_to_fall_back():
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(rowfns.identity, x + 100)  # calibrated on rows that do not fail
        with pytest.raises(prep.RowError, match=r"row 5: ValueError: cannot handle 5"):
            pool.map_rows(rowfns.fail_on_5, x)


def test_a_function_workers_cannot_load_drops_processes_before_they_are_used(tmp_path):
    import importlib
    import sys

    prep.map_rows(rowfns.affine, torch.ones(2, 1), executor="processes", workers=2)
    (tmp_path / "gone_later.py").write_text(
        "import ctypes\n\ndef f(row):\n    ctypes.PyDLL(None).usleep(2000 + 0 * int(row[0]))\n"
        "    return row + 1\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        fn = importlib.import_module("gone_later").f
        (tmp_path / "gone_later.py").unlink()  # the workers cannot import it any more
        x = torch.arange(64.0).view(64, 1)
        with prep.Pool("auto", workers=2) as pool:
            pool.map_rows(fn, x)
            (cal,) = pool._get("auto").choices().values()
            cal.started.discard("processes")
            cal.predicted["processes"] = cal.figure(cal.choice) / 10  # they would win
            cal.start["processes"] = 0.0
            assert torch.equal(pool.map_rows(fn, x), x + 1)  # no error: not the user's fault
        assert "processes" not in cal.predicted and "processes" not in cal.started, str(cal)
        assert "could not load the function" in cal.dropped["processes"], str(cal)
        assert "No module named 'gone_later'" in cal.dropped["processes"], str(cal)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gone_later", None)


def test_every_batch_is_timed_and_a_close_runner_up_is_tried_on_a_whole_batch():
    x = torch.arange(64.0).view(64, 1)
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(waits_2ms, x)
        (cal,) = pool._get("auto").choices().values()
        first = cal.choice
        other = next(n for n in ("serial", "threads") if n != first and n in cal.predicted)
        cal.predicted[other] = cal.figure(first) * 1.2  # within TRIAL of the choice
        # the choice (timed), then the runner-up twice (a warm-up, then timed), then
        # whichever the figures say
        for _ in range(4):
            assert torch.equal(pool.map_rows(waits_2ms, x), x * 2)
    assert other in cal.observed and first in cal.observed, str(cal)
    # (whether the runner-up then keeps the next batch depends on its time: not checked)
    assert cal.batches == 5 and sum(map(len, cal.observed.values())) == 3, str(cal)


# ------------------------------------------------------------ process-wide state


def needs_fallback(row: torch.Tensor) -> torch.Tensor:
    """torch 2.13 has no batching rule for ``aten::quantile.scalar``: vmap of this runs
    the op through its fallback, a loop over the rows (and warns)."""
    return torch.quantile(row, 0.5).expand(2)


@pytest.mark.timeout(120)
def test_auto_calibrating_leaves_a_vmap_in_another_thread_alone():
    """torch's switch that makes vmap's fallback raise is one flag of the whole
    process: auto must never flip it, or the user's vmap in another thread raises."""
    import threading

    stop, failures, calls = threading.Event(), [], [0]
    x = torch.rand(4, 8)

    def users_vmap() -> None:
        with warnings.catch_warnings():  # this thread's own test set-up, not prep's
            warnings.simplefilter("ignore")
            while not stop.is_set():
                try:
                    torch.func.vmap(needs_fallback)(x)
                    calls[0] += 1
                except Exception as exc:
                    failures.append(exc)
                    return

    user = threading.Thread(target=users_vmap, daemon=True)
    user.start()
    try:
        batch = torch.rand(64, 16)
        for _ in range(40):  # a new pool each time: every call calibrates, vmap included
            with prep.Pool("auto") as pool:
                out = pool.map_rows(pure, batch)
            assert torch.equal(out, prep.map_rows(pure, batch, executor="serial"))
    finally:
        stop.set()
        user.join(10)
    assert not failures, f"the user's vmap raised while auto calibrated: {failures[0]!r}"
    assert calls[0] > 0


# ---------------------------------------------------------------- the executor contract


def test_auto_weighs_every_executor_that_estimates_a_batch(monkeypatch):
    """auto holds no formula of its own: each executor's cost model estimates a batch
    from the figures (``CostModel.estimate``), and a new one is weighed and chosen with
    no change to auto: one module in the registry, one model in the table. Here one
    estimates a tenth of serial's time."""
    from prep.auto import AutoExecutor
    from prep.auto.models import MODELS, CostModel
    from prep.executors import REGISTRY, Job, SerialExecutor

    class TenthModel(CostModel):
        name = "tenth"

        @classmethod
        def estimate(cls, cal, rows, cores):
            return rows * cal.serial_row / 10

    class Tenth(SerialExecutor):
        name = "tenth"
        ran = 0

        def run(self, job):
            type(self).ran += len(job.rows) - job.start
            return super().run(job)

    def plain(row):  # no twin, and vmap cannot read .item()
        return row * 2 + 1 + 0 * row[0].item()

    monkeypatch.setitem(REGISTRY, "tenth", Tenth)
    monkeypatch.setitem(MODELS, "tenth", TenthModel)
    x = torch.arange(64.0).view(32, 2)
    with AutoExecutor(workers=1) as auto:
        chosen = []
        for _ in range(2):  # calibrated and chosen; then run (and timed: it may move on)
            out = auto.run(Job.new(plain, prep.core.rows.rows_of(x)))
            assert out is not None and torch.equal(out.buffers[0], x * 2 + 1)
            (cal,) = auto.choices().values()
            chosen.append(cal.choice)
    assert cal.predicted["tenth"] == pytest.approx(cal.predicted["serial"] / 10)
    assert chosen[0] == "tenth" and Tenth.ran >= len(x)  # the rest of the first, the second
    # an executor that estimates nothing is not weighed (joblib: docs/auto.md says why)
    assert "joblib" not in cal.predicted


def test_auto_has_each_executor_measure_itself_and_names_none(monkeypatch):
    """auto holds no measuring step of any executor: each one's cost model measures it
    on the sample (``CostModel.measure``, its rows written into the output like every
    row auto runs), keeps its figure under its name, and estimates a batch from it; the
    model says what role it plays (a pool must win by ``POOL_MARGIN``). A new pool is
    measured, weighed, explained and chosen with no change to auto."""
    from prep.auto import POOL_MARGIN, AutoExecutor
    from prep.auto.models import MODELS, CostModel
    from prep.executors import REGISTRY, Job, SerialExecutor

    class Quarter(SerialExecutor):  # a pool in all but its workers
        name = "quarter"

    class QuarterModel(CostModel):
        name = "quarter"
        pooled = True
        measured: list[int] = []

        @classmethod
        def measure(cls, sample):
            main = sample.main
            start, stop = main.done, min(sample.n, main.done + 4)
            main.run(sample.executor(cls.name), stop)
            cls.measured.append(stop - start)
            sample.cal.speedup[cls.name] = 4.0

        @classmethod
        def estimate(cls, measured, rows, cores):
            speedup = measured.speedup.get(cls.name)
            return None if speedup is None else rows * measured.serial_row / speedup

    calls = [0]

    def slow(row):  # 0.1 ms a row: a batch is past the 2 ms below which no pool is measured
        first = row[0].item()  # no vmap (its try fails here, before a call is counted)
        calls[0] += 1
        time.sleep(1e-4)
        return row * 2 + 1 + 0 * first

    monkeypatch.setitem(REGISTRY, "quarter", Quarter)
    monkeypatch.setitem(MODELS, "quarter", QuarterModel)
    x = torch.arange(128.0).view(64, 2)
    with AutoExecutor(workers=1) as auto:
        out = auto.run(Job.new(slow, prep.core.rows.rows_of(x)))
        assert out is not None and torch.equal(out.buffers[0], x * 2 + 1)
        (cal,) = auto.choices().values()
        assert calls[0] == len(x) and QuarterModel.measured == [4], str(cal)  # once a row
        assert cal.predicted["quarter"] == pytest.approx(cal.predicted["serial"] / 4)
        assert cal.cost("quarter") == pytest.approx(cal.predicted["quarter"] * POOL_MARGIN)
        assert cal.choice == "quarter" and "quarter run 4.00x serial" in str(cal), str(cal)
        auto.run(Job.new(slow, prep.core.rows.rows_of(x)))  # settled: not measured again
    assert QuarterModel.measured == [4] and "quarter" in cal.observed, str(cal)


def test_an_executor_that_costs_a_start_waits_for_rent_or_buy_whatever_its_name(monkeypatch):
    from prep.auto.models import MODELS, CostModel
    from prep.executors import REGISTRY, Executor

    class Rented(Executor):
        name = "rented"

    class RentedModel(CostModel):
        name = "rented"
        pooled = rent_or_buy = True

    monkeypatch.setitem(REGISTRY, "rented", Rented)
    monkeypatch.setitem(MODELS, "rented", RentedModel)
    d = _cal(serial=0.100, rented=0.040)
    assert d.cal.choice == "serial" and d.cal.to_start() == ["rented"]
    assert d.plan_start("rented", 0.02, 100)  # 20 ms to start, 54 ms saved on this batch
    d.started("rented", 0.02)
    assert d.cal.choice == "rented" and "rented started in 20 ms" in str(d.cal)


def test_auto_compares_no_executor_name_but_serials():
    """No branch of auto asks ``if name == "processes"``: what an executor is, its
    class says (serial, the reference every figure is relative to, may be named)."""
    import ast
    from pathlib import Path

    names = set(prep.EXECUTORS) - {"serial"}
    compared = [
        f"{path.name}: {ast.unparse(node)}"
        for path in sorted(Path(prep.auto.__file__).parent.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        for side in [node.left, *node.comparators]
        if isinstance(side, ast.Constant) and side.value in names
    ]
    assert not compared, compared


@pytest.mark.timeout(120)
def test_the_first_auto_call_imports_nothing_the_function_did_not_use():
    """torch imports numpy but not numpy.random (about 130 ms); prep's check of the
    global generators must not import it for a function that never touches numpy
    (under seed=, prep seeds numpy's generator where numpy is imported, and pays it)."""
    script = (
        "import sys, torch, prep\n"
        "prep.map_rows(lambda r: r * 2, torch.ones(64, 4))\n"
        "print(sorted(m for m in ('numpy.random', 'torch._dynamo') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
