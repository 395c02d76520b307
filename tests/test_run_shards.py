"""``prep run`` with whole shards on worker processes (``--parallel shards``), against a
plain loop the tests compute themselves, and the plan that chooses between whole
shards and rows spread out, from figures the tests give it."""

from __future__ import annotations

import math
import pathlib
import signal
import threading

import pytest
import torch

from prep.cli import main
from prep.run import RunConfig, ShardFigures, decide, run_shards
from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest
from prep.run.plan import ROWS_MARGIN

from . import rowfns
from .conftest import descendants, wait_until
from .test_cli import Child, alive, outputs, temps_in


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def numbered(folder: pathlib.Path, shards: int = 4, rows: int = 6, fmt: str = "pt") -> None:
    """Shard k holds rows whose every value is 10 * k + the row: a row's first value says
    which shard and row it is (``rowfns.exits`` ends its worker on value 1: shard 0)."""
    suffix = {"pt": ".pt", "safetensors": ".safetensors"}[fmt]
    for k in range(shards):
        x = (10.0 * k + torch.arange(rows, dtype=torch.float32))[:, None].expand(rows, 3)
        W.save_shard({"x": x.contiguous()}, folder / f"s{k}{suffix}", fmt)


def loop(fn, folder: pathlib.Path) -> dict[str, torch.Tensor]:
    """The plain loop a user would write: every row through ``fn``, stacked."""
    return {
        p.name: torch.stack([fn(row) for row in S.load_shard(p)["x"]])
        for p in sorted(folder.iterdir())
    }


# ------------------------------------------------------------------ the same bytes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_whole_shards_equal_the_loop_and_the_rows_path_byte_for_byte(tmp_path, fmt, no_leaks):
    data = tmp_path / "data"
    numbered(data, shards=5, fmt=fmt)
    config = RunConfig("tests.rowfns:affine", columns=("x",), executor="serial")
    whole, rows = tmp_path / "whole", tmp_path / "rows"
    a = run_shards([data], whole, config, parallel="shards", jobs=3)
    b = run_shards([data], rows, config, parallel="rows")
    assert (a.done, b.done, a.exit_code) == (5, 5, 0)
    assert a.plan.startswith("shards:") and b.plan.startswith("rows:")
    for name, expected in loop(rowfns.affine, data).items():
        assert torch.equal(S.load_shard(whole / name)["out"], expected)
    assert outputs(whole) == outputs(rows)


@pytest.mark.timeout(120)
# the failed rows' warning is what fill/skip say, in the run's worker thread: expected here
@pytest.mark.filterwarnings("ignore:1 of 6 rows failed:RuntimeWarning")
@pytest.mark.parametrize(
    ("fn", "extra", "check"),
    [
        # ragged rows: padded with 0 to the shard's longest, lengths beside them
        ("tests.rowfns:ragged", {"pad": 0}, "padded"),
        ("tests.rowfns:fail_on_5", {"on_row_error": "fill", "fill": -1}, "filled"),
        ("tests.rowfns:fail_on_5", {"on_row_error": "skip"}, "skipped"),
    ],
)
def test_row_options_on_whole_shards(tmp_path, fn, extra, check, no_leaks):
    data = tmp_path / "data"
    numbered(data, shards=3)
    config = RunConfig(fn, columns=("x",), executor="serial", **extra)
    whole, rows = tmp_path / "whole", tmp_path / "rows"
    assert run_shards([data], whole, config, parallel="shards").exit_code == 0
    assert run_shards([data], rows, config, parallel="rows").exit_code == 0
    assert outputs(whole) == outputs(rows)
    first = S.load_shard(whole / "s0.pt")
    source = S.load_shard(data / "s0.pt")["x"]
    if check == "padded":
        pieces = [rowfns.ragged(r) for r in source]
        expected = torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True, padding_value=0)
        assert torch.equal(first["out"], expected)
        assert first["out_lengths"].tolist() == [len(p) for p in pieces]
    elif check == "filled":
        expected = source.clone()
        expected[5] = -1
        assert torch.equal(first["out"], expected)
        assert Manifest(whole).entries()["s0.pt"]["failed_rows"] == [5]
    else:
        assert torch.equal(first["out"], source[[0, 1, 2, 3, 4]])
        assert Manifest(whole).entries()["s0.pt"]["failed_rows"] == [5]


@pytest.mark.timeout(120)
def test_setup_runs_in_each_shard_worker(tmp_path, no_leaks):
    data = tmp_path / "data"
    numbered(data, shards=4)
    config = RunConfig(
        "tests.statefns:add_offset",
        columns=("x",),
        setup="tests.statefns:offset_state",
        executor="serial",
    )
    s = run_shards([data], tmp_path / "out", config, parallel="shards", jobs=4)
    assert s.exit_code == 0 and s.plan.startswith("shards:")
    for k in range(4):
        source = S.load_shard(data / f"s{k}.pt")["x"]
        assert torch.equal(S.load_shard(tmp_path / "out" / f"s{k}.pt")["out"], source + 100.0)


# ------------------------------------------------------------------ faults


