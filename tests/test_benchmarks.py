"""``python -m benchmarks``: the harness on tiny grids, its files, its JSON, its command.

Timings on a shared 2-core machine are noise, so nothing here asserts a figure;
the tests check what the harness derives from its own figures (winners, auto's
ratios) and that failures become cells instead of aborting the run.
"""

from __future__ import annotations

import argparse
import builtins
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.baselines import loop_stack
from benchmarks.command import PROG, command, configure
from benchmarks.grid import QUICK_WORKLOADS, Grid
from benchmarks.harness import _naive_plan, _names, run
from benchmarks.report import write
from benchmarks.results import Results
from benchmarks.workloads import WORKLOADS, Workload, noop, user_workload
from prep.bench.verify import status_of
from prep.errors import ConfigError
from prep.executors import available_cores
from prep.registry import EXECUTORS as REGISTRY

from . import bench_user

TINY = Grid(
    workloads=("noop", "side_context_small", "tokenize"),
    executors=("serial", "threads", "vectorized", "auto", "loop"),
    rows=(4, 16),
    workers=(1, 2),
    repeat=2,
)


@pytest.fixture(autouse=True, scope="module")
def _users_joblib_workers():
    """The ``plain_joblib`` baseline is a user's ``joblib.Parallel``: it runs on loky's
    one executor per interpreter, which prep leaves alone (its workers idle out after
    minutes). The user here is this module: it ends them, so later leak checks see
    only prep's own processes."""
    yield
    from joblib.externals.loky import reusable_executor

    if reusable_executor._executor is not None:
        reusable_executor._executor.shutdown(wait=True, kill_workers=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Path]:
    out = tmp_path_factory.mktemp("bench")
    return run(TINY, out=out), out


@pytest.fixture(scope="module")
def data(tiny: tuple[Results, Path]) -> dict[str, Any]:
    return json.loads((tiny[1] / "results.json").read_text())


def bench_cli(*argv: str) -> int:
    """``python -m benchmarks ARGV`` in this process."""
    parser = argparse.ArgumentParser(prog=PROG)
    configure(parser)
    return command(parser.parse_args(argv))


# ---------------------------------------------------------------- files and schema


@pytest.mark.timeout(120)
def test_tiny_grid_writes_every_file(tiny: tuple[Results, Path]) -> None:
    results, out = tiny
    for name in ["results.json", "report.md", "table.txt", "throughput.png", "winners.png"]:
        assert (out / name).stat().st_size > 0, name
    for png in ["throughput.png", "winners.png"]:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "## Who wins where" in report and "![throughput.png](throughput.png)" in report
    for workload in TINY.workloads:
        assert f"## {workload}" in report


CELL_TYPES: dict[str, Any] = {
    "workload": str,
    "rows": int,
    "workers": int,
    "executor": str,
    "label": str,
    "status": str,
    "median_s": (float, type(None)),
    "low_s": (float, type(None)),
    "high_s": (float, type(None)),
    "spread": (float, type(None)),
    "samples_s": list,
    "rows_per_s": (float, type(None)),
    "speedup": (float, type(None)),
    "estimated": bool,
    "winner": bool,
    "contender": bool,
    "breakdown": dict,
    "note": str,
}


