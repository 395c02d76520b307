"""prep in under a minute: which executor wins for three kinds of row, then what only prep does.

    scripts/demo                  # sets up .venv, then runs this file
    python examples/demo.py --repeat 25
    python examples/demo.py --quick       # tiny sizes: checks that it runs, not figures

1. three row functions, chosen so that a different executor wins each with 2
   workers, timed as interleaved repeats: each variant's median beside its
   spread, and a verdict only where the gap is wider than the noise;
2. what ``auto`` measured and chose for each of those batches (its explain);
3. what only prep does: ragged rows padded, a bad row filled, a stream of batches;
4. a DataLoader ``collate_fn``;
5. saved shards through the ``prep run`` command.

A shared or busy machine makes timings mean little: the demo says so (load
average above the cores, or repeats that spread too wide) instead of naming a
winner it cannot stand behind.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import prep
from prep.bench import interleaved
from prep.ops import side_context_row

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import python_work, side_context_batch

WORKERS = 2
MIN_GAP = 1.2  # a winner must be this much faster than the runner-up...
MAX_SPREAD = 0.25  # ...and the two must repeat within this (interquartile range / median)
QUANTILES = torch.tensor([0.05, 0.5, 0.95])


# ---------------------------------------------------------------- the row functions


def sorted_quantiles(values: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Quantiles of a row's first ``length`` values (a clip of its own length).

    ``torch.sort`` runs in C without the GIL, on one core for a 1-D row; reading
    ``length`` makes the slice depend on the data, so ``vmap`` cannot batch it.
    """
    ordered = torch.sort(values[: int(length)]).values
    return ordered[(QUANTILES * (ordered.numel() - 1)).long()]


@dataclass(frozen=True)
class Case:
    """A row function, a batch for it, the executors to time, and the one expected to win."""

    name: str
    title: str
    fn: Callable[..., Any]
    batch: Any
    executors: tuple[str, ...]
    expected: str
    why: str


