"""prep's main job in one minute: the side-context loop from the question, done right.

    scripts/demo            # sets up .venv, then runs this file

1. the seed's per-row loop vs every executor on one batch (same result, timed);
2. what ``auto`` measures and picks, for this op and for a GIL-bound function;
3. the same op as a DataLoader ``collate_fn``;
4. a folder of saved shards preprocessed by the ``prep run`` command.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import prep
from prep.bench import interleaved, table
from prep.bench.baselines import side_context_loop
from prep.bench.workloads import python_work, side_context_batch
from prep.ops import side_context, side_context_row


def compare_executors() -> None:
    print("1. Left context (max_len=64) of a [256, 256, 128] float32 batch around a span\n")
    x, mask = side_context_batch(256, 256, 128)
    want = side_context(x, mask, max_len=64)
    row_fn = functools.partial(side_context_row, max_len=64)
    variants = {
        "seed-style loop + torch.stack": lambda: side_context_loop(x, mask, side="left", max_len=64)
    }
    for name in ["serial", "threads", "processes", "joblib", "vectorized", "auto"]:
        variants[f"map_rows(executor={name!r})"] = functools.partial(
            prep.map_rows, row_fn, (x, mask), executor=name, workers=2
        )
    for name, run in variants.items():  # every variant gives the same tensor
        assert torch.equal(run(), want), name
    times = interleaved(variants, repeat=5)
    base = times["seed-style loop + torch.stack"].median
    print(
        table(
            [
                [name, f"{t.median * 1e3:.1f}", f"{base / t.median:.1f}x"]
                for name, t in times.items()
            ],
            ["variant", "ms (median of 5)", "vs loop"],
        )
    )
    print()


def show_auto() -> None:
    print("2. What executor='auto' measures and picks\n")
    x, mask = side_context_batch(1024, 128, 16)
    print(prep.explain(functools.partial(side_context_row, max_len=16), (x, mask)), "\n")
    print(prep.explain(python_work, torch.arange(256.0).view(256, 1) + 1), "\n")


class Sentences(Dataset):
    """(tokens, mask) samples of varying length, a span marked in each."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = 20 + (i * 7) % 30
        tokens = torch.arange(n) + 100 * i
        mask = torch.zeros(n, dtype=torch.bool)
        mask[n // 2 : n // 2 + 2] = True
        return tokens, mask


def left_context(sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, mask = sample
    return side_context_row(tokens, mask, max_len=8)


def dataloader() -> None:
    print("3. As a DataLoader collate_fn (token ids, 8 tokens of left context each)\n")
    collate = prep.Collate(left_context, executor="threads", workers=2)
    loader = DataLoader(Sentences(), batch_size=16, collate_fn=collate)
    for step, batch in enumerate(loader):
        if step == 0:
            print(f"   batch {tuple(batch.shape)} {batch.dtype}; first row: {batch[0].tolist()}")
    collate.close()
    print(f"   {step + 1} batches\n")


def shards() -> None:
    from prep.cli import main

    print("4. Saved shards through the CLI: prep make-shards, then prep run\n")
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp, "data"), Path(tmp, "out")
        main(
            [
                "make-shards",
                "--out",
                str(data),
                "--shards",
                "4",
                "--rows",
                "64",
                "--seq",
                "128",
                "--dim",
                "32",
                "--quiet",
            ]
        )
        code = main(
            [
                "run",
                str(data),
                "--out",
                str(out),
                "--fn",
                "prep.ops:side_context_row",
                "--arg",
                "max_len=16",
                "--workers",
                "2",
            ]
        )
        print(f"   exit code {code}; wrote {sorted(p.name for p in out.iterdir())}\n")


def main() -> int:
    print(f"prep {prep.__version__}, torch {torch.__version__}, {prep.info()['cores']} cores\n")
    compare_executors()
    show_auto()
    dataloader()
    shards()
    prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