@pytest.mark.timeout(120)
def test_results_json_schema(data: dict[str, Any]) -> None:
    assert data["schema"] == "prep.bench/1"
    expected = {"schema", "environment", "grid", "workloads", "wall_s", "startup", "cells"}
    assert expected | {"auto", "summary"} == set(data)
    env = data["environment"]
    for key, kind in [
        ("cores", int),
        ("torch", str),
        ("torch_threads", int),
        ("start_method", str),
        ("python", str),
        ("gil_enabled", bool),
    ]:
        assert isinstance(env[key], kind), key
    assert data["grid"]["rows"] == [4, 16] and data["grid"]["workers"] == [1, 2]
    assert set(data["workloads"]) == set(TINY.workloads)
    assert all(isinstance(line, str) and line for line in data["summary"])
    for s in data["startup"]:
        assert set(s) == {"executor", "workers", "first_call_s", "warm_s", "error", "startup_s"}
    for cell in data["cells"]:
        assert set(cell) == set(CELL_TYPES), cell
        for key, kind in CELL_TYPES.items():
            assert isinstance(cell[key], kind), (key, cell)
        assert cell["status"] in ("ok", "failed", "skipped")
        if cell["status"] == "ok":
            assert cell["median_s"] > 0 and cell["rows_per_s"] > 0
            assert cell["low_s"] <= cell["median_s"] <= cell["high_s"]
    # one cell per variant and group; vectorized only where the function has a twin
    names = {(c["workload"], c["rows"], c["workers"], c["executor"]) for c in data["cells"]}
    assert len(names) == len(data["cells"])
    assert ("side_context_small", 4, 1, "vectorized") in names
    assert ("noop", 4, 1, "vectorized") not in names
    assert ("noop", 4, 1, "auto_first") in names


@pytest.mark.timeout(120)
def test_winner_is_the_lowest_median(data: dict[str, Any]) -> None:
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for c in data["cells"]:
        groups[c["workload"], c["rows"], c["workers"]].append(c)
    assert len(groups) == 3 * 2 * 2
    for key, cells in groups.items():
        ok = [c for c in cells if c["status"] == "ok" and c["contender"]]
        best = min(ok, key=lambda c: c["median_s"])
        assert [c["executor"] for c in cells if c["winner"]] == [best["executor"]], key
        serial = next(c for c in cells if c["executor"] == "serial")
        for c in ok:
            assert c["speedup"] == pytest.approx(serial["median_s"] / c["median_s"])
    # auto and its first call are judged against the best executor, never winners themselves
    assert not any(c["winner"] for c in data["cells"] if c["executor"].startswith("auto"))


@pytest.mark.timeout(120)
def test_auto_against_the_best_executor(data: dict[str, Any]) -> None:
    auto = data["auto"]
    assert auto["threshold"] == 1.25 and len(auto["groups"]) == 12
    startup = {(s["executor"], s["workers"]): s["startup_s"] or 0.0 for s in data["startup"]}
    cells = {(c["workload"], c["rows"], c["workers"], c["executor"]): c for c in data["cells"]}
    for g in auto["groups"]:
        key = (g["workload"], g["rows"], g["workers"])
        execs = {
            name: cells[(*key, name)]
            for name in REGISTRY
            if name != "auto" and (*key, name) in cells and cells[(*key, name)]["status"] == "ok"
        }
        # the best *executor*: the loop baseline may win the group, but is not one
        assert g["best"] in execs and g["best"] != "loop"
        assert g["best_s"] == min(c["median_s"] for c in execs.values())
        assert g["auto_ratio"] == pytest.approx(g["auto_s"] / g["best_s"])
        assert g["auto_first_ratio"] == pytest.approx(g["auto_first_s"] / g["best_s"])
        # N calls of one pool: auto's first call, then N - 1 of its warm median
        warm = cells[(*key, "auto")]
        assert g["calls"] == 1 + len(warm["samples_s"])
        want = g["auto_first_s"] + (g["calls"] - 1) * warm["median_s"]
        assert g["auto_calls_s"] == pytest.approx(want)
        # against each executor's start-up plus N of its median calls, the lowest
        best_calls = min(
            startup.get((name, g["workers"]), 0.0) + g["calls"] * c["median_s"]
            for name, c in execs.items()
        )
        assert g["best_calls_s"] == pytest.approx(best_calls)
        assert g["auto_calls_ratio"] == pytest.approx(g["auto_calls_s"] / best_calls)
    for name in ("auto_ratio", "auto_first_ratio", "auto_calls_ratio"):
        within = sum(g[name] <= 1.25 for g in auto["groups"]) / len(auto["groups"])
        assert auto[name.replace("ratio", "within")] == pytest.approx(within)