@pytest.mark.timeout(120)
def test_a_worker_that_dies_fails_its_shard_only(tmp_path, capsys, no_leaks):
    data = tmp_path / "data"
    numbered(data, shards=4)
    out = tmp_path / "out"
    code = cli("run", data, "--out", out, "--fn", "tests.rowfns:exits", "--columns", "x",
               "--executor", "serial", "--parallel", "shards", "--workers", 2,
               "--on-error", "skip", "--quiet")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "s0.pt: WorkerCrashed: worker pid" in err and "exit code 3" in err
    assert "the shard" in err and "s0.pt" in err
    entries = Manifest(out).entries()
    assert sorted(entries) == ["s1.pt", "s2.pt", "s3.pt"]
    for k in (1, 2, 3):
        source = S.load_shard(data / f"s{k}.pt")["x"]
        assert torch.equal(S.load_shard(out / f"s{k}.pt")["out"], source)
    assert temps_in(out) == []


@pytest.mark.timeout(120)
def test_a_shard_error_keeps_its_own_type_and_traceback(tmp_path, capsys):
    data = tmp_path / "data"
    numbered(data, shards=3)
    code = cli("run", data, "--out", tmp_path / "out", "--fn", "tests.rowfns:fail_on_5",
               "--columns", "x", "--executor", "serial", "--parallel", "shards",
               "--on-error", "skip", "--quiet")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    # s0's row 5 raises: the shard fails with the row's error, and where it was
    assert "\n  s0.pt: row 5: ValueError: cannot handle 5; --on-row-error skip" in err
    assert err.count("in fail_on_5") == 1  # one traceback: the function's own line
    assert "prep/executors" not in err  # from the worker's traceback, prep's frames left out
    failures = Manifest(tmp_path / "out").failures()
    assert all("RowError: row 5" in f["traceback"] for f in failures.values())


def test_a_worker_that_died_writing_leaves_no_temp_once_the_run_ends(tmp_path, capsys, monkeypatch):
    """Its temporary file is not an output: the run removes it at its end (its writer
    is gone), not only the next run at its start."""
    data, out = tmp_path / "data", tmp_path / "out"
    numbered(data, shards=4, rows=3)
    out.mkdir()
    monkeypatch.setenv("PREP_TEST_OUT", str(out))  # the workers follow the caller's env
    code = cli("run", data, "--out", out, "--fn", "tests.rowfns:dies_writing", "--columns",
               "x", "--executor", "serial", "--parallel", "shards", "--workers", 2,
               "--on-error", "skip", "--quiet")  # fmt: skip
    assert code == 1 and "WorkerCrashed" in capsys.readouterr().err
    assert temps_in(out) == []
    assert sorted(Manifest(out).entries()) == ["s1.pt", "s2.pt", "s3.pt"]


def _slow_shards(folder: pathlib.Path) -> None:
    numbered(folder, shards=8, rows=6)


SLOW = ["--fn", "tests.rowfns:slow", "--columns", "x", "--executor", "serial"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["parent", "worker"])
def test_sigkill_then_resume_gives_the_same_bytes(tmp_path, victim):
    data, clean = tmp_path / "data", tmp_path / "clean"
    _slow_shards(data)
    assert cli("run", data, "--out", clean, *SLOW, "--parallel", "rows", "--quiet") == 0
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *SLOW, "--parallel", "shards", "--on-error", "skip"]
    child = Child(*args)
    assert child.wait_for(1)
    workers = descendants(child.proc.pid)
    if victim == "parent":
        child.proc.kill()
        assert child.finish() == -signal.SIGKILL
        # its workers see it gone and exit; the temps they leave are stale for the next run
        assert wait_until(lambda: not any(alive(p) for p in workers), timeout=15), workers
    else:
        pid = next(iter(workers))
        import os

        os.kill(pid, signal.SIGKILL)
        code = child.finish()
        assert code == 1, child.stderr  # the shard that worker held failed; the rest ran
        assert "WorkerCrashed" in child.stderr
        assert temps_in(out) == []  # the dead worker's, if it was writing, is removed
    for name in outputs(out):  # whatever has a final name is complete
        S.load_shard(out / name)
    again = Child("run", data, "--out", out, *SLOW, "--parallel", "shards", "--resume")
    assert again.finish() == 0, again.stderr
    assert outputs(out) == outputs(clean)
    assert temps_in(out) == []


@pytest.mark.timeout(90)
def test_ctrl_c_abandons_whole_shards_cleanly(tmp_path):
    data = tmp_path / "data"
    _slow_shards(data)
    out = tmp_path / "out"
    child = Child("run", data, "--out", out, *SLOW, "--parallel", "shards", "--jobs", 2)
    assert child.wait_for(1)
    workers = descendants(child.proc.pid)
    assert workers, "whole shards run on worker processes"
    child.proc.send_signal(signal.SIGINT)
    assert child.finish() == 130, child.stderr
    assert "interrupted by SIGINT" in child.stderr
    assert temps_in(out) == []
    assert wait_until(lambda: not any(alive(p) for p in workers), timeout=15), workers
    entries = Manifest(out).entries()
    assert 1 <= len(entries) < 8
    for e in entries.values():
        assert W.sha256_file(out / e["output"]) == e["output_sha256"]


