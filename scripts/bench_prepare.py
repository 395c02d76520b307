"""Preparing a data set: ``prep run`` against what its user would otherwise write.

Two jobs, each over ``--shards`` files of saved tensors (``torch.save`` of a dict of
tensors sharing dim 0), with row functions from ``scripts/prepare_jobs.py``:

  wwm      whole-word masking of token ids in pure Python (``prepare_jobs:wwm_row``, the
           GIL held throughout); shards of ``input_ids`` int64 [rows, 128] and ``seed``
  images   resize 256 -> 224 (bilinear, antialiased), colour jitter, normalise, float16
           (``prepare_jobs:image_row``, torch ops); shards of ``image`` uint8
           [rows, 3, 256, 256] and ``seed``

The contenders, each a fresh process of ``sys.executable`` (every one pays its own
interpreter start and ``import torch``), with prepare_jobs.py and the
contenders' scripts copied into a temporary folder under /tmp that is also their cwd:

  loop               for each file: ``torch.load(weights_only=True)``, the function on every
                     row with the shard's columns as keywords, ``torch.stack``, ``torch.save``
  mp.Pool            the same per-file function through ``multiprocessing.Pool(N).map``
                     (default start method, no thread settings)
  datasets.map       ``Dataset.from_dict`` of all the rows, ``.with_format("torch")``,
                     ``.map(num_proc=N)``, ``save_to_disk`` (needs ``datasets``)
  litdata.optimize   ``litdata.optimize`` of a function that reads one file and yields its
                     rows, ``num_workers=N`` (needs ``litdata``)
  prep run           ``python -m prep run DATA --out DEST --fn prepare_jobs:... --quiet``
  prep run FLAGS     the same with each of ``--prep-flags`` (``;``-separated)

They run interleaved (the order rotates every repeat, so a slow spell of the machine hits
all alike), ``os.sync()`` before each, so none pays for another's write-back; the table
has the medians of ``--repeat`` runs. The data is in the page cache for all of them (it
was just written). Every output is checked equal (``torch.equal``, dtype and shape too) to
the plain loop's, computed once in this process before the race, each contender's read
back with its own reader; one that differs is marked WRONG and never counted, one that
exits non-zero (or runs past ``--timeout``) is marked failed with its error's line. All
get ``TMPDIR`` and ``HF_HOME`` inside the temporary folder; prep's own bytecode is
compiled first (``compileall``), as an installed package ships it; ``prep`` runs with
``PREP_WISDOM=off`` (every run a first run) unless ``--wisdom kept``. The folder is
removed at the end, also after an error, Ctrl-C or SIGTERM.

The targets: ``prep run`` (defaults) within 1.05x the best of the other tools (loop,
mp.Pool, datasets.map, litdata.optimize); on wwm, ``prep run`` at least 1.8x faster than
the loop.

    python scripts/bench_prepare.py                          # both jobs, 8 shards, 3 repeats
    python scripts/bench_prepare.py --jobs wwm --repeat 5 --workers 4
    python scripts/bench_prepare.py --contenders loop,mp.Pool,prep --prep-flags "--jobs 4"
    python scripts/bench_prepare.py --quick                  # a smoke test: 2 small shards
    pip install 'prep[compare]'                              # datasets and litdata
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import prepare_jobs
import torch

from prep.bench import table

HERE = Path(__file__).resolve().parent

# ------------------------------------------------------------------ the contenders' scripts
# Each is called as: python SCRIPT FUNCTION DEST WORKERS FILE... (FUNCTION: a name in
# prepare_jobs), with the temporary folder as cwd; each writes its outputs under DEST.

LOOP = """
import sys
from pathlib import Path

import torch

import prepare_jobs


def process_file(fn, src, dest):
    shard = torch.load(src, weights_only=True)
    rows = len(next(iter(shard.values())))
    out = [fn(**{k: v[i] for k, v in shard.items()}) for i in range(rows)]
    torch.save({"out": torch.stack(out)}, Path(dest) / Path(src).name)


if __name__ == "__main__":
    name, dest, _workers, *files = sys.argv[1:]
    fn = getattr(prepare_jobs, name)
    Path(dest).mkdir(parents=True, exist_ok=True)
    for src in files:
        process_file(fn, src, dest)
"""

POOL = """
import functools
import multiprocessing
import sys
from pathlib import Path

import torch

import prepare_jobs


