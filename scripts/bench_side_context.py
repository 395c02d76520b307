"""Benchmark prep.ops.side_context against the loop and the memory-copy limit.

Every repeat runs each variant of a case once, in an order that rotates from
repeat to repeat (so drift in the machine's state hits all variants alike);
the table shows medians. Run it alone on the machine:

    python scripts/bench_side_context.py            # the figures
    python scripts/bench_side_context.py --quick    # a smoke test, sizes cut down
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import prep
from prep.ops import side_context, side_context_row

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.baselines import side_context_loop


@dataclass(frozen=True)
class Case:
    """One problem size, its variants (name -> call) and its target ``num / den`` ratio."""

    title: str
    variants: dict[str, Callable[[], object]]
    reference: str  # the variant the table's ratios divide by
    num: str
    den: str
    limit: float
    at_most: bool  # the target is num / den <= limit (else >= limit)

    def verdict(self, ms: dict[str, float]) -> str:
        ratio = ms[self.num] / ms[self.den]
        met = ratio <= self.limit if self.at_most else ratio >= self.limit
        sign = "<=" if self.at_most else ">="
        return (
            f"{self.title}: {self.num} / {self.den} = {ratio:.2f} "
            f"(target {sign} {self.limit:g}): {'met' if met else 'MISSED'}"
        )


def make_batch(
    B: int, L: int, feat: tuple[int, ...], dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, a mask with one span of 1-4 tokens per row (1 row in 16 empty), and lengths."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        inputs = torch.randn(B, L, *feat, generator=g).to(dtype)
    else:
        high = 2 if dtype == torch.bool else 30_000
        inputs = torch.randint(0, high, (B, L, *feat), generator=g).to(dtype)
    start = torch.randint(0, L, (B, 1), generator=g)
    width = torch.randint(1, 5, (B, 1), generator=g)
    pos = torch.arange(L)
    mask = (pos >= start) & (pos < start + width) & (torch.arange(B)[:, None] % 16 != 0)
    lengths = torch.maximum(start.squeeze(1), torch.randint(0, L + 1, (B,), generator=g))
    return inputs, mask, lengths


def big_features(scale: int) -> Case:
    B, L, F, M = 256 // scale, 512, 768 // scale, 128
    x, mask, _ = make_batch(B, L, (F,), torch.float32)
    out, out_rows = torch.empty(B, M, F), torch.empty(B, M, F)
    source = torch.randn(B, M, F)
    row_fn = functools.partial(side_context_row, side="left", max_len=M)
    variants: dict[str, Callable[[], object]] = {
        "copy limit: out.copy_(same-size source)": lambda: out.copy_(source),
        "side_context(out=out)": lambda: side_context(x, mask, side="left", max_len=M, out=out),
        "side_context (fresh output)": lambda: side_context(x, mask, side="left", max_len=M),
        "side_context_loop": lambda: side_context_loop(x, mask, side="left", max_len=M),
        "map_rows(threads, workers=2, out=)": lambda: prep.map_rows(
            row_fn, (x, mask), executor="threads", workers=2, out=out_rows
        ),
    }
    _same(variants, list(variants)[1:], out)
    copy = "copy limit: out.copy_(same-size source)"
    title = f"B={B} L={L} F={F} max_len={M} float32, left"
    return Case(
        title,
        variants,
        reference=copy,
        num="side_context(out=out)",
        den=copy,
        limit=1.5,
        at_most=True,
    )


def small_features(scale: int) -> Case:
    B, L, F, M = 4096 // scale, 64, 16, 16
    x, mask, lengths = make_batch(B, L, (F,), torch.float32, seed=1)
    kw = dict(side="right", max_len=M, lengths=lengths)
    variants: dict[str, Callable[[], object]] = {
        "side_context": lambda: side_context(x, mask, **kw),
        "side_context_loop": lambda: side_context_loop(x, mask, **kw),
    }
    _same(variants, list(variants))
    title = f"B={B} L={L} F={F} max_len={M} float32, right with lengths"
    return Case(
        title,
        variants,
        reference="side_context",
        num="side_context_loop",
        den="side_context",
        limit=20,
        at_most=False,
    )


def token_ids(scale: int) -> Case:
    B, L, M = 8192 // scale, 128, 32
    ids, mask, _ = make_batch(B, L, (), torch.int64, seed=2)
    kw = dict(side="left", max_len=M, pad_value=-100)
    variants: dict[str, Callable[[], object]] = {
        "side_context": lambda: side_context(ids, mask, **kw),
        "side_context_loop": lambda: side_context_loop(ids, mask, **kw),
    }
    _same(variants, list(variants))
    title = f"token ids [{B}, {L}] int64 max_len={M}, left"
    return Case(
        title,
        variants,
        reference="side_context",
        num="side_context_loop",
        den="side_context",
        limit=50,
        at_most=False,
    )


def _same(
    variants: dict[str, Callable[[], object]], names: Sequence[str], out: torch.Tensor | None = None
) -> None:
    """Every named variant computes the same result: the figures compare like with like."""
    results = [variants[n]() for n in names]
    results = [out.clone() if r is out else r for r in results]
    for name, r in zip(names, results, strict=True):
        if not torch.equal(r, results[0]):  # type: ignore[arg-type]
            raise RuntimeError(f"{name} disagrees with {names[0]}; the benchmark is broken")


def measure(case: Case, repeat: int) -> dict[str, float]:
    """Median milliseconds per variant over interleaved, rotating repeats."""
    names = list(case.variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up: pools, allocator, first-touch of reused buffers
        case.variants[n]()
    for r in range(repeat):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            case.variants[n]()
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(ts) for n, ts in times.items()}


def largest_allocation(scale: int) -> tuple[int, int]:
    """Largest single CPU allocation during ``side_context(..., out=)``, and out's bytes."""
    B, L, F, M = 256 // scale, 512, 768 // scale, 128
    x, mask, _ = make_batch(B, L, (F,), torch.float32)
    out = torch.empty(B, M, F)
    side_context(x, mask, max_len=M, out=out)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        side_context(x, mask, max_len=M, out=out)
    sizes = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    return max(sizes, default=0), out.numel() * out.element_size()


def _bytes(n: int) -> str:
    size, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11, help="timed repeats per variant")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="sizes cut down and 2 repeats: checks the script, not the speed",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat={args.repeat} must be >= 1")
    repeat, scale = (2, 16) if args.quick else (args.repeat, 1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"median of {repeat} interleaved repeats"
        + (" (--quick: not figures)" if args.quick else "")
    )
    print("\n| case | variant | median ms | / reference |\n|---|---|---:|---:|")
    verdicts = []
    try:
        for build in (big_features, small_features, token_ids):
            case = build(scale)
            ms = measure(case, repeat)
            for name, t in ms.items():
                ref = " (reference)" if name == case.reference else ""
                print(f"| {case.title} | {name}{ref} | {t:.2f} | {t / ms[case.reference]:.2f} |")
            verdicts.append(case.verdict(ms))
    finally:
        prep.shutdown()
    big, out_bytes = largest_allocation(scale)
    print("\n" + "\n".join(f"- {v}" for v in verdicts))
    print(
        f"- largest allocation during side_context(out=): {_bytes(big)} "
        f"(the output is {_bytes(out_bytes)}; "
        f"{'no' if big < out_bytes // 8 else 'A'} temporary of the output's size)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
