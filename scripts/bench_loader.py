"""prep.Loader against DataLoader(num_workers=N) alone: the two tools, nothing else alive.

``bench_stream.py`` races eleven tools whose pools all stay warm in one process; this
races only these two, on the same jobs (the JPEG and image-pipeline jobs of
``bench_stream.py``), each an epoch at a time, interleaved, medians of the epochs after
the first (the Loader's first pays its pool's start and its strategy trial), outputs
checked equal to a plain loop's first.

    python scripts/bench_loader.py                      # augment and jpeg, 2 workers, 7 epochs
    python scripts/bench_loader.py --jobs augment --epochs 9 --workers 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_stream as B  # noqa: E402  (its jobs' row functions and data)

import prep  # noqa: E402
from prep.stream.stats import verdict  # noqa: E402

JOBS = {"augment": B.augment, "jpeg": B.decode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="augment,jpeg")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--images", type=int, default=1024)
    args = ap.parse_args(argv)
    os.environ["PREP_WISDOM"] = "off"  # every run a first run
    torch.set_num_threads(1)  # as the DataLoader's workers do
    items = B.make_jpegs(args.images)
    print(f"# bench_loader: {args.images} images, batches of 64, {args.workers} workers, "
          f"{args.epochs} epochs each, interleaved")  # fmt: skip
    for job in args.jobs.split(","):
        fn = JOBS[job]
        want = [B.stack([fn(x) for x in items[i : i + 64]]) for i in range(0, len(items), 64)]
        loader = prep.Loader(items, fn, batch_size=64, workers=args.workers)
        dl = torch.utils.data.DataLoader(
            B.ItemDataset(items, fn), batch_size=64, num_workers=args.workers,
            persistent_workers=True, collate_fn=B.stack,
        )  # fmt: skip
        for name, it in (("prep.Loader", loader), ("DataLoader", dl)):
            got = list(it)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{name}: rows differ"
        seconds: dict[str, list[float]] = {"prep.Loader": [], "DataLoader": []}
        for _ in range(args.epochs):
            for name, it in (("prep.Loader", loader), ("DataLoader", dl)):
                t = time.perf_counter()
                for _batch in it:
                    pass
                seconds[name].append(time.perf_counter() - t)
        rates = {k: len(items) / statistics.median(v[1:]) for k, v in seconds.items()}
        ratio = rates["prep.Loader"] / rates["DataLoader"]
        print(f"{job}: prep.Loader {rates['prep.Loader']:,.0f} items/s, DataLoader "
              f"{rates['DataLoader']:,.0f} items/s: {ratio:.2f}x; the Loader's last epoch: "
              f"{verdict(loader.stats())}")  # fmt: skip
        del dl
    prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
