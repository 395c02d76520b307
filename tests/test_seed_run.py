"""``seed=`` where the batches are not the caller's: ``Collate`` inside a real DataLoader
(its batch ``i`` of an epoch draws the same at any ``num_workers``), and ``prep run
--seed`` (a shard's rows draw the same whatever runs them, after ``--resume`` and on
``--cluster local``). The references are loops that seed each row themselves."""

from __future__ import annotations

import hashlib
import pathlib
import random
import signal

import numpy as np
import pytest
import torch

import prep
from prep.core.seeding import mix
from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest

from . import seedfns
from .conftest import descendants, wait_until
from .test_cli import Child, alive, cli, outputs, temps_in


def seeded_loop(fn, rows, seed: int, **kw) -> torch.Tensor:
    """What a loop gives when it seeds every generator itself for row ``i`` from
    ``mix(seed, i)``, as seed= promises."""
    out = []
    for i, row in enumerate(rows):
        s = mix(seed, i)
        torch.random.default_generator.manual_seed(s)
        random.seed(s)
        np.random.seed(s % 2**32)
        if "rng" in kw:
            kw["rng"].manual_seed(s)
        out.append(fn(row, **kw))
    return torch.stack(out)


# ------------------------------------------------------------------ Collate


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(8.0) + 100 * i


def collate_loop(seed: int, epochs: int, batch: int) -> list[torch.Tensor]:
    """Batch ``i`` of epoch ``e``: each row seeded under ``mix(mix(seed, e), i)``."""
    data = Numbers()
    rng, out = torch.Generator(), []
    for e in range(epochs):
        for i in range(len(data) // batch):
            rows = [data[k] for k in range(i * batch, (i + 1) * batch)]
            key = mix(mix(seed, e), i)
            out.append(seeded_loop(seedfns.crop_and_flip, rows, key, rng=rng))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("num_workers", "context"), [(0, None), (1, "fork"), (2, "fork"), (2, "spawn")]
)
@pytest.mark.parametrize("executor", ["serial", "auto", "threads"])
def test_collate_gives_each_batch_the_same_draws_at_any_num_workers(num_workers, context, executor):
    want = collate_loop(7, epochs=2, batch=4)
    collate = prep.Collate(seedfns.crop_and_flip, executor=executor, workers=2, seed=7)
    loader = torch.utils.data.DataLoader(
        Numbers(), batch_size=4, collate_fn=collate, num_workers=num_workers,
        multiprocessing_context=context,
    )  # fmt: skip
    got = []
    for epoch in range(2):
        collate.set_epoch(epoch)
        got += list(loader)
    collate.close()
    assert len(got) == len(want)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[0], got[len(got) // 2])  # the epoch changes the draws


# ------------------------------------------------------------------ prep run --seed


def shards(folder: pathlib.Path, n: int = 6, rows: int = 5) -> None:
    for k in range(n):
        x = (10.0 * k + torch.arange(rows, dtype=torch.float32))[:, None].expand(rows, 3)
        W.save_shard({"x": x.contiguous()}, folder / f"s{k}.pt", "pt")


def run_loop(fn, folder: pathlib.Path, seed: int) -> dict[str, torch.Tensor]:
    """Each shard's rows keyed under the seed and the shard's path inside the folder."""
    out = {}
    for p in sorted(folder.iterdir()):
        rel = p.relative_to(folder).as_posix()
        path = int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=8).digest(), "big")
        out[p.name] = seeded_loop(fn, S.load_shard(p)["x"], mix(seed, path))
    return out


FN = ["--fn", "tests.seedfns:noisy", "--columns", "x", "--seed", "7"]


@pytest.mark.timeout(240)
def test_prep_run_seed_gives_the_loops_rows_whatever_runs_them(tmp_path, no_leaks):
    data = tmp_path / "data"
    data.mkdir()
    shards(data)
    want = run_loop(seedfns.noisy, data, 7)
    runs = {
        "shards-2": ["--parallel", "shards", "--workers", "2"],
        "shards-1": ["--parallel", "shards", "--workers", "1"],
        "rows-processes": ["--parallel", "rows", "--executor", "processes", "--workers", "2"],
        "auto": [],
    }
    made = {}
    for name, how in runs.items():
        out = tmp_path / name
        assert cli("run", data, "--out", out, *FN, *how, "--quiet") == 0, name
        made[name] = outputs(out)
        for shard, rows in want.items():
            assert torch.equal(S.load_shard(out / shard)["out"], rows), (name, shard)
    assert all(m == made["auto"] for m in made.values())  # byte for byte
    entry = next(iter(Manifest(tmp_path / "auto").entries().values()))
    assert entry["seed"] == 7  # in the recipe: another seed is other work for --resume


@pytest.mark.timeout(180)
def test_prep_run_seed_on_threads_stops_a_function_that_draws_from_the_globals(tmp_path, capsys):
    """Threads seed nothing global: the shard fails at the draw, in one line naming
    the fix, and no shard is written unseeded."""
    data = tmp_path / "data"
    data.mkdir()
    shards(data, n=1)
    assert cli("run", data, "--out", tmp_path / "o", *FN, "--executor", "threads") == 1
    err = capsys.readouterr().err
    assert "rng" in err and "moved while" in err and "Traceback" not in err
    assert not list((tmp_path / "o").glob("*.pt"))


SLOW = ["--fn", "tests.seedfns:noisy_slowly", "--columns", "x", "--seed", "7"]


@pytest.mark.timeout(240)
def test_prep_run_seed_killed_and_resumed_gives_the_bytes_of_a_clean_run(tmp_path):
    data, clean, out = tmp_path / "data", tmp_path / "clean", tmp_path / "out"
    data.mkdir()
    shards(data, n=8, rows=6)
    assert cli("run", data, "--out", clean, *SLOW, "--quiet") == 0
    child = Child("run", data, "--out", out, *SLOW, "--parallel", "shards", "--workers", "2")
    assert child.wait_for(2)
    workers = descendants(child.proc.pid)
    child.proc.kill()
    assert child.finish() == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in workers), timeout=15), workers
    again = Child("run", data, "--out", out, *SLOW, "--workers", "1", "--resume")
    assert again.finish(timeout=180) == 0, again.stderr
    assert outputs(out) == outputs(clean)
    assert temps_in(out) == []


@pytest.mark.timeout(240)
def test_prep_run_seed_on_a_local_cluster_gives_the_same_bytes(tmp_path):
    pytest.importorskip("distributed")
    data = tmp_path / "data"
    data.mkdir()
    shards(data, n=4)
    assert cli("run", data, "--out", tmp_path / "here", *FN, "--quiet") == 0
    assert cli("run", data, "--out", tmp_path / "dask", *FN, "--cluster", "local", "--quiet") == 0
    assert outputs(tmp_path / "dask") == outputs(tmp_path / "here")
