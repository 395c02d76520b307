"""JIT, measured: ``torch.compile`` of vmap and of the batched twin, against both and serial.

The README's question had four answers: processes, threads, vectorize, JIT. prep
measures the first three on your function; this script measures the fourth as a
PyTorch user meets it today, ``torch.compile`` (inductor: fused C++ loops on CPU,
cached on disk), on four workloads, each at 16, 256 and 4,096 rows:

  chain          8 elementwise ops on rows of [1024] float32 (memory-bound: fusion should pay)
  side_context   prep.ops.side_context, the question's op (a gather: little to fuse)
  image          normalise and clamp uint8 [3, 224, 224] images to float16
  branchy        a row function with data-dependent Python control flow (graph breaks)

The forms: serial (a Python loop over rows and ``torch.stack``: the reference),
``vmap(fn)``, the twin (the workload's batched function), and compiled:
``compile(vmap(fn))``, ``compile(twin)`` and ``compile(fn)`` called in the loop.
Per workload, rows and compiled form, each in a fresh interpreter:

  first call, cold   an empty inductor cache (TORCHINDUCTOR_CACHE_DIR, a temp dir this
                     script makes and removes): compile + one run
  first call, disk   a second fresh interpreter on the same cache dir
  warm               median of interleaved repeats (every repeat runs each form once,
                     in rotating order), all forms of a cell in one interpreter

and the values against serial's: bit for bit, or the max abs difference. A form that
cannot run (vmap over data-dependent control flow, inductor without a C++ compiler)
gets a one-line reason and the run goes on. Run it alone on the machine:

    python scripts/bench_jit.py                       # the figures (tens of minutes)
    python scripts/bench_jit.py --quick               # a smoke test: 16 rows, 2 repeats
    python scripts/bench_jit.py --workloads chain --sizes 256 4096
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SIZES = (16, 256, 4096)
COMPILED = ("compile(vmap(fn))", "compile(twin)", "compile(fn), looped")
SPEEDUP = 1.5  # the bar for offering a compiled form to auto
Result = dict[str, Any]


# ------------------------------------------------------------------ workloads


def chain_row(x: torch.Tensor) -> torch.Tensor:
    y = x * 1.5 - 0.25
    y = y.abs().sqrt()
    y = y * x + 1.0
    y = torch.where(y > 1.0, y, 0.5 * y)
    return y.clamp(-2.0, 2.0) / 3.0


def chain_twin(x: torch.Tensor) -> torch.Tensor:
    # the same ops (they broadcast), but its own code object: dynamo caches compiled
    # code per code object, and a second shape on chain_row would recompile it dynamic
    y = x * 1.5 - 0.25
    y = y.abs().sqrt()
    y = y * x + 1.0
    y = torch.where(y > 1.0, y, 0.5 * y)
    return y.clamp(-2.0, 2.0) / 3.0


MEAN = torch.tensor([0.485, 0.456, 0.406])
STD = torch.tensor([0.229, 0.224, 0.225])


def image_row(img: torch.Tensor) -> torch.Tensor:
    x = (img.float() / 255.0 - MEAN.view(3, 1, 1)) / STD.view(3, 1, 1)
    return x.clamp(-3.0, 3.0).half()


def image_twin(img: torch.Tensor) -> torch.Tensor:
    x = (img.float() / 255.0 - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    return x.clamp(-3.0, 3.0).half()


def branchy_row(x: torch.Tensor) -> torch.Tensor:
    n = x.norm()
    if n > 32.0:  # a Python branch on a value: vmap refuses it, dynamo breaks the graph
        x = x * (32.0 / n)
    if x.mean() > 0:
        return (x * 2.0 + 1.0).relu()
    return (x.abs() - 1.0).tanh()


def branchy_twin(x: torch.Tensor) -> torch.Tensor:
    n = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    x = torch.where(n > 32.0, x * (32.0 / n), x)
    positive = x.mean(1, keepdim=True) > 0
    return torch.where(positive, (x * 2.0 + 1.0).relu(), (x.abs() - 1.0).tanh())


def _side_context_forms() -> tuple[Callable[..., Any], Callable[..., Any]]:
    from prep.ops import side_context, side_context_row  # only this workload needs prep

    return (
        functools.partial(side_context_row, side="left", max_len=32),
        functools.partial(side_context, side="left", max_len=32),
    )


def _side_context_batch(rows: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    L = 128
    x = torch.randn(rows, L, 32, generator=g)
    start = torch.randint(0, L, (rows, 1), generator=g)
    width = torch.randint(1, 5, (rows, 1), generator=g)
    pos = torch.arange(L)
    return x, (pos >= start) & (pos < start + width)


@dataclass(frozen=True)
class Workload:
    about: str
    forms: Callable[[], tuple[Callable[..., Any], Callable[..., Any]]]  # (row fn, twin)
    batch: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]


WORKLOADS = {
    "chain": Workload(
        "8 elementwise ops, rows of [1024] float32",
        lambda: (chain_row, chain_twin),
        lambda rows, g: (torch.randn(rows, 1024, generator=g),),
    ),
    "side_context": Workload(
        "prep.ops.side_context, rows [128, 32] float32 + a span mask, left, max_len=32",
        _side_context_forms,
        _side_context_batch,
    ),
    "image": Workload(
        "normalise + clamp, uint8 [3, 224, 224] -> float16",
        lambda: (image_row, image_twin),
        lambda rows, g: (torch.randint(0, 256, (rows, 3, 224, 224), generator=g).byte(),),
    ),
    "branchy": Workload(
        "Python `if` on a row's norm and mean, rows of [1024] float32",
        lambda: (branchy_row, branchy_twin),
        lambda rows, g: (torch.randn(rows, 1024, generator=g),),
    ),
}


# ------------------------------------------------------------------ in the child


def forms(name: str, backend: str) -> dict[str, Callable[..., Any]]:
    """Every form of one workload, by name; the compiled ones compile at their first call."""
    fn, twin = WORKLOADS[name].forms()
    compiled_fn = torch.compile(fn, backend=backend)
    return {
        "serial": lambda *cols: torch.stack([fn(*row) for row in zip(*cols)]),
        "vmap(fn)": torch.func.vmap(fn),
        "twin": twin,
        "compile(vmap(fn))": torch.compile(torch.func.vmap(fn), backend=backend),
        "compile(twin)": torch.compile(twin, backend=backend),
        "compile(fn), looped": lambda *cols: torch.stack([compiled_fn(*r) for r in zip(*cols)]),
    }


def reason(e: BaseException) -> str:
    """One line: the exception's type and the first line of its root cause's message
    (torch.compile wraps the error that stopped it in one or two of its own)."""
    root = e
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    first = lines[0].split(" Please file an issue")[0] if lines else ""
    via = f"{type(e).__name__} from " if root is not e else ""
    return f"{via}{type(root).__name__}: {first}"[:200].replace("|", "/")


def counts() -> dict[str, int]:
    """Graphs dynamo has compiled (more than one per form: graph breaks or recompiles)
    and inductor's on-disk cache hits so far (a private API: none where it has moved)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "hits": counters["inductor"]["fxgraph_cache_hit"],
        "misses": counters["inductor"]["fxgraph_cache_miss"],
    }


