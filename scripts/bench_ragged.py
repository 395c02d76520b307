"""Ragged rows (``pad=``): time, the cost of padding, and peak memory, per executor.

Run it alone on the machine (the figures are medians of interleaved repeats, and
every ratio divides two medians of the same run):

    python scripts/bench_ragged.py              # the figures
    python scripts/bench_ragged.py --quick      # a smoke test: B=64, 2 repeats
    python scripts/bench_ragged.py --repeat 11

What it measures (each executor through a warm ``prep.Pool(E, workers=2)``):
  1. B token-id rows (int64, lengths uniform in 16-512, seeded), each cut from its
     sample by a cheap row function, through ``map_samples(..., pad=0,
     return_lengths=True)``, against the loop users write: a list of row tensors,
     ``pad_sequence(rows, batch_first=True)`` and a lengths tensor. Every result
     is checked equal to the loop's before timing.
  2. The cost of padding: the same rows all of the batch's longest length without
     ``pad=`` (target: ragged with pad=0 within 1.2x of it), and with ``pad=0``
     (nothing to pad: the padded write path's own overhead).
  3. Peak memory of a serial ``pad=0`` call over the output's size (target: within
     2x), from torch.profiler's allocation events; and the worst case, rows sorted
     by ascending length (the output grows again and again): its time and peak.
  4. 2-D rows: image crops of varying HxW returning {"img", "mask"}, with
     ``pad={"img": 0, "mask": False}``, against a loop that pads by hand.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.profiler import ProfilerActivity, profile

import prep
from prep.bench import Timing, interleaved, table

EXECUTORS = ["serial", "threads", "processes", "joblib", "auto"]
LOOP = "loop + pad_sequence"
SHORTEST, LONGEST = 16, 512
Sample = tuple[torch.Tensor, int]


def token_samples(rows: int, seed: int = 0) -> list[Sample]:
    """(ids [512] with its own storage, length): what a tokenized data set holds."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(SHORTEST, LONGEST + 1, (rows,), generator=g).tolist()
    return [(torch.randint(0, 30_000, (LONGEST,), generator=g), n) for n in lengths]


def truncate(sample: Sample) -> torch.Tensor:
    """The row function: the sample's own tokens (a slice, as cheap as a row gets)."""
    ids, n = sample
    return ids[:n]


def loop_pad(samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """What users write: the list of rows, pad_sequence, and the lengths."""
    rows = [truncate(s) for s in samples]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    return pad_sequence(rows, batch_first=True, padding_value=0), lengths


def loop_stack(samples: Sequence[Sample]) -> torch.Tensor:
    return torch.stack([truncate(s) for s in samples])


def same(got: object, want: object) -> bool:
    """Equal tensors (dtype included), or equal tuples/dicts of them."""
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same(got[k], v) for k, v in want.items())
        )
    return (
        isinstance(got, tuple)
        and isinstance(want, tuple)
        and len(got) == len(want)
        and all(same(g, w) for g, w in zip(got, want))
    )


def check(name: str, got: object, want: object) -> None:
    if not same(got, want):
        raise RuntimeError(f"{name} disagrees with the loop's result; the benchmark is broken")


def padding_variants(
    pools: dict[str, prep.Pool], ragged: list[Sample], equal: list[Sample]
) -> tuple[dict[tuple[str, str], Callable[[], object]], dict[tuple[str, str], object]]:
    """(executor, case) -> call, and the result each case must give."""
    calls: dict[tuple[str, str], Callable[[], object]] = {
        ("loop", "ragged"): lambda: loop_pad(ragged),
        ("loop", "equal"): lambda: loop_stack(equal),
        ("loop", "equal, pad=0"): lambda: loop_pad(equal),
    }
    for ex, pool in pools.items():
        run = pool.map_samples
        calls[(ex, "ragged")] = lambda run=run: run(truncate, ragged, pad=0, return_lengths=True)
        calls[(ex, "equal")] = lambda run=run: run(truncate, equal)
        calls[(ex, "equal, pad=0")] = lambda run=run: run(
            truncate, equal, pad=0, return_lengths=True
        )
    wants = {case: calls[("loop", case)]() for case in ("ragged", "equal", "equal, pad=0")}
    return calls, wants


