"""Every worker process prep starts draws from generators of its own: random rows never
repeat another worker's draws, on any executor the registry gives, at any worker count,
through ``map_rows``, ``imap``, ``auto``'s streams and ``prep run``'s whole-shard workers;
the caller's generators are left as they were; and a worker's traceback names the
user's file.

The references are what a loop gives: 64 random rows, each different from every other
(a repeat of 4 floats by chance has odds of about 2**-90).
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import prep
from prep.run import RunConfig, run_shards
from prep.run import save as W
from prep.run import shards as S
from prep.stream import strategy
from tests import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 64


def torch_draw(row: torch.Tensor) -> torch.Tensor:
    return 1 + torch.rand(4)


def random_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.tensor([random.random() for _ in range(4)])


def numpy_draw(row: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.random.rand(4))


def drawn_where(row: torch.Tensor) -> torch.Tensor:
    """A torch draw and the pid that drew it."""
    return torch.tensor([torch.rand(()).item(), float(os.getpid())], dtype=torch.float64)


def distinct(rows: torch.Tensor) -> int:
    return len({tuple(r.tolist()) for r in rows})


#: (row function, what it needs of an executor) for each generator a row may draw from
DRAWS = {
    "torch": (torch_draw, (registry.NO_TWIN, registry.TORCH_DRAWS)),
    "random": (random_draw, (registry.NO_TWIN, registry.GLOBAL_DRAWS)),
    "numpy": (numpy_draw, (registry.NO_TWIN, registry.GLOBAL_DRAWS)),
}


def cases() -> list:
    params = []
    for gen, (_, needs) in DRAWS.items():
        for ex in registry.executors(*needs):
            for workers in (2, 3):
                params.append(pytest.param(gen, ex, workers, id=f"{gen}-{ex}-{workers}"))
    return params


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("gen", "executor", "workers"), cases())
def test_map_rows_never_repeats_a_draw(gen, executor, workers):
    fn = DRAWS[gen][0]
    with prep.Pool(executor, workers=workers) as pool:
        for _ in range(2):  # the second batch runs on workers that are already up
            out = pool.map_rows(fn, torch.zeros(ROWS, 2))
            assert distinct(out) == ROWS


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("gen", "executor", "workers"), cases())
def test_imap_never_repeats_a_draw(gen, executor, workers):
    fn = DRAWS[gen][0]
    strategies = ["split"] + (["whole"] if executor in registry.executors(registry.WHOLE) else [])
    for how in strategies:
        with prep.Pool(executor, workers=workers) as pool:
            batches = [torch.zeros(ROWS // 4, 2) for _ in range(4)]
            out = torch.cat(list(pool.imap(fn, batches, strategy=how)))
        assert distinct(out) == ROWS, how


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn", [random_draw, numpy_draw])
def test_a_python_or_numpy_draw_is_refused_by_vmap_every_time(fn):
    """vmap calls the function once for every row: one draw would be every row's."""
    for ex in registry.without(registry.GLOBAL_DRAWS):
        (refusal,) = registry.refusals(ex, registry.GLOBAL_DRAWS)
        for _ in range(2):  # refused again: the check is not spent on the first call
            with pytest.raises(refusal.error, match=refusal.words):
                prep.map_rows(fn, torch.zeros(4, 2), executor=ex)
    out = prep.map_rows(fn, torch.zeros(ROWS, 2), executor="auto")  # auto leaves vmap out
    assert distinct(out) == ROWS


@pytest.mark.timeout(60)
def test_a_function_that_vmap_cannot_run_is_refused_by_its_registry_words():
    for ex in registry.without(registry.TORCH_DRAWS):
        (refusal,) = registry.refusals(ex, registry.TORCH_DRAWS)
        with pytest.raises(refusal.error, match=refusal.words):
            prep.map_rows(torch_draw, torch.zeros(4, 2), executor=ex)


@pytest.mark.timeout(120)
# the check of a named executor's first batch runs the function here: it must see that a
# random function gives other values each time (no false "computed differently" warning)
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("executor", registry.executors(registry.PROCESSES))
def test_the_callers_generators_are_as_they_were(executor):
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    with prep.Pool(executor, workers=2) as pool:  # workers started (and seeded) here
        for fn, _ in DRAWS.values():
            pool.map_rows(fn, torch.zeros(8, 2))
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])


@pytest.mark.timeout(60)
def test_a_caller_that_seeds_torch_starts_its_workers_from_the_same_seeds():
    from prep.executors._handles import worker_seed

    torch.manual_seed(7)
    first = [worker_seed(n) for n in range(3)]
    torch.rand(1)  # a draw moves the state: other seeds
    moved = [worker_seed(n) for n in range(3)]
    torch.manual_seed(7)
    again = [worker_seed(n) for n in range(3)]
    assert first == again and len(set(first)) == 3
    assert not set(first) & set(moved)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gen", sorted(DRAWS))
def test_whole_shard_workers_never_repeat_a_draw(tmp_path, gen):
    data = tmp_path / "data"
    for k in range(6):
        W.save_shard({"x": torch.zeros(8, 2)}, data / f"s{k}.pt", "pt")
    config = RunConfig(f"tests.test_worker_seeds:{DRAWS[gen][0].__name__}", columns=("x",))
    report = run_shards([data], tmp_path / "out", config, parallel="shards", jobs=2)
    assert report.exit_code == 0 and report.plan.startswith("shards:")
    rows = torch.cat([S.load_shard(p)["out"] for p in sorted((tmp_path / "out").glob("s*.pt"))])
    assert len(rows) == 48 and distinct(rows) == 48


@pytest.mark.timeout(120)
def test_autos_stream_on_processes_never_repeats_a_draw(monkeypatch):
    # the strategy's trial decides on this machine's speed: inject its verdict
    monkeypatch.setattr(
        strategy,
        "choose_among",
        lambda figures, margin=strategy.MARGIN: strategy.StrategyChoice(
            "whole", "injected", "processes"
        ),
    )
    samples = [torch.zeros(2)] * 640
    with prep.Pool("auto", workers=2) as pool:
        batches = list(
            pool.imap_samples(drawn_where, [samples[i : i + 32] for i in range(0, 640, 32)])
        )
    out = torch.cat(batches)
    assert set(out[:, 1].tolist()) - {float(os.getpid())}, "some batches ran on worker processes"
    assert distinct(out[:, :1]) == 640


SCRIPT = """
import torch
import prep


def encode(row):
    x = row.sum()
    raise ValueError("bad row")


prep.map_rows(encode, torch.zeros(4, 2), executor={executor!r}, workers=2)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", registry.executors(registry.PROCESSES))
def test_a_workers_traceback_names_the_users_file(tmp_path: pathlib.Path, executor):
    script = tmp_path / "encode_rows.py"
    text = textwrap.dedent(SCRIPT.format(executor=executor))
    script.write_text(text)
    line = text.splitlines().index('    raise ValueError("bad row")') + 1
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=110, env=env
    )
    assert done.returncode == 1
    # the worker's own frame: the user's file, the line, and its source
    assert re.search(
        rf'File "{re.escape(str(script))}", line {line}, in encode\n\s+raise', done.stderr
    )
    assert "<dynamic-code>" not in done.stderr
