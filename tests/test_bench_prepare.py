"""scripts/bench_prepare.py: its jobs, what it reads off a run (peak PSS, prep run's fixed
part), and a smoke run of the big job that checks outputs and prints the table.

Timings on a shared 2-core machine are noise: nothing here asserts a figure beyond what
the test itself makes (a child holding 2 x 48 MiB, lines half a second apart).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
HAS_PSS = os.path.exists("/proc/self/smaps_rollup")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The script, with scripts/ importable as it is when run (prepare_jobs, watch_run)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield _load("bench_prepare")
    finally:
        sys.path.remove(str(SCRIPTS))
        for name in ("bench_prepare", "prepare_jobs", "watch_run"):
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def watch_run(bench: ModuleType) -> ModuleType:
    return sys.modules["watch_run"]


# ------------------------------------------------------------------ jobs


def test_a_job_x10_has_ten_times_the_rows_in_as_many_shards(bench: ModuleType) -> None:
    args = bench.parser().parse_args(["--big-gib", "0.02"])
    wwm, wwm10 = bench.job_of("wwm", args), bench.job_of("wwm-x10", args)
    assert (wwm10.shards, wwm10.rows, wwm10.fn) == (wwm.shards, 10 * wwm.rows, "wwm_row")
    big = bench.job_of("big", args)
    assert (big.shards, big.rows, big.fn) == (3, round(0.02 * 65536), "affine_row")
    assert bench.job_of("small-torch", args).shards == 2000
    for bad in ("wwm-x0", "nope", "big-x"):
        with pytest.raises(ValueError, match="not one of"):
            bench.job_of(bad, args)


# ------------------------------------------------------------------ prep run's fixed part


def test_the_fixed_part_is_read_off_prep_runs_timestamped_lines(watch_run: ModuleType) -> None:
    lines = [
        (1.0, "prep run: shards: 2 shard(s) on 2 worker processes, a whole shard each, ..."),
        (1.5, "prep run: [1/2] a.pt: 8 rows in 0.20 s (rows: serial)"),
        (1.6, "prep run: [2/2] dir/b: c.pt: 1,024 rows in 0.25 s"),
        (1.7, "prep run: 2 shard(s): 2 done, 0 skipped, 0 failed, 0 not finished; 16 rows "
              "written; 0.1 MB read in 0.90 s (0.1 MB/s, 18 rows/s)"),
    ]  # fmt: skip
    w = watch_run.Watched(2.0, 0, lines)
    f = watch_run.fixed_part(w)
    assert (round(f.start, 6), round(f.end, 6), round(f.clock, 6)) == (1.3, 0.4, 0.8)
    # the manifest's seconds are finer than the line's, and a name may hold ": "
    f = watch_run.fixed_part(w, {"a.pt": 0.1, "dir/b: c.pt": 0.26})
    assert round(f.start, 6) == 1.34 and str(f) == "1.34 + 0.40"
    assert watch_run.plan_workers(w) == 2
    quiet = watch_run.Watched(2.0, 0, [(1.0, "prep run: warning: something")])
    assert watch_run.fixed_part(quiet) is None and watch_run.plan_workers(quiet) is None


# ------------------------------------------------------------------ watching a run

TREE = """
import subprocess, sys, time
held = b"x" * (48 << 20)  # touched: resident
print("start", file=sys.stderr, flush=True)
child = subprocess.Popen([sys.executable, "-c",
    "import time; held = b'y' * (48 << 20); time.sleep(1.5)"])
time.sleep(0.6)
print("end", file=sys.stderr, flush=True)
child.wait()
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not HAS_PSS, reason="no /proc/PID/smaps_rollup here (Linux 4.14+)")
def test_the_peak_counts_the_whole_tree_and_lines_carry_their_arrival(
    watch_run: ModuleType,
) -> None:
    w = watch_run.watch([sys.executable, "-c", TREE], every=0.02)
    assert w.returncode == 0, w.stderr
    assert w.peak is not None and w.peak >= 2 * (48 << 20)  # parent and child at once
    (t0, start), (t1, end) = w.lines
    assert (start, end) == ("start", "end") and 0.5 <= t1 - t0 < w.seconds


SLEEPER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, file=sys.stderr, flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_run_past_its_limit_is_killed_with_its_children(watch_run: ModuleType) -> None:
    w = watch_run.watch([sys.executable, "-c", SLEEPER], limit=5)
    assert w.returncode is None and w.seconds < 30
    child = int(w.lines[0][1])
    for _ in range(100):  # killed; reaped by whoever adopted it, soon
        if _state(child) in (None, "Z"):
            break
        time.sleep(0.05)
    assert _state(child) in (None, "Z")


def _state(pid: int) -> str | None:
    """The process's state letter, None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


# ------------------------------------------------------------------ the whole script


@pytest.mark.timeout(300)
def test_a_smoke_run_of_the_big_job_checks_outputs_and_prints_the_table(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the contenders import this checkout's prep, whatever the venv installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    before = signal.getsignal(signal.SIGTERM)
    argv = ["--quick", "--jobs", "big", "--big-gib", "0.004", "--contenders", "loop,prep",
            "--prep-flags", ""]  # fmt: skip
    try:
        assert bench.main(argv) == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    out = capsys.readouterr().out
    assert '`python -c "import torch"`' in out and "### big: 3 shards x 262 rows" in out
    rows = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| `")}
    assert set(rows) == {"`loop`", "`prep run`"}
    assert all(ln.rstrip(" |").endswith("ok") for ln in rows.values()), out
    assert "peak / shard" in out and "fixed s (start + end)" in out
    cells = [c.strip() for c in rows["`prep run`"].split("|")]
    if HAS_PSS:
        assert float(cells[6].replace(",", "")) > 0 and float(cells[7]) > 0
    start, end = (float(x) for x in cells[8].split("+"))
    assert start > 0 and end >= 0
    assert "- fixed part of `prep run` (medians of 1): exec to its first shard starting" in out
    assert "- target (big)" in out and "workers x 2 + 1" in out


def test_the_parser_refuses_a_job_it_does_not_have(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--jobs", "wwm,huge", "--repeat", "1"])
    assert isinstance(bench.parser(), argparse.ArgumentParser)