def ragged_vs_equal(
    pools: dict[str, prep.Pool], rows: int, repeat: int
) -> dict[tuple[str, str], Timing]:
    """Cases 1 and 2 in one interleaved run: every ratio is taken side by side."""
    ragged = token_samples(rows)
    longest = max(n for _, n in ragged)
    equal = [(ids, longest) for ids, _ in ragged]
    calls, wants = padding_variants(pools, ragged, equal)
    for (ex, case), call in calls.items():
        check(f"{ex}, {case}", call(), wants[case])
    times = interleaved({f"{ex}|{case}": call for (ex, case), call in calls.items()}, repeat)
    return {tuple(name.split("|")): t for name, t in times.items()}  # type: ignore[misc]


def ragged_table(times: dict[tuple[str, str], Timing], rows: int) -> str:
    base = times[("loop", "ragged")].median
    body = [
        [
            LOOP if ex == "loop" else f"map_samples({ex}, pad=0)",
            f"{t.median * 1e3:.2f}",
            f"{t.median / rows * 1e6:.1f}",
            f"{t.spread:.0%}",
            f"{base / t.median:.2f}x",
        ]
        for (ex, case), t in times.items()
        if case == "ragged"
    ]
    return f"### 1. Ragged token ids: {rows} rows, int64, lengths {SHORTEST}-{LONGEST}\n\n" + table(
        body, ["variant", "batch ms", "us/row", "spread", "vs loop"]
    )


def padding_table(times: dict[tuple[str, str], Timing], rows: int) -> tuple[str, dict[str, float]]:
    body, ratios = [], {}
    for ex in ["loop", *EXECUTORS]:
        eq, eq_pad, rag = (times[(ex, c)].median for c in ("equal", "equal, pad=0", "ragged"))
        ratios[ex] = rag / eq
        body.append(
            [
                ex,
                f"{eq * 1e3:.2f}",
                f"{eq_pad * 1e3:.2f}",
                f"{rag * 1e3:.2f}",
                f"{rag / eq:.2f}x",
                f"{eq_pad / eq:.2f}x",
            ]
        )
    head = ["executor", "equal ms", "equal, pad=0 ms", "ragged, pad=0 ms"]
    text = (
        f"### 2. The cost of padding: {rows} rows, equal = every row the longest's length\n"
        "loop: torch.stack for equal rows, pad_sequence for the others\n\n"
        + table(body, [*head, "ragged / equal", "equal pad=0 / equal"])
    )
    return text, ratios


def peak_bytes(call: Callable[[], object]) -> int:
    """The most bytes torch held at once during ``call()``, beyond what it held before."""
    call()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    kineto = getattr(prof.profiler, "kineto_results", None)
    if kineto is not None:
        events = [(e.start_ns(), e.nbytes()) for e in kineto.events() if e.name() == "[memory]"]
    else:  # attributed to ops: misses a temporary freed inside the op that made it
        events = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()]
    level = peak = 0
    for _, nbytes in sorted(events, key=lambda e: e[0]):
        level += nbytes
        peak = max(peak, level)
    return peak


def memory(pool: prep.Pool, rows: int, repeat: int) -> tuple[str, dict[str, float]]:
    """Case 3: serial pad=0 in random and in ascending order of length, against the loop."""
    shuffled = token_samples(rows)
    ascending = sorted(shuffled, key=lambda s: s[1])
    out_bytes = rows * max(n for _, n in shuffled) * 8
    calls: dict[str, Callable[[], object]] = {}
    for order, samples in (("random order", shuffled), ("ascending lengths", ascending)):
        check(order, pool.map_samples(truncate, samples, pad=0), loop_pad(samples)[0])
        calls[f"serial pad=0, {order}"] = lambda s=samples: pool.map_samples(
            truncate, s, pad=0, return_lengths=True
        )
        calls[f"{LOOP}, {order}"] = lambda s=samples: loop_pad(s)
    times = interleaved(calls, repeat=repeat)
    peaks = {name: peak_bytes(call) / out_bytes for name, call in calls.items()}
    body = [
        [name, f"{times[name].median * 1e3:.2f}", f"{times[name].spread:.0%}", f"{p:.2f}x"]
        for name, p in peaks.items()
    ]
    text = (
        f"### 3. Peak memory: {rows} rows, output {out_bytes / 2**20:.2f} MiB "
        "(torch.profiler allocation events, the result included)\n\n"
        + table(body, ["variant", "batch ms", "spread", "peak / output"])
    )
    return text, peaks