def process_file(name, dest, src):
    fn = getattr(prepare_jobs, name)
    shard = torch.load(src, weights_only=True)
    rows = len(next(iter(shard.values())))
    out = [fn(**{k: v[i] for k, v in shard.items()}) for i in range(rows)]
    torch.save({"out": torch.stack(out)}, Path(dest) / Path(src).name)


if __name__ == "__main__":
    name, dest, workers, *files = sys.argv[1:]
    Path(dest).mkdir(parents=True, exist_ok=True)
    with multiprocessing.Pool(int(workers)) as pool:
        pool.map(functools.partial(process_file, name, dest), files)
"""

DATASETS = '''
import sys

import datasets
import numpy
import torch

import prepare_jobs


def feature(shape, dtype):
    """The datasets feature of one row's array of this shape and dtype."""
    if len(shape) == 0:
        return datasets.Value(dtype)
    if len(shape) == 1:
        seq = getattr(datasets, "List", None) or datasets.Sequence
        return seq(datasets.Value(dtype), length=shape[0])
    return getattr(datasets, f"Array{len(shape)}D")(shape=tuple(shape), dtype=dtype)


# what each function returns, as its author knows (no torch op runs in this process
# before map forks its workers: a forked child of a process that ran torch's thread pool
# can hang in its first parallel op)
SIDE = prepare_jobs.OUT_SIDE
OUTPUT = {"wwm_row": ((prepare_jobs.SEQ,), "int64"), "image_row": ((3, SIDE, SIDE), "float16")}

if __name__ == "__main__":
    name, dest, workers, *files = sys.argv[1:]
    fn = getattr(prepare_jobs, name)
    shards = [torch.load(src, weights_only=True) for src in files]
    columns = {k: numpy.concatenate([s[k].numpy() for s in shards]) for k in shards[0]}
    features = {k: feature(v.shape[1:], v.dtype.name) for k, v in columns.items()}
    ds = datasets.Dataset.from_dict(columns, datasets.Features(features))
    del shards, columns
    ds = ds.with_format("torch")
    out = datasets.Features({"out": feature(*OUTPUT[name])})
    ds = ds.map(lambda row: {"out": fn(**row).numpy()}, num_proc=int(workers),
                remove_columns=ds.column_names, features=out)
    ds.save_to_disk(dest)
