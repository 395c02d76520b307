"""The peer tools (``prep bench --peers``' two and the harness's six more): their
mechanics, skipping, failing, a harness run, its command line.

Mechanics only: each installed peer's output must equal the serial executor's
(a fresh batch on a warm pool too), a missing package is a skipped peer, a
peer that cannot run a function is a failed cell, and no worker outlives a
run. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from collections.abc import Iterator
from multiprocessing import forkserver as mp_forkserver
from pathlib import Path
from typing import Any

import pytest
import torch

import prep
from benchmarks import libraries as libraries_module
from benchmarks.alternatives import against_peers
from benchmarks.command import PROG, command, configure, grid_from
from benchmarks.grid import Grid
from benchmarks.harness import run
from benchmarks.libraries import LIBRARY_WORKLOADS
from benchmarks.peer_loaders import _new_threads_default
from benchmarks.peers import PEERS, available, first_call
from benchmarks.workloads import WORKLOADS, Workload
from prep.bench.peers import PeerRows, session
from prep.bench.verify import check

from . import rowfns
from .conftest import descendants, pool_children, wait_until

INSTALLED, MISSING = available(list(PEERS))


@pytest.fixture(scope="module")
def forkserver() -> Iterator[None]:
    """multiprocessing's forkserver, torch preloaded, as a run has it (and stopped after)."""
    with session():
        yield


def serial(fn: Any, batch: Any, samples: bool = False) -> Any:
    if samples:
        return prep.map_samples(fn, batch, executor="serial")
    return prep.map_rows(fn, batch, executor="serial")


def same(got: Any, want: Any) -> bool:
    """The bench's own check: equal to serial's result (floats within rounding)."""
    return check(lambda: got, want, rows=1 << 30) == ""


# ---------------------------------------------------------------- each peer, alone


def test_the_session_leaves_the_forkserver_as_it_found_it() -> None:
    server = mp_forkserver._forkserver  # multiprocessing's one, that every peer shares
    was = server._forkserver_pid
    with session():
        started = server._forkserver_pid
        assert started is not None
    assert server._forkserver_pid == was
    if was is None:  # this test ran first: the session started it, and stopped it
        assert started not in descendants()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(PEERS))
def test_each_peer_matches_serial(name: str, forkserver: None, no_leaks: None) -> None:
    if name in MISSING:
        pytest.skip(MISSING[name])
    pairs = (torch.randn(12, 5, 3), torch.randn(12, 5, 3))
    fresh = (torch.randn(12, 5, 3), torch.randn(12, 5, 3))
    pool = PEERS[name].pool(PeerRows(rowfns.pair, samples=False, keywords=False), workers=2)
    try:
        assert same(pool.run(pairs), serial(rowfns.pair, pairs))
        # warm: the same pool, a new batch (the DataLoader refills its shared rows)
        assert same(pool.run(fresh), serial(rowfns.pair, fresh))
    finally:
        pool.close()
    text_re = LIBRARY_WORKLOADS["text_re"]
    texts = text_re.batch(10)
    pool = PEERS[name].pool(PeerRows(text_re.fn, samples=True, keywords=False), workers=2)
    try:
        assert same(pool.run(texts), serial(text_re.fn, texts, samples=True))
    finally:
        pool.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["mp_pool", "dataloader", "cf_threads"])
def test_a_dict_batch_goes_by_keyword(name: str, forkserver: None, no_leaks: None) -> None:
    batch = {"x": torch.randn(9, 4), "y": torch.randn(9, 4)}
    pool = PEERS[name].pool(PeerRows(rowfns.named, samples=False, keywords=True), workers=2)
    try:
        got, want = pool.run(batch), serial(rowfns.named, batch)
    finally:
        pool.close()
    assert set(got) == {"sum", "flip"}
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.timeout(60)
def test_closing_a_pool_twice_is_harmless_started_or_not(forkserver: None, no_leaks: None) -> None:
    """An unstarted pool closes without starting anything, stays usable, and a started
    one closed twice leaves no worker (``no_leaks`` waits for them to be gone)."""
    before = set(pool_children())
    pool = PEERS["mp_pool"].pool(PeerRows(rowfns.identity, samples=False, keywords=False), 2)
    pool.close()
    pool.close()
    assert set(pool_children()) == before
    x = torch.arange(6.0).view(3, 2)
    try:
        assert torch.equal(pool.run(x), x)  # the next run starts it afresh
        assert set(pool_children()) > before
    finally:
        pool.close()
        pool.close()


# ---------------------------------------------------------------- skipped, failed


def test_a_missing_package_is_a_skipped_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    def importable(module: str) -> str:
        return "mpire does not import (ModuleNotFoundError: none here)" * (module == "mpire")

    monkeypatch.setattr(libraries_module, "_importable", importable)
    ok, skipped = available(["mpire", "cf_threads"])
    assert ok == ["cf_threads"]
    assert "mpire does not import" in skipped["mpire"]
    assert "pip install 'prep[peers]'" in skipped["mpire"]
    grid = Grid(workloads=("noop",), executors=("serial",), rows=(4,), workers=(2,), repeat=1)
    res = run(grid, peers=["mpire", "cf_threads"])
    by = {c.executor: c for c in res.cells}
    assert by["mpire"].status == "skipped" and "mpire does not import" in by["mpire"].note
    assert first_call("mpire") not in by  # a peer that cannot run has no first call either
    assert by["cf_threads"].status == "ok"
    assert against_peers(res)["skipped"] == {"mpire": by["mpire"].note}