def crop_samples(rows: int, side: int, seed: int = 1) -> list[tuple[torch.Tensor, int, int]]:
    g = torch.Generator().manual_seed(seed)
    hw = torch.randint(side // 4, side + 1, (rows, 2), generator=g).tolist()
    return [(torch.randn(3, side, side, generator=g), h, w) for h, w in hw]


def crop(sample: tuple[torch.Tensor, int, int]) -> dict[str, torch.Tensor]:
    img, h, w = sample
    part = img[:, :h, :w]
    return {"img": part, "mask": part[0] > 0}


def crop_loop(samples: Sequence[tuple[torch.Tensor, int, int]]) -> tuple[dict, dict]:
    """What users write for 2-D rows: allocate the padded batch, copy each row in."""
    rows = [crop(s) for s in samples]
    H = max(r["img"].shape[1] for r in rows)
    W = max(r["img"].shape[2] for r in rows)
    img = torch.zeros(len(rows), 3, H, W)
    mask = torch.zeros(len(rows), H, W, dtype=torch.bool)
    for i, r in enumerate(rows):
        _, h, w = r["img"].shape
        img[i, :, :h, :w] = r["img"]
        mask[i, :h, :w] = r["mask"]
    sizes = torch.tensor([r["img"].shape for r in rows], dtype=torch.int64)
    return {"img": img, "mask": mask}, {"img": sizes, "mask": sizes[:, 1:].contiguous()}


def crops_table(pools: dict[str, prep.Pool], rows: int, repeat: int) -> str:
    side = 96
    samples = crop_samples(rows, side)
    pad = {"img": 0, "mask": False}
    calls: dict[str, Callable[[], object]] = {"loop + padding by hand": lambda: crop_loop(samples)}
    for ex, pool in pools.items():
        calls[ex] = lambda pool=pool: pool.map_samples(crop, samples, pad=pad, return_lengths=True)
    want = crop_loop(samples)
    for name, call in calls.items():
        check(f"crops, {name}", call(), want)
    times = interleaved(calls, repeat=repeat)
    base = times["loop + padding by hand"].median
    body = [
        [name, f"{t.median * 1e3:.2f}", f"{t.spread:.0%}", f"{base / t.median:.2f}x"]
        for name, t in times.items()
    ]
    return (
        f"### 4. 2-D crops: {rows} rows, img [3, h, w] float32 + mask [h, w] bool, h and w "
        f"in {side // 4}-{side}, pad={pad}\n\n"
        + table(body, ["variant", "batch ms", "spread", "vs loop"])
    )


def targets(ratios: dict[str, float], peaks: dict[str, float]) -> str:
    checks = [(f"ragged pad=0 / equal, {ex} <= 1.2x", ratios[ex], 1.2) for ex in EXECUTORS]
    checks += [
        (f"peak / output, {name} <= 2x", peaks[name], 2.0)
        for name in peaks
        if name.startswith("serial")
    ]
    body = [[name, f"{got:.2f}x", "met" if got <= goal else "MISSED"] for name, got, goal in checks]
    return "### Targets\n\n" + table(body, ["target", "measured", ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed repeats per variant")
    parser.add_argument("--rows", type=int, default=256, help="rows a batch (cases 1-3)")
    parser.add_argument("--quick", action="store_true", help="B=64, 2 repeats: a smoke test")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.rows < 1:
        parser.error("--repeat and --rows must be >= 1")
    rows, repeat = (64, 2) if args.quick else (args.rows, args.repeat)
    info = prep.info()
    print(
        f"prep {info['prep']}, torch {info['torch']}, Python {info['python']}, "
        f"{platform.machine()} {platform.system()}, {info['cores']} cores, "
        f"{info['torch_threads']} torch threads; workers=2, median of {repeat} "
        "interleaved repeats" + (" (--quick: not figures)" if args.quick else "") + "\n"
    )
    pools = {ex: prep.Pool(ex, workers=2) for ex in EXECUTORS}
    try:
        times = ragged_vs_equal(pools, rows, repeat)
        print(ragged_table(times, rows), "\n", flush=True)
        text, ratios = padding_table(times, rows)
        print(text, "\n", flush=True)
        text, peaks = memory(pools["serial"], rows, repeat)
        print(text, "\n", flush=True)
        print(crops_table(pools, max(16, rows // 4), repeat), "\n", flush=True)
        print(targets(ratios, peaks))
    finally:
        for pool in pools.values():
            pool.close()
        prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