# ------------------------------------------------------------------ rows: one at a time


#: threads inside a row call right now, and the most ever seen at once
_inside = {"now": 0, "most": 0}
_lock = threading.Lock()
_other = threading.Event()


def overlap_probe(row: torch.Tensor) -> torch.Tensor:
    """Counts the threads computing rows at once. A shard's first row waits (on an event,
    up to 0.5 s) for another shard's rows to start: without the compute lock they would."""
    with _lock:
        _inside["now"] += 1
        _inside["most"] = max(_inside["most"], _inside["now"])
        if _inside["now"] > 1:
            _other.set()
    try:
        if int(row[0]) % 10 == 0:
            _other.wait(0.5)
        return row
    finally:
        with _lock:
            _inside["now"] -= 1


@pytest.mark.timeout(60)
def test_rows_path_computes_one_shard_at_a_time(tmp_path):
    data = tmp_path / "data"
    numbered(data, shards=3, rows=4)
    config = RunConfig("tests.test_run_shards:overlap_probe", columns=("x",), executor="serial")
    _inside.update(now=0, most=0)
    _other.clear()
    s = run_shards([data], tmp_path / "out", config, parallel="rows", jobs=3)
    assert s.exit_code == 0 and s.done == 3
    assert _inside["most"] == 1


# ------------------------------------------------------------------ the plan


def figures(**given: float) -> ShardFigures:
    base = dict(shards=8, rows=1000, workers=2, one_thread_row=2e-4, all_threads_row=2e-4,
                load=0.01, shard_start=0.0, pool_start=2.0)  # fmt: skip
    return ShardFigures(**{**base, **given})


def test_plan_takes_whole_shards_for_a_python_row_function():
    # torch's threads do nothing for a Python row: whole shards use both cores
    plan = decide(figures(), cores=2)
    assert plan.mode == "shards" and plan.threads == 1
    assert plan.predicted["shards"] == pytest.approx(4 * (0.2 + 0.02))
    assert plan.sentence().startswith("shards: 8 shard(s) on 2 worker processes")


def test_plan_takes_rows_when_shards_are_too_few_for_the_workers():
    # one shard, or three on two workers while torch's threads already use both cores
    assert decide(figures(shards=1), cores=2).mode == "rows"
    plan = decide(figures(shards=3, all_threads_row=1e-4), cores=2)
    assert plan.mode == "rows" and "cannot keep" not in plan.reason
    assert plan.predicted["rows"] < plan.predicted["shards"]


def test_plan_counts_each_start_once_for_the_run():
    # starting the shard workers (2 s, no fork) is paid once, not once a shard: on 8
    # shards of 2 s each it is worth it, on 2 shards of 0.1 s it is not
    slow = figures(rows=10_000, shard_start=2.0, pool_start=math.inf)
    assert decide(slow, cores=2).predicted["shards"] == pytest.approx(2.0 + 4 * (2.0 + 0.02))
    assert decide(slow, cores=2).mode == "shards"
    quick = figures(shards=2, rows=500, shard_start=2.0, pool_start=math.inf)
    assert decide(quick, cores=2).mode == "rows"


def test_plan_breaks_near_ties_for_whole_shards():
    # torch's threads run a row 1.1x faster on two cores than on one: rows predicted a
    # little faster (8 x 0.18 s against 4 x 0.4 s), not by the margin the rows path needs
    plan = decide(figures(one_thread_row=4e-4, all_threads_row=1.8e-4, load=0.0), cores=2)
    assert plan.predicted["rows"] < plan.predicted["shards"]
    assert plan.predicted["rows"] * ROWS_MARGIN > plan.predicted["shards"]
    assert plan.mode == "shards"
    # twice as fast on every core (a batched twin, say): rows
    assert decide(figures(one_thread_row=4e-4, all_threads_row=1e-4), cores=2).mode == "rows"


def test_plan_with_one_worker_or_a_row_pool_that_is_up():
    assert decide(figures(workers=1), cores=2).mode == "rows"
    # a row pool already up runs a shard's rows on every core too: close to a tie; the
    # prediction counts its dispatch (ROW_POOL_EFFICIENCY), so whole shards stay ahead
    plan = decide(figures(pool_start=0.0), cores=2)
    assert plan.mode == "shards" and plan.predicted["rows"] > plan.predicted["shards"]


def test_plan_gives_each_worker_its_share_of_the_cores():
    assert decide(figures(workers=4), cores=16).threads == 4
    assert decide(figures(workers=3), cores=2).threads == 1


def test_explain_says_the_plan_first(tmp_path, capsys):
    data = tmp_path / "data"
    numbered(data, shards=4, rows=64)
    code = cli("run", data, "--out", tmp_path / "out", "--fn", "tests.rowfns:affine",
               "--columns", "x", "--explain")  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    first = text.splitlines()[0]
    assert first.startswith(("shards: ", "rows: ")), text
    assert "torch threads" in text
    assert not (tmp_path / "out").exists()