# ---------------------------------------------------------------- failures are cells


@pytest.mark.timeout(120)
def test_failures_become_cells_and_the_run_goes_on() -> None:
    grid = Grid(
        workloads=(
            Workload("no_batch", noop, bench_user.broken_factory, "the factory raises"),
            Workload("raises", bench_user.failing_row, bench_user.make_batch, "fn raises"),
            Workload("main_only", bench_user.main_thread_only, lambda n: torch.ones(n, 2), ""),
            "noop",
        ),
        executors=("serial", "threads", "loop"),
        rows=(4,),
        workers=(2,),
        repeat=1,
    )
    results = run(grid)
    by = {(c.workload, c.executor): c for c in results.cells}
    for name in ["serial", "threads", "loop"]:
        assert by["no_batch", name].status == "failed"
        assert "cannot read the data for 4 rows" in by["no_batch", name].note
        assert by["raises", name].status == "failed"
        assert "always fails" in by["raises", name].note
        assert by["noop", name].status == "ok"
    assert by["main_only", "threads"].status == "failed"
    assert "off the main thread" in by["main_only", "threads"].note
    assert by["main_only", "serial"].status == by["main_only", "loop"].status == "ok"
    assert not by["main_only", "threads"].winner
    assert [k[0] for k in results.broken()] == ["no_batch", "raises"]
    json.dumps(results.to_dict())  # failed cells serialize too


@pytest.mark.timeout(120)
def test_vmap_refusing_a_function_is_skipped_not_failed() -> None:
    """sleep_row reads its row's value, which vmap cannot trace: expected, so the
    progress line counts no failure, and the cell says why it has no figure."""
    grid = Grid(workloads=("sleep",), executors=("serial", "vmap"), rows=(4,), workers=(1,),
                repeat=1)  # fmt: skip
    lines: list[str] = []
    results = run(grid, progress=lines.append)
    by = {c.executor: c for c in results.cells}
    assert by["serial"].status == "ok"
    assert by["vmap"].status == "skipped" and not by["vmap"].winner
    assert by["vmap"].note.startswith("VmapUnsupported: executor='vmap' cannot run sleep_row")
    assert not any("failed" in line for line in lines)
    assert results.broken() == []


def test_only_expected_refusals_are_skipped() -> None:
    assert status_of("VmapUnsupported: executor='vmap' cannot run f: ...") == "skipped"
    assert status_of("RuntimeError: vmap: It looks like you're calling .item()") == "failed"
    assert status_of("its result differs from the serial executor's") == "failed"


def test_plain_joblib_is_capped_by_what_it_ships() -> None:
    rows, reason = _naive_plan(256, 100 * 2**20)
    assert rows == 0 and "100 MB > 64 MB" in reason
    assert _naive_plan(256, 2**20) == (256, "")  # ships 256 MB a call: all rows
    assert _naive_plan(256, 32 * 2**20) == (8, "")  # timed on 8 rows, then scaled


# ---------------------------------------------------------------- command line


@pytest.mark.timeout(120)
def test_user_workload_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = bench_cli(
        "--fn", "tests.bench_user:scale_row", "--batch", "tests.bench_user:make_batch",
        "--executors", "serial,threads", "loop",
        "--rows", "4,8", "--workers", "2", "--repeat", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data["workloads"]) == ["user:scale_row"]
    assert "tests.bench_user:scale_row" in data["workloads"]["user:scale_row"]
    assert {c["executor"] for c in data["cells"]} == {"serial", "threads", "loop"}
    assert all(c["status"] == "ok" for c in data["cells"])
    out = capsys.readouterr().out
    assert "user:scale_row" in out and "Who wins where" in out


