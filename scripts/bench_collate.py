"""prep.Collate in a real DataLoader: the seed's side-context task as a collate_fn.

One epoch of a Dataset of (features [128, 32], span mask [128]) samples, batches
of 256, for each variant with num_workers 0 and 2 (persistent workers, one
warm-up epoch); medians of interleaved repeats. Run it alone:

    python scripts/bench_collate.py           # the table in the README
    python scripts/bench_collate.py --quick   # a smoke test
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import prep
from prep.bench import interleaved, table
from prep.ops import side_context_row

SEQ, DIM, MAX_LEN = 128, 32, 32


class Spans(Dataset):
    """Token features with one masked span each (what a tokenizer + tagger gives)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, SEQ, DIM, generator=g)
        start = torch.randint(0, SEQ, (n, 1), generator=g)
        pos = torch.arange(SEQ)
        self.mask = (pos >= start) & (pos < start + 3)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.mask[i]


def left_context(sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return side_context_row(*sample, max_len=MAX_LEN)


def loop_collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """What users write: a Python loop in the collate_fn, then torch.stack."""
    return torch.stack([left_context(s) for s in samples])


def variants() -> dict[str, object]:
    row = functools.partial(side_context_row, max_len=MAX_LEN)
    made: dict[str, object] = {"Python loop + torch.stack": loop_collate}
    for name in ["serial", "threads", "processes", "joblib", "auto"]:
        made[f"prep.Collate({name})"] = prep.Collate(left_context, executor=name, workers=2)
    made["prep.Collate(vectorized, collate=default_collate)"] = prep.Collate(
        row, executor="vectorized", collate=default_collate
    )
    return made


def epoch(loader: DataLoader) -> int:
    rows = 0
    for batch in loader:
        rows += len(batch)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    samples, repeat = (512, 2) if args.quick else (args.samples, args.repeat)
    data = Spans(samples)
    want = torch.cat(
        [
            loop_collate([data[i] for i in range(k, min(k + 256, samples))])
            for k in range(0, samples, 256)
        ]
    )
    rows: list[list[str]] = []
    for workers in (0, 2):
        loaders = {
            name: DataLoader(
                data,
                batch_size=256,
                collate_fn=fn,
                num_workers=workers,
                persistent_workers=workers > 0,
                multiprocessing_context="fork" if workers else None,
            )
            for name, fn in variants().items()
        }
        for name, loader in loaders.items():  # same batches as the loop (and warm workers)
            assert torch.equal(torch.cat(list(loader)), want), name
        times = interleaved(
            {n: functools.partial(epoch, ld) for n, ld in loaders.items()}, repeat=repeat, warmup=0
        )
        base = times["Python loop + torch.stack"].median
        rows += [
            [
                str(workers),
                name,
                f"{t.median * 1e3:.0f}",
                f"{samples / t.median:,.0f}",
                f"{base / t.median:.2f}x",
            ]
            for name, t in times.items()
        ]
        for loader in loaders.values():
            fn = loader.collate_fn
            if isinstance(fn, prep.Collate):
                fn.close()
        del loaders
    print(
        f"{samples} samples of [{SEQ}, {DIM}] float32 + mask, batches of 256, left "
        f"context max_len={MAX_LEN}; torch {torch.__version__}, {prep.info()['cores']} cores, "
        f"repeat={repeat}\n"
    )
    print(table(rows, ["num_workers", "collate_fn", "ms/epoch", "samples/s", "vs loop"]))
    prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