def compare(got: Any, ref: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor) or got.shape != ref.shape or got.dtype != ref.dtype:
        what = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return f"WRONG: {what} where serial gives {tuple(ref.shape)} {ref.dtype}"
    if torch.equal(got, ref):
        return "bit for bit"
    return f"max abs diff {(got.double() - ref.double()).abs().max().item():.2g}"


def first_call(name: str, rows: int, form: str, backend: str) -> Result:
    """The first call of one form in this (fresh) interpreter: compile + one run."""
    cols = WORKLOADS[name].batch(rows, torch.Generator().manual_seed(0))
    call = forms(name, backend)[form]
    with torch.no_grad():
        start = time.perf_counter()
        try:
            call(*cols)
        except Exception as e:
            return {"error": reason(e)}
        return {"s": time.perf_counter() - start, **counts()}


def warm(name: str, rows: int, backend: str, repeat: int) -> dict[str, Result]:
    """Every form of one cell: its values against serial's, then interleaved repeats."""
    cols = WORKLOADS[name].batch(rows, torch.Generator().manual_seed(0))
    calls = forms(name, backend)
    out: dict[str, Result] = {}
    with torch.no_grad():
        ref = calls["serial"](*cols)
        for form, call in calls.items():
            try:
                got = call(*cols)  # the compiled forms compile here, untimed
            except Exception as e:
                out[form] = {"error": reason(e)}
                continue
            out[form] = {"values": compare(got, ref)}
        del ref
        live = [f for f in calls if "error" not in out[f]]
        samples: dict[str, list[float]] = {f: [] for f in live}
        for r in range(repeat):
            shift = r % len(live)
            for form in live[shift:] + live[:shift]:
                start = time.perf_counter()
                calls[form](*cols)
                samples[form].append(time.perf_counter() - start)
    for form, s in samples.items():
        median = statistics.median(s)
        out[form].update(s=median, spread=(max(s) - min(s)) / median if median else 0.0)
    return out


# ------------------------------------------------------------------ in the parent