def cases(scale: float = 1.0) -> list[Case]:
    """The three demo workloads; ``scale`` < 1 shrinks rows and work (for tests)."""
    rows = lambda n: max(2, int(n * scale))  # noqa: E731
    iters = max(100, int(40_000 * scale))
    values = max(64, int(32_768 * scale))
    g = torch.Generator().manual_seed(0)
    clips = (
        torch.randn(rows(32), values, generator=g),
        torch.randint(values // 2, values + 1, (rows(32),), generator=g),
    )
    x, mask = side_context_batch(rows(256), 64, 16)
    return [
        Case(
            "pure Python",
            f"pure Python that holds the GIL: {rows(64)} rows, a loop of {iters:,} steps each",
            functools.partial(python_work, iters=iters),
            torch.arange(rows(64), dtype=torch.float32).view(-1, 1) + 1,
            ("serial", "threads", "processes"),
            "processes",
            "only separate processes run Python in parallel; threads take turns on the GIL",
        ),
        Case(
            "torch sort",
            f"a torch op that releases the GIL: sort {rows(32)} rows of {values:,} floats, "
            f"each cut to its own length",
            sorted_quantiles,
            clips,
            ("serial", "threads", "processes"),
            "threads",
            "torch.sort runs without the GIL, so threads run it in parallel with no copies",
        ),
        Case(
            "light op",
            f"a light op with a batched twin: left context of {rows(256)} rows of [64, 16]",
            functools.partial(side_context_row, max_len=16),
            (x, mask),
            ("serial", "threads", "processes", "vectorized"),
            "vectorized",
            "each row is microseconds of work: one batched call beats handing rows to workers",
        ),
    ]


# ---------------------------------------------------------------- figures and verdicts


@dataclass(frozen=True)
class Stat:
    """One variant's repeats: the median and the interquartile range, in seconds."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0])
        q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(median, q1, q3)

    @property
    def spread(self) -> float:
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0


def seconds(s: float) -> str:
    """``1.23 ms``-style, three significant figures, never ``0.0``."""
    unit, scale = next(((u, f) for u, f in (("s", 1.0), ("ms", 1e-3)) if s >= f), ("us", 1e-6))
    value = s / scale
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def times(ratio: float) -> str:
    """A speed ratio as people say it: ``2.3x``, ``19x``, ``1,240x``."""
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    if ratio >= 10:
        return f"{ratio:.0f}x"
    return f"{ratio:.2g}x" if ratio < 1 else f"{ratio:.1f}x"


def against(base: float, t: float) -> str:
    """How a time compares with a reference: ``1.7x faster``, ``3.1x slower``, ``same``."""
    ratio = base / t
    if 1 / 1.05 <= ratio <= 1.05:
        return "about the same"
    return f"{times(ratio)} faster" if ratio > 1 else f"{times(1 / ratio)} slower"


def busy_reason(load: float, cores: int) -> str | None:
    """Why the machine is too busy for timings to mean much, or None."""
    if load > cores:
        return f"load average {load:.1f} on {cores} cores"
    return None


@dataclass(frozen=True)
class Verdict:
    winner: str | None  # None: no winner the figures can stand behind
    text: str


def verdict(stats: dict[str, Stat], busy: str | None = None) -> Verdict:
    """The executor that wins, only if its gap over the runner-up is wider than the noise."""
    ranked = sorted(stats, key=lambda name: stats[name].median)
    best = ranked[0]
    if len(ranked) == 1:
        return Verdict(best, f"{best} (the only one timed)")
    second = ranked[1]
    b, s = stats[best], stats[second]
    gap = s.median / b.median if b.median > 0 else float("inf")
    spread = max(b.spread, s.spread)
    if busy is None and spread > MAX_SPREAD:
        busy = f"repeats spread {spread:.0%} of their median, over {MAX_SPREAD:.0%}"
    if busy:
        return Verdict(None, f"too busy to tell ({busy}); fastest this time: {best}")
    if gap < MIN_GAP or b.q3 >= s.q1:
        return Verdict(
            None,
            f"too close to call: {best} is {gap:.2f}x {second}'s speed "
            f"(a winner needs {MIN_GAP}x, and repeats that do not overlap)",
        )
    return Verdict(best, f"{best} wins, {times(gap)} faster than {second}, the next best")


# ---------------------------------------------------------------- 1. who wins


@dataclass
class Result:
    case: Case
    stats: dict[str, Stat]  # the fixed executors, then "auto"
    auto_ran: str
    explain: str
    verdict: Verdict


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def measure(case: Case, pools: dict[str, prep.Pool], repeat: int, busy: str | None) -> Result:
    auto = prep.Pool("auto", workers=WORKERS)  # one per case: its explain is this batch's
    try:
        variants: dict[str, Callable[[], object]] = {
            name: functools.partial(pools[name].map_rows, case.fn, case.batch)
            for name in case.executors
        }
        variants["auto"] = functools.partial(auto.map_rows, case.fn, case.batch)
        want = variants["serial"]()
        for name, run in variants.items():  # every variant computes the same rows
            if not torch.equal(run(), want):
                raise RuntimeError(f"{name} disagrees with serial on {case.title}")
        timing = interleaved(variants, repeat=repeat, warmup=1)
        stats = {name: Stat.of(t.samples) for name, t in timing.items()}
        choices = auto.choices()
        ran = choices[-1].choice if choices else "?"
        fixed = {name: stats[name] for name in case.executors}
        return Result(case, stats, ran, auto.explain(), verdict(fixed, busy))
    finally:
        auto.close()


def report(result: Result, repeat: int) -> None:
    base = result.stats["serial"].median
    print(f"   {result.case.title}")
    print(f"   {'':<10} {'median':>9}   {'middle half of ' + str(repeat) + ' repeats':<26}")
    for name, st in result.stats.items():
        label = "reference" if name == "serial" else against(base, st.median)
        ran = f" (ran {result.auto_ran})" if name == "auto" else ""
        spread = f"{seconds(st.q1)} - {seconds(st.q3)}"
        print(f"   {name:<10} {seconds(st.median):>9}   {spread:<26} {label}{ran}")
    v = result.verdict
    print(f"   -> {v.text}")
    if v.winner is not None and v.winner != result.case.expected:
        print(f"      (expected {result.case.expected}: {result.case.why})")
    elif v.winner is not None:
        print(f"      why: {result.case.why}")
    print()


def who_wins(scale: float = 1.0, repeat: int = 15) -> list[Result]:
    """Section 1: each case timed on warm pools; returns the figures and verdicts."""
    cores = prep.info()["cores"]
    start_load = load_average()
    busy = busy_reason(start_load, cores)
    print(
        f"1. Three kinds of row, three executors that should win ({WORKERS} workers, "
        f"{repeat} interleaved repeats each)\n"
    )
    if scale < 1:
        print("   (tiny batches: these figures check the demo, they measure nothing)\n")
    elif busy:
        print(
            f"   The machine is busy ({busy}): other work competes for the cores, so the\n"
            f"   figures below are not a measurement, and no winner is named from them.\n"
        )
    demo_cases = cases(scale)
    names = sorted({name for case in demo_cases for name in case.executors})
    pools = {name: prep.Pool(name, workers=WORKERS) for name in names}
    results = []
    # torch's own intra-op threads wait for each other at the end of every op: where other
    # work holds a core, a batched op's two threads stall for whole time slices (a 0.1 ms
    # op took 30 ms on a busy 2-core machine). prep's workers run one torch thread each
    # (cores // workers); the caller's batched calls get one too, so all compare alike.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(1, cores // WORKERS))
    try:
        for case in demo_cases:
            result = measure(case, pools, repeat, busy)
            report(result, repeat)
            results.append(result)
    finally:
        torch.set_num_threads(threads_before)
        for pool in pools.values():
            pool.close()
    return results


# ---------------------------------------------------------------- 2. auto


def auto_explained(results: Sequence[Result]) -> None:
    """Section 2: what auto measured and chose for each batch of section 1."""
    print("2. What executor='auto' measured and chose, for each batch above\n")
    for result in results:
        print(f"   auto on {result.case.title}:")
        for line in result.explain.splitlines():
            print(f"     {line}")
        print()


# ---------------------------------------------------------------- 3. what only prep does


def encode(text: str) -> torch.Tensor:
    """A stand-in for a tokenizer: one id per byte."""
    return torch.tensor(list(text.encode()), dtype=torch.int64)


def decode(blob: bytes) -> torch.Tensor:
    """Parse a record; a corrupt one raises, as a real decoder would."""
    if not blob.startswith(b"rec:"):
        raise ValueError(f"not a record: {blob[:12]!r}")
    return torch.tensor(list(blob[4:]), dtype=torch.uint8)


def ragged_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths, padded in place into one tensor, with their lengths."""
    print("3. What only prep does\n")
    texts = ["a cat", "a dog sat down", "on the mat"]
    ids, lengths = prep.map_samples(encode, texts, pad=0, return_lengths=True)
    print(f"   ragged rows, pad=0: {len(texts)} texts -> ids {tuple(ids.shape)}, ", end="")
    print(f"lengths {lengths.tolist()}; the first row ends {ids[0, -4:].tolist()}")
    return ids, lengths


def bad_row() -> tuple[torch.Tensor, torch.Tensor]:
    """One corrupt record among good ones: filled, flagged and reported, not fatal."""
    blobs = [b"rec:abc", b"garbage", b"rec:xyz"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, valid = prep.map_samples(decode, blobs, on_error="fill", return_valid=True)
    print(f"   a bad row, on_error='fill': valid {valid.tolist()}, row 1 is {out[1].tolist()}")
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            print(f"     warning: {str(w.message).splitlines()[0]}")
    return out, valid


def stream(
    batches: int = 4, step: float = 0.05, rows: int = 32, rounds: int = 3
) -> tuple[int, float, float]:
    """Batches prepared in the background while a (simulated) training step runs.

    Each round runs the stream with ``prefetch=2`` and with ``prefetch=0`` (each
    batch in the loop's thread: nothing overlaps), alternating; the medians count.
    """
    g = torch.Generator().manual_seed(1)
    values = 32_768
    data = [
        (torch.randn(rows, values, generator=g), torch.full((rows,), values))
        for _ in range(batches)
    ]

    def train(out: torch.Tensor) -> None:
        time.sleep(step)  # the model's step: the GPU is busy, the CPU is free

    elapsed: dict[int, list[float]] = {0: [], 2: []}
    seen = 0
    with prep.Pool("threads", workers=WORKERS) as pool:
        for r in range(rounds):
            for prefetch in (0, 2) if r % 2 == 0 else (2, 0):
                seen = 0
                began = time.perf_counter()
                for out in pool.imap(sorted_quantiles, data, prefetch=prefetch):
                    train(out)
                    seen += 1
                elapsed[prefetch].append(time.perf_counter() - began)
    ahead, one_by_one = (statistics.median(elapsed[k]) for k in (2, 0))
    print(
        f"   a stream, Pool.imap: {seen} batches, each followed by a {seconds(step)} training "
        f"step: {seconds(ahead)} with prefetch=2 (the next batches made during the step), "
        f"{seconds(one_by_one)} one after another (median of {rounds})"
    )
    print()
    return seen, one_by_one, ahead


# ---------------------------------------------------------------- 4. DataLoader, 5. prep run


def left_context(sample: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, mask = sample
    return side_context_row(tokens, mask, max_len=8)


def sentences(n: int = 64) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, mask) samples of varying length, a span marked in each."""
    for i in range(n):
        length = 20 + (i * 7) % 30
        mask = torch.zeros(length, dtype=torch.bool)
        mask[length // 2 : length // 2 + 2] = True
        yield torch.arange(length) + 100 * i, mask


def dataloader(samples: int = 64) -> torch.Tensor:
    """Section 4: the per-sample work of each batch, as a DataLoader collate_fn."""
    print("4. As a DataLoader collate_fn (8 tokens of left context per sample)\n")
    collate = prep.Collate(left_context, executor="threads", workers=WORKERS)
    loader = DataLoader(list(sentences(samples)), batch_size=16, collate_fn=collate)
    batches = list(loader)
    collate.close()
    first = batches[0]
    print(f"   {len(batches)} batches of {tuple(first.shape)} {first.dtype}; first row: ", end="")
    print(f"{first[0].tolist()}\n")
    return first


def shards(rows: int = 64) -> list[str]:
    """Section 5: synthetic shards written, then run through ``prep run``."""
    from prep.cli import main

    print("5. Saved shards through the command line: prep make-shards, then prep run\n")
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp, "data"), Path(tmp, "out")
        make = ["make-shards", "--out", str(data), "--shards", "4", "--rows", str(rows)]
        main([*make, "--seq", "128", "--dim", "32", "--quiet"])
        fn = ["--fn", "prep.ops:side_context_row", "--arg", "max_len=16"]
        code = main(["run", str(data), "--out", str(out), *fn, "--workers", str(WORKERS)])
        written = sorted(p.name for p in out.iterdir())
    print(f"   exit code {code}; wrote {', '.join(written)}\n")
    return written


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="timed repeats per variant")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, 3 repeats: checks the demo, no figures"
    )
    args = parser.parse_args(argv)
    scale, repeat = (0.02, 3) if args.quick else (1.0, args.repeat)
    if args.repeat < 3:
        parser.error(f"--repeat={args.repeat}: a median and a spread need at least 3")
    # auto remembers its choices across runs (PREP_WISDOM); the demo shows it measuring
    # this run's batches, so it starts without that memory unless you say otherwise
    os.environ.setdefault("PREP_WISDOM", "off")
    info = prep.info()
    print(
        f"prep {prep.__version__}, torch {torch.__version__}, {info['cores']} cores, "
        f"load average {load_average():.1f}\n"
    )
    began = time.perf_counter()
    try:
        results = who_wins(scale, repeat)
        auto_explained(results)
        ragged_rows()
        bad_row()
        stream(**({"batches": 2, "step": 0.001, "rows": 2, "rounds": 1} if args.quick else {}))
        dataloader()
        shards()
    finally:
        prep.shutdown()
    told = "; ".join(f"{r.case.name}: {r.verdict.winner or 'none named'}" for r in results)
    print(f"Winners ({told}); {time.perf_counter() - began:.0f} s in all.")
    if all(r.verdict.winner is None for r in results):
        print("No winner could be told apart from the noise: run it again on an idle machine.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