'''

LITDATA = """
import sys

import litdata
import torch

import prepare_jobs


def rows(item):
    name, k, src = item
    fn = getattr(prepare_jobs, name)
    shard = torch.load(src, weights_only=True)
    for i in range(len(next(iter(shard.values())))):
        yield {"shard": k, "row": i, "out": fn(**{c: v[i] for c, v in shard.items()})}


if __name__ == "__main__":
    name, dest, workers, *files = sys.argv[1:]
    litdata.optimize(fn=rows, inputs=[(name, k, src) for k, src in enumerate(files)],
                     output_dir=dest, num_workers=int(workers), chunk_bytes="64MB")
"""

SCRIPTS = {"loop": LOOP, "mp.Pool": POOL, "datasets.map": DATASETS, "litdata.optimize": LITDATA}
NEEDS = {"datasets.map": "datasets", "litdata.optimize": "litdata"}
ALIASES = {"pool": "mp.Pool", "datasets": "datasets.map", "litdata": "litdata.optimize"}
PREP = "prep run"  # the defaults; its variants are named "prep run FLAGS"
DEFAULT_FLAGS = "--jobs 1;--workers 1;--parallel rows;--parallel shards"
FUNCTIONS = {
    "wwm": "wwm_row",
    "images": "image_row",
    "small-torch": "cumsum_row",  # issue 38: many small shards (--small-shards of 8 rows)
    "small-python": "python_row",
}


@dataclass
class Contender:
    name: str
    argv: list[str]  # without DEST
    kind: str  # "files" (DEST/<name>.pt of {"out": ...}), "datasets" or "litdata"
    times: list[float] = field(default_factory=list)
    failed: str | None = None  # why it exited non-zero
    wrong: str | None = None  # how its output differs from the loop's

    @property
    def ok(self) -> bool:
        return self.failed is None and self.wrong is None and bool(self.times)


# ------------------------------------------------------------------ reading and checking


def read_outputs(kind: str, dest: Path, names: list[str], rows: list[int]) -> list[torch.Tensor]:
    """Each input shard's ``out``, in the inputs' order, read back with the tool's reader."""
    if kind == "files":
        return [torch.load(dest / n, weights_only=True)["out"] for n in names]
    if kind == "datasets":
        import datasets

        ds = datasets.load_from_disk(str(dest))
        feature = ds.features["out"]
        dtype = getattr(feature, "dtype", None) or feature.feature.dtype
        # the numpy format casts floats to float32 unless told the dtype
        col = ds.with_format("numpy", dtype=dtype)["out"][:]
        return list(torch.from_numpy(col).split(rows))
    import litdata

    got = sorted(
        ((int(x["shard"]), int(x["row"])), x["out"])
        for x in litdata.StreamingDataset(str(dest))
    )  # fmt: skip
    if [k for k, _ in got] != [(s, i) for s, n in enumerate(rows) for i in range(n)]:
        raise ValueError(f"{len(got)} rows came back, not one of each of the {sum(rows)}")
    outs = [t for _, t in got]
    return [torch.stack(outs[a : a + n]) for a, n in zip(starts(rows), rows)]


def starts(rows: list[int]) -> list[int]:
    return [sum(rows[:k]) for k in range(len(rows))]


def check(got: list[torch.Tensor], want: list[torch.Tensor], names: list[str]) -> str | None:
    """None if equal, else the first difference."""
    if len(got) != len(want):
        return f"{len(got)} outputs for {len(want)} shards"
    for name, g, w in zip(names, got, want):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{name}: {g.dtype} {tuple(g.shape)}, the loop's {w.dtype} {tuple(w.shape)}"
        if not torch.equal(g, w):
            bad = (g != w).flatten(1).any(1).nonzero().flatten().tolist()
            return f"{name}: {len(bad)} rows differ (first: row {bad[0]})"
    return None


def reference(data: Path, names: list[str], fn_name: str) -> tuple[list[torch.Tensor], float]:
    """The plain loop's outputs, computed in this process, and its seconds a row."""
    fn = getattr(prepare_jobs, fn_name)
    outs, spent, n = [], 0.0, 0
    for name in names:
        shard = torch.load(data / name, weights_only=True)
        fn(**{k: v[0] for k, v in shard.items()})  # a first call's one-off costs, untimed
        rows = len(next(iter(shard.values())))
        start = time.perf_counter()
        outs.append(torch.stack([fn(**{k: v[i] for k, v in shard.items()}) for i in range(rows)]))
        spent, n = spent + time.perf_counter() - start, n + rows
    return outs, spent / max(n, 1)


# ------------------------------------------------------------------ running


def first_error(stderr: str) -> str:
    """The line of ``stderr`` that says what went wrong: the last one not indented (an
    exception's line after its traceback, argparse's ``error:`` after its usage; the lines
    before it are often warnings or headers)."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith((" ", "\t")):
            return line[:200]
    return lines[-1].strip()[:200] if lines else "(no stderr)"


def run_once(
    c: Contender, dest: Path, root: Path, env: dict[str, str], limit: float
) -> float | None:
    """Seconds the command took, or None after marking ``c`` failed (or killed, with every
    process it started, after ``limit`` seconds)."""
    argv = [*c.argv, str(dest)] if c.kind == "prep" else [*c.argv[:3], str(dest), *c.argv[3:]]
    os.sync()
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: a timeout ends its workers too
    )  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        c.failed = f"killed after {limit:.0f} s (--timeout)"
        return None
    finally:
        if proc.poll() is None:  # interrupted: leave nothing of it running
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        c.failed = f"exit {proc.returncode}: {first_error(stderr)}"
        return None
    return seconds


def contenders(args: argparse.Namespace, job: str, data: Path, files: list[str]) -> list[Contender]:
    fn = FUNCTIONS[job]
    py = sys.executable
    out: list[Contender] = []
    for name in SCRIPTS:
        kind = NEEDS.get(name, "files")
        # argv: python SCRIPT FUNCTION [DEST inserted here] WORKERS FILE...
        argv = [py, f"{slug(name)}.py", fn, str(args.workers), *files]
        out.append(Contender(name, argv, kind))
    prep = [py, "-m", "prep", "run", str(data), "--fn", f"prepare_jobs:{fn}", "--quiet"]
    out.append(Contender(PREP, [*prep, "--out"], "prep"))
    for flags in [f.strip() for f in args.prep_flags.split(";") if f.strip()]:
        out.append(Contender(f"{PREP} {flags}", [*prep, *flags.split(), "--out"], "prep"))
    return [c for c in out if selected(c.name, args.contenders)]


def selected(name: str, wanted: str | None) -> bool:
    if not wanted:
        return True
    picks = {ALIASES.get(w.strip(), w.strip()) for w in wanted.split(",") if w.strip()}
    if name.startswith(PREP):
        # "prep": the defaults; "prep-flags": every variant; or a variant by its full name
        return name in picks or ("prep" in picks if name == PREP else "prep-flags" in picks)
    return name in picks


def slug(name: str) -> str:
    return name.replace(".", "_").replace(" ", "_")


def importable(module: str) -> str | None:
    """None if ``module`` imports in a fresh interpreter here, else why not."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True
    )  # fmt: skip
    return None if done.returncode == 0 else first_error(done.stderr)


def race(args: argparse.Namespace, job: str, root: Path, env: dict[str, str]) -> list[str]:
    """Write the job's shards, race the contenders on them, and return the report's lines."""
    small = job.startswith("small-")
    rows_per = {"wwm": args.rows_wwm, "images": args.rows_images}.get(job, args.rows_small)
    data = root / f"data-{job}"
    shards = args.small_shards if small else args.shards
    paths = prepare_jobs.write_shards(data, job, shards, rows_per, seed=1)
    names = [p.name for p in paths]
    rows = [rows_per] * len(names)
    want, per_row = reference(data, names, FUNCTIONS[job])
    notes: list[str] = []
    racing = []
    for c in contenders(args, job, data, [str(p) for p in paths]):
        why = importable(NEEDS[c.name]) if c.name in NEEDS else None
        if why is not None:
            notes.append(f"- skipped {c.name}: {NEEDS[c.name]} does not import ({why}); "
                         f"pip install 'prep[compare]'")  # fmt: skip
            continue
        racing.append(c)
    for r in range(args.repeat):
        shift = r % max(len(racing), 1)
        for c in racing[shift:] + racing[:shift]:
            if c.failed or c.wrong:
                continue  # reported once; its later repeats would say nothing new
            dest = root / "out" / slug(c.name)
            try:
                seconds = run_once(c, dest, root, env, args.timeout)
                if seconds is None:
                    continue
                c.times.append(seconds)
                kind = "files" if c.kind == "prep" else c.kind
                try:
                    c.wrong = check(read_outputs(kind, dest, names, rows), want, names)
                except Exception as exc:  # unreadable output: as wrong as a different one
                    c.wrong = f"output unreadable ({type(exc).__name__}: {exc})"[:200]
                if c.kind == "prep" and c.wrong is None and not (dest / "manifest.jsonl").is_file():
                    c.wrong = "no manifest.jsonl beside the outputs"
            finally:
                shutil.rmtree(dest, ignore_errors=True)
    return report(args, job, rows_per, racing, per_row, notes)


# ------------------------------------------------------------------ the report


def report(
    args: argparse.Namespace,
    job: str,
    rows: int,
    racing: list[Contender],
    per_row: float,
    notes: list[str],
) -> list[str]:
    medians = {c.name: statistics.median(c.times) for c in racing if c.times}
    ok = {c.name: medians[c.name] for c in racing if c.ok}
    loop = ok.get("loop")
    best = min(ok.values()) if ok else None
    shards = args.small_shards if job.startswith("small-") else args.shards
    lines = [
        f"### {job}: {shards} shards x {rows} rows, `prepare_jobs:{FUNCTIONS[job]}` "
        f"({per_row * 1e6:,.0f} us a row in this process), {args.workers} workers, "
        f"{args.repeat} repeat(s)",
        "",
    ]
    body = []
    for c in sorted(racing, key=lambda c: (not c.ok, medians.get(c.name, float("inf")))):
        m = medians.get(c.name)
        if m is None:
            body.append([f"`{c.name}`", "-", "-", "-", "-", f"failed ({c.failed})"])
            continue
        status = "ok" if c.ok else f"WRONG: {c.wrong}" if c.wrong else f"failed ({c.failed})"
        body.append([
            f"`{c.name}`",
            f"{m:.2f}",
            f"{min(c.times):.2f}-{max(c.times):.2f}",
            f"{m / loop:.2f}" if loop and c.ok else "-",
            f"{m / best:.2f}" if best and c.ok else "-",
            status,
        ])  # fmt: skip
    header = ["contender", "median s", "min-max s", "/ loop", "/ best", "status"]
    lines += [table(body, header), "", *notes, *targets(job, ok, [c.name for c in racing])]
    return lines


def targets(job: str, ok: dict[str, float], raced: list[str]) -> list[str]:
    """The targets' lines: met or not, with the figures they compare."""
    prep = ok.get(PREP)
    others = {n: s for n, s in ok.items() if not n.startswith(PREP)}
    if prep is None:
        why = "did not run correctly" if PREP in raced else "was not raced (--contenders)"
        return [f"- targets ({job}): not judged; `{PREP}` (defaults) {why}"]
    out = []
    if others:
        name, s = min(others.items(), key=lambda kv: kv[1])
        mark = "met" if prep <= 1.05 * s else "NOT met"
        out.append(f"- target ({job}) {mark}: `{PREP}` {prep:.2f} s, {prep / s:.2f}x the best "
                   f"other tool, `{name}` {s:.2f} s (<= 1.05x)")  # fmt: skip
    if job == "wwm" and "loop" in ok:
        speedup = ok["loop"] / prep
        mark = "met" if speedup >= 1.8 else "NOT met"
        out.append(f"- target ({job}) {mark}: `{PREP}` {speedup:.2f}x faster than the loop "
                   f"(>= 1.8x)")  # fmt: skip
    return out


def machine() -> str:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return (f"machine: {os.cpu_count()} cores, {model or platform.machine()}; "
            f"torch {torch.__version__}, python {platform.python_version()}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="wwm,images",
                    help="comma-separated: wwm, images, small-torch, small-python")  # fmt: skip
    ap.add_argument("--small-shards", type=int, default=2000, help="shards of the small jobs")
    ap.add_argument("--rows-small", type=int, default=8, help="rows per small shard")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rows-wwm", type=int, default=2048, help="rows per wwm shard")
    ap.add_argument("--rows-images", type=int, default=96, help="rows per images shard")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="N for mp.Pool, datasets.map and litdata.optimize")  # fmt: skip
    ap.add_argument("--prep-flags", default=DEFAULT_FLAGS,
                    help="';'-separated flag strings, each a `prep run` contender "
                         f"(default: {DEFAULT_FLAGS!r}; '' for none)")  # fmt: skip
    ap.add_argument("--contenders",
                    help="comma-separated: loop, mp.Pool, datasets.map, litdata.optimize, "
                         "prep (the defaults), prep-flags (every variant) or a variant's "
                         "name ('prep run --jobs 1'); default all")  # fmt: skip
    ap.add_argument("--wisdom", choices=["off", "kept"], default="off",
                    help="prep's memory of its choices: off (every run a first run) or kept "
                         "in the temporary folder across the repeats")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds a run may take before it is killed (and failed)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="2 small shards, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.shards, args.rows_wwm, args.rows_images, args.repeat = 2, 128, 8, 1
        args.small_shards = min(args.small_shards, 20)
        args.timeout = min(args.timeout, 120)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in FUNCTIONS]
    if unknown:
        ap.error(f"--jobs {','.join(unknown)}: not one of {', '.join(FUNCTIONS)}")
    # SIGTERM (a timeout, a scheduler) unwinds like Ctrl-C: the folder is still removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="prep-bench-prepare-", dir="/tmp"))
    try:
        # prep's bytecode, as an installed package has it (pip compiles at install; an
        # editable install writes it on first import unless PYTHONDONTWRITEBYTECODE is set,
        # as on the development machine): else every `prep run` compiles prep's source
        import prep

        compileall.compile_dir(Path(prep.__file__).parent, quiet=1)
        shutil.copy(HERE / "prepare_jobs.py", root / "prepare_jobs.py")
        for name, text in SCRIPTS.items():
            (root / f"{slug(name)}.py").write_text(textwrap.dedent(text).lstrip())
        env = dict(os.environ)
        wisdom = str(root / "wisdom.json") if args.wisdom == "kept" else "off"
        (root / "tmp").mkdir()
        # every tool's caches and temporary files land in the folder, and go with it
        env.update(PREP_WISDOM=wisdom, HF_HOME=str(root / "hf"), HF_HUB_OFFLINE="1",
                   TMPDIR=str(root / "tmp"))  # fmt: skip
        print(f"# bench_prepare: prep run against a user's own preparation\n\n{machine()}; "
              f"{args.shards} shards per job, {args.repeat} repeat(s) interleaved, medians; "
              f"PREP_WISDOM={args.wisdom}"
              + ("; --quick: a smoke test, its times are mostly start-up and judge nothing"
                 if args.quick else "") + "\n", flush=True)  # fmt: skip
        subprocess.run([sys.executable, "-c", "import torch, prep"], check=False)  # warm
        for job in jobs:
            print("\n".join(race(args, job, root, env)) + "\n", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