@pytest.mark.timeout(120)
def test_a_broken_user_workload_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = bench_cli(
        "--fn", "tests.bench_user:failing_row", "--batch", "tests.bench_user:make_batch",
        "--executors", "serial,loop", "--rows", "4", "--workers", "1", "--repeat", "1",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 1
    assert "always fails" in (tmp_path / "results.json").read_text()
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--fn", "tests.bench_user:scale_row"], "--fn was given without --batch"),
        (["--executors", "serial,turbo"], "'turbo' unknown; choose from serial"),
        (["--workloads", "nope"], "'nope' unknown; choose from"),
        (["--fn", "tests.bench_user:missing", "--batch", "x:y"], "has no 'missing'"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], match: str, capsys: pytest.CaptureFixture) -> None:
    assert bench_cli(*argv) == 2
    assert match in capsys.readouterr().err


def test_grid_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match=r"rows \[0\] are not positive integers"):
        Grid(rows=(0,))
    with pytest.raises(ConfigError, match="repeat=0"):
        Grid(repeat=0)


@pytest.mark.timeout(300)
def test_quick_smoke(tmp_path: Path) -> None:
    """``python -m benchmarks --quick`` runs its small grid whole: every variant (processes and
    joblib included) in every group of the quick workloads, two repeats a cell."""
    assert bench_cli("--quick", "--out", str(tmp_path)) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    workers = min(2, available_cores())
    assert data["grid"]["rows"] == [8, 64] and data["grid"]["repeat"] == 2
    assert data["grid"]["workers"] == [workers]
    groups = defaultdict(list)
    for c in data["cells"]:
        groups[c["workload"], c["rows"], c["workers"]].append(c["executor"])
    assert set(groups) == {(w, r, workers) for w in QUICK_WORKLOADS for r in (8, 64)}
    for (workload, _, _), names in groups.items():  # a cell for every variant it plans
        assert names == _names(WORKLOADS[workload], Grid.quick()), workload
        assert {"processes", "joblib", "auto_first", "plain_joblib"} <= set(names)
    assert "vectorized" in groups["side_context_small", 8, workers]  # it has a batched twin
    timed = [c for c in data["cells"] if c["status"] == "ok" and c["executor"] != "auto_first"]
    assert timed and all(len(c["samples_s"]) == 2 for c in timed)
    assert {s["executor"] for s in data["startup"]} == {"threads", "processes", "joblib"}
    assert (tmp_path / "winners.png").exists()


# ---------------------------------------------------------------- pieces


def test_without_matplotlib_the_pngs_are_skipped(
    tiny: tuple[Results, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    notes: list[str] = []
    written = write(tiny[0], tmp_path, note=notes.append)
    assert notes == ["matplotlib is not installed: PNG plots skipped (pip install 'prep[bench]')"]
    assert sorted(p.name for p in written) == ["report.md", "results.json", "table.txt"]
    assert not list(tmp_path.glob("*.png"))
    assert "![" not in (tmp_path / "report.md").read_text()


def test_loop_baseline_stacks_every_structure() -> None:
    x, y = torch.arange(6.0).view(3, 2), torch.ones(3, 2)
    assert torch.equal(loop_stack(torch.neg, x), -x)
    pair = loop_stack(lambda a, b: (a + b, a.sum()), (x, y))
    assert torch.equal(pair[0], x + y) and torch.equal(pair[1], x.sum(1))
    named = loop_stack(lambda a, b: {"d": a - b}, {"a": x, "b": y})
    assert torch.equal(named["d"], x - y)
    with pytest.raises(TypeError, match="Tensor, a tuple/list or a dict"):
        loop_stack(torch.neg, 3)


def test_user_workload_names_its_source() -> None:
    w = user_workload("tests.bench_user:scale_row", "tests.bench_user:make_batch")
    assert w.name == "user:scale_row" and w.fn is bench_user.scale_row
    with pytest.raises(ConfigError, match="is not MODULE:NAME"):
        user_workload("scale_row", "tests.bench_user:make_batch")