@pytest.mark.timeout(60)
def test_a_peer_that_cannot_pickle_a_lambda_is_a_failed_cell(no_leaks: None) -> None:
    lam = Workload("lambda", lambda row: row * 2, lambda rows: torch.ones(rows, 3), "a lambda")
    grid = Grid(workloads=(lam,), executors=("serial",), rows=(6,), workers=(2,), repeat=1)
    res = run(grid, peers=["mp_pool", "cf_threads"])
    by = {c.executor: c for c in res.cells}
    for name in ("mp_pool", first_call("mp_pool")):
        assert by[name].status == "failed" and "pickle" in by[name].note.lower(), by[name]
    assert by["cf_threads"].status == "ok" and by[first_call("cf_threads")].status == "ok"


# ---------------------------------------------------------------- a whole run


@pytest.mark.timeout(90)
def test_a_tiny_run_with_every_peer(tmp_path: Path, no_leaks: None) -> None:
    prep.shutdown()  # the warm pools of earlier tests are not this test's business
    assert wait_until(lambda: not pool_children()), pool_children()
    before = set(descendants())
    threads = (torch.get_num_threads(), _new_threads_default())
    grid = Grid(
        workloads=("tokenize",), executors=("serial", "auto"), rows=(8,), workers=(2,), repeat=1
    )
    res = run(grid, peers=True, out=tmp_path)
    by = {c.executor: c for c in res.cells}
    for name in INSTALLED:
        for cell in (by[name], by[first_call(name)]):
            assert cell.status == "ok", (cell.executor, cell.note)
        assert not by[first_call(name)].contender and by[name].contender
    for name in MISSING:
        assert by[name].status == "skipped"
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["grid"]["peers"] == list(PEERS)
    assert {c["executor"] for c in data["cells"]} >= set(INSTALLED)
    (group,) = data["peers"]["groups"]
    assert group["best_peer"] in INSTALLED and group["best"] == "serial"
    report = (tmp_path / "report.md").read_text()
    assert "## prep against the alternatives" in report and "| best peer" in report
    assert "forkserver" in report
    # torchdata's thread workers set torch's threads to 1 for every new thread: put back
    assert (torch.get_num_threads(), _new_threads_default()) == threads
    # every peer's workers are gone, and so is the forkserver the run started for them
    assert multiprocessing.active_children() == []
    assert wait_until(lambda: not pool_children()), pool_children()
    assert wait_until(lambda: set(descendants()) - before <= _servers()), descendants()


def _servers() -> set[int]:
    """The per-interpreter helpers multiprocessing and loky keep by design."""
    return {p for p, cmd in descendants().items() if "resource_tracker" in cmd}


def test_a_library_workload_that_cannot_run_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libraries_module, "_importable", lambda m: f"{m} does not import")
    grid = Grid(workloads=("numpy_rfft",), executors=("serial",), rows=(4,), workers=(1,))
    res = run(grid, peers=["cf_threads"])
    assert {c.status for c in res.cells} == {"skipped"}
    assert all("numpy does not import" in c.note for c in res.cells)
    assert not res.broken()


# ---------------------------------------------------------------- the CLI


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG)
    configure(parser)
    return parser.parse_args(argv)


def test_the_peers_flag_parses() -> None:
    assert grid_from(parse()).peers == ()
    every = grid_from(parse("--peers"))
    assert every.peers == tuple(PEERS)
    assert set(LIBRARY_WORKLOADS) <= set(every.workloads)  # the real libraries' too
    some = grid_from(parse("--peers", "mpire,cf_threads", "dataloader", "--workloads", "noop"))
    assert some.peers == ("mpire", "cf_threads", "dataloader")
    assert some.workloads == ("noop",)
    assert "text_re" in grid_from(parse("--quick", "--peers")).workloads


def test_an_unknown_peer_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--peers", "ray")
    assert command(args) == 2
    assert "peers 'ray' unknown; choose from mp_pool" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_peers_run_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_leaks: None
) -> None:
    args = parse(
        "--peers", "cf_threads", "dataloader", "--workloads", "side_context_small",
        "--executors", "serial", "threads", "--rows", "8", "--workers", "2", "--repeat", "1",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert command(args) == 0
    out = capsys.readouterr().out
    assert "prep against the alternatives" in out and "DataLoader (persistent workers)" in out
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert {c["executor"] for c in cells} == {
        "serial", "threads", "cf_threads", "cf_threads_first", "dataloader", "dataloader_first"
    }  # fmt: skip
    assert all(c["status"] == "ok" for c in cells), [c["note"] for c in cells]
    assert "## prep against the alternatives" in (tmp_path / "report.md").read_text()


def test_the_built_in_workloads_are_all_runnable_by_name() -> None:
    grid = Grid(workloads=(*WORKLOADS, *LIBRARY_WORKLOADS))
    assert [w.name for w in grid.resolved()] == [*WORKLOADS, *LIBRARY_WORKLOADS]
