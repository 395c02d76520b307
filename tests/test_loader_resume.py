"""prep.Loader stopped after k batches, its state saved, and resumed in a fresh
interpreter: the batches after the resume are those of an uninterrupted run, and
each is a plain loop's over its samples (issue 40's "done means", for the Loader)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import run_script

ROOT = str(Path(__file__).resolve().parents[1])
STOPS = (0, 1, 7)

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import torch, prep

mode, executor, folder = sys.argv[1:]

class Squares:  # of __main__: sent by value to worker processes, once
    def __len__(self):
        return 45

    def __getitem__(self, i):
        return torch.tensor([float(i), float(i * i)])

def augment(sample, rng):
    return torch.cat([sample * 2 + 1, torch.rand(2, generator=rng)])

def loader():
    return prep.Loader(
        Squares(), augment, batch_size=4, shuffle=True, seed=11, executor=executor,
        workers=2, prefetch=4,
    )

if mode == "save":
    torch.save(list(loader()), f"{{folder}}/whole.pt")
    for k in {stops}:
        stopped = loader()
        with iter(stopped) as epoch:
            taken = [next(epoch) for _ in range(k)]
        with open(f"{{folder}}/state{{k}}.json", "w") as f:
            json.dump(stopped.state_dict(), f)
else:
    for k in {stops}:
        resumed = loader()
        with open(f"{{folder}}/state{{k}}.json") as f:
            resumed.load_state_dict(json.load(f))
        torch.save(list(resumed), f"{{folder}}/rest{{k}}.pt")
print("OK")
"""


@pytest.mark.parametrize("executor", ["serial", "threads", "processes"])
@pytest.mark.timeout(300)
def test_a_loader_resumes_in_a_fresh_interpreter(executor, tmp_path):
    script = textwrap.dedent(SCRIPT.format(root=ROOT, stops=STOPS))
    run_script(script, "save", executor, str(tmp_path))
    run_script(script, "resume", executor, str(tmp_path))
    whole = torch.load(tmp_path / "whole.pt")
    assert len(whole) == 12  # 45 samples in 4s, the last of 1
    seen = []
    for batch in whole:  # each row is its sample's, by the index it carries
        indices = [int(i) for i in (batch[:, 0] - 1) / 2]
        samples = torch.tensor([[float(i), float(i * i)] for i in indices])
        assert torch.equal(batch[:, :2], samples * 2 + 1)
        seen += indices
    assert sorted(seen) == list(range(45)) and seen != list(range(45))  # shuffled
    for k in STOPS:
        rest = torch.load(tmp_path / f"rest{k}.pt")
        assert len(rest) == 12 - k, k
        assert all(torch.equal(a, b) for a, b in zip(rest, whole[k:])), k