def child(args: list[str], cache: Path, timeout: float) -> Any:
    """Run this script's ``--child ARGS`` in a fresh interpreter on inductor cache ``cache``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"child exited {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
    # on a busy machine an OpenMP region waits for a descheduled thread (milliseconds)
    load = f"; load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (
        f"{model}; {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads), Python {platform.python_version()}, "
        f"{platform.system()}; C++ compiler: {cxx or 'none found'}{load}"
    )


def ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3g}" if s < 0.1 else f"{s * 1e3:,.0f}"


def cell(name: str, rows: int, args: argparse.Namespace, tmp: Path) -> dict[str, Result]:
    """One workload at one batch size: the warm run, then the first calls of each compiled form."""
    results: dict[str, Result] = child(
        ["warm", name, str(rows), args.backend, str(args.repeat)], tmp / "warm", args.timeout
    )
    if "error" in results:  # the child died: every form gets its reason
        return {f: dict(results) for f in ["serial", "vmap(fn)", "twin", *COMPILED]}
    for form in COMPILED:
        if "error" in results[form]:
            continue
        cache = tmp / f"{name}-{rows}-{COMPILED.index(form)}"
        for key in ("cold", "disk"):
            results[form][key] = child(
                ["first", name, str(rows), args.backend, form], cache, args.timeout
            )
    return results


def row(name: str, rows: int, form: str, r: Result, serial: float | None) -> str:
    if "error" in r:
        return f"| {name} | {rows} | {form} | - | - | - | - | - | {r['error']} | - |"

    def first(key: str) -> str:
        f = r.get(key)
        if f is None:
            return "-"
        if "error" in f:
            return f"failed: {f['error']}"
        if key == "disk" and "hits" in f:  # graphs inductor found in its disk cache
            return f"{f['s']:.2f} ({f['hits']}/{f['hits'] + f['misses']} cached)"
        return f"{f['s']:.2f}"

    vs = f"{serial / r['s']:.2f}x" if serial else "-"
    graphs = r.get("cold", {}).get("graphs", "-")
    return (
        f"| {name} | {rows} | {form} | {ms(r['s'])} | {r['spread']:.0%} | {vs} | "
        f"{first('cold')} | {first('disk')} | {r['values']} | {graphs} |"
    )


def verdict(name: str, rows: int, results: dict[str, Result]) -> tuple[str, float | None]:
    """The best compiled form's warm speedup over the best non-compiled one, and its payback."""
    timed = {f: r for f, r in results.items() if "s" in r and not r["values"].startswith("WRONG")}
    plain = [f for f in timed if f not in COMPILED]
    jit = [f for f in timed if f in COMPILED]
    if not plain or not jit:
        return f"{name}, {rows} rows: no compiled form ran", None
    best_plain = min(plain, key=lambda f: timed[f]["s"])
    best_jit = min(jit, key=lambda f: timed[f]["s"])
    p, j = timed[best_plain]["s"], timed[best_jit]["s"]
    text = (
        f"{name}, {rows} rows: best compiled {best_jit} {ms(j)} ms against best "
        f"non-compiled {best_plain} {ms(p)} ms: **{p / j:.2f}x**"
    )
    if p > j:
        for key, label in (("cold", "cold compile"), ("disk", "disk-cache start")):
            first = timed[best_jit].get(key, {})
            if "s" in first:  # calls n with first + (n - 1) j <= n p
                calls = (first["s"] - j) / (p - j)
                text += f"; its {label} ({first['s']:.2f} s) pays back after {calls:,.0f} calls"
    return text, p / j


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES), help="rows per batch")
    parser.add_argument("--repeat", type=int, default=7, help="timed repeats per form")
    parser.add_argument("--quick", action="store_true", help="16 rows, 2 repeats: not figures")
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile's backend (eager: checks the script)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per child interpreter")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, name, rows, backend, *rest = args.child
        if mode == "warm":
            print(json.dumps(warm(name, int(rows), backend, int(rest[0]))))
        else:
            print(json.dumps(first_call(name, int(rows), rest[0], backend)))
        return 0
    if args.repeat < 1 or min(args.sizes) < 1:
        parser.error(f"--repeat={args.repeat} and --sizes={args.sizes} must be >= 1")
    sizes, repeat = ([16], 2) if args.quick else (args.sizes, args.repeat)
    args.repeat = repeat
    print(
        f"{machine()}\nbackend={args.backend}, warm: median of {repeat} interleaved repeats"
        + (" (--quick: not figures)" if args.quick else "")
    )
    for name in args.workloads:
        print(f"- {name}: {WORKLOADS[name].about}")
    print(
        "\n| workload | rows | form | warm ms | spread | vs serial | first call, cold s "
        "| first call, disk cache s | values vs serial | graphs |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|",
        flush=True,
    )
    verdicts: dict[str, list[tuple[str, float | None]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench_jit-"))
    try:
        for name in args.workloads:
            for rows in sizes:
                results = cell(name, rows, args, tmp)
                serial = results["serial"].get("s")
                for form, r in results.items():
                    print(row(name, rows, form, r, serial), flush=True)
                verdicts.setdefault(name, []).append(verdict(name, rows, results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nThe rule: a compiled form that wins warm by >= {SPEEDUP}x on a realistic workload "
        "would be offered as a batched form auto can weigh.\n"
    )
    for name, found in verdicts.items():
        for text, _ in found:
            print(f"- {text}")
        best = max((s for _, s in found if s is not None), default=None)
        if best is None:
            print(f"- **{name}: no compiled form ran**")
            continue
        bar = "meets" if best >= SPEEDUP else "is under"
        print(
            f"- **{name}: best warm speedup of a compiled form {best:.2f}x: "
            f"{bar} the {SPEEDUP}x bar**"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
