"""Preparing a data set: ``prep run`` against what its user would otherwise write.

The jobs, each over files of saved tensors (``torch.save`` of a dict of tensors sharing
dim 0), with row functions from ``scripts/prepare_jobs.py``:

  wwm           whole-word masking of token ids in pure Python (``wwm_row``, the GIL held
                throughout); ``--shards`` of ``input_ids`` int64 [``--rows-wwm``, 128]
  images        resize 256 -> 224 (bilinear, antialiased), colour jitter, normalise,
                float16 (``image_row``, torch ops); ``--shards`` of ``image`` uint8
                [``--rows-images``, 3, 256, 256]
  small-torch   ``--small-shards`` (2,000) of ``x`` int64 [8, 32], a light torch row
                (``cumsum_row``): what a shard costs beyond its rows
  small-python  the same shards, a pure-Python row of about 40 us (``python_row``)
  big           3 shards of ``--big-gib`` (1) GiB, ``x`` float32 [65536, 4096], a light
                torch row (``affine_row``, ``x * 0.5 + 1``): reading, writing and memory
  JOB-xN        a job with N times its rows in each shard: ``wwm-x10``, ``images-x10``
                are the short jobs made long (the same shards, ten times the rows)

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
  prep run           ``python -m prep run DATA --out DEST --fn prepare_jobs:...``: its
                     defaults, its progress lines (one a shard) on a pipe, as a log gets them
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
removed at the end, also after an error, Ctrl-C or SIGTERM. On the big job the loop's
outputs are kept on disk and mapped (``mmap``), as are the outputs read back, so this
process holds none of them in its own memory.

Besides its seconds (exec to exit), each run gives (``scripts/watch_run.py``):

* **peak PSS**, of the contender's whole process tree: every ``--pss-ms`` (50) ms a
  thread of this process sums ``Pss:`` of /proc/PID/smaps_rollup over every process in
  the contender's session (it starts in one of its own; its workers inherit it); the
  table has the highest of the repeats' peaks, in MiB, and on the big job in shards too
  (peak / one input shard's bytes). A sample every 50 ms misses a shorter peak, so it is
  a lower bound; PSS counts a forked worker's shared pages once, and a library page
  shared with a process outside the tree (this one imports torch too) only in part.
  The sampler costs this process a few ms of one core a sample.
* **prep run's fixed part**, in seconds: exec to the first shard starting, and the last
  shard to exit. Measured from outside, prep unchanged: each stderr line is timestamped
  as it arrives on the pipe (prep flushes every line). A shard's line comes once its
  manifest group is committed and says the shard's own seconds (load to save, the
  manifest's figure is used); the earliest (arrival - own seconds) is when the first
  shard started, an upper bound by the trip of its result and the group commit (a few
  ms); the last shard line to the exit is the tail (the summary, closing the workers,
  the interpreter's exit), a lower bound by as much. The summary line's seconds start
  when prep starts its workers, which splits the start into exec to that clock
  (interpreter, imports, listing the shards) and the rest (the workers' start, the
  plan's measurement of the first shard). ``python -c "import torch"``'s seconds and
  peak PSS, the floor every contender pays, head the report. (Comparing a one-shard
  run's wall time with that floor would fold the shard's own work into the figure.)

The targets (issue 38), each line saying met or NOT met: ``prep run`` (defaults) within
1.1x the best other tool (loop, mp.Pool, datasets.map, litdata.optimize) on the small
jobs, within 1.05x on wwm and images, ahead of it on the -xN jobs, at least 1.8x faster
than the loop on wwm; on the big job a peak of at most workers x 2 + 1 shards (workers:
those its plan names, else ``--workers``).

    python scripts/bench_prepare.py                          # wwm and images, 3 repeats
    python scripts/bench_prepare.py --jobs wwm-x10,images-x10 --contenders loop,pool,prep
    python scripts/bench_prepare.py --jobs big --prep-flags "" --big-gib 0.25
    python scripts/bench_prepare.py --contenders loop,mp.Pool,prep --prep-flags "--jobs 4"
    python scripts/bench_prepare.py --quick --jobs big,wwm-x10   # a smoke test: tiny shards
    pip install 'prep[compare]'                              # datasets and litdata
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import re
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
from watch_run import PSS_EVERY, Fixed, Watched, fixed_part, plan_workers, watch

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
SIDE, SMALL = prepare_jobs.OUT_SIDE, (prepare_jobs.SMALL_WIDTH,)
OUTPUT = {
    "wwm_row": ((prepare_jobs.SEQ,), "int64"),
    "image_row": ((3, SIDE, SIDE), "float16"),
    "cumsum_row": (SMALL, "int64"),
    "python_row": (SMALL, "int64"),
    "affine_row": ((prepare_jobs.BIG_WIDTH,), "float32"),
}

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
    "big": "affine_row",  # issue 38: 3 shards of 1 GiB (--big-gib)
}
BIG_SHARDS = 3
#: a job with N times the rows in each shard: "wwm-x10"
SCALED = re.compile(r"(?P<base>.+)-x(?P<times>[1-9][0-9]*)")


@dataclass(frozen=True)
class Job:
    name: str  # as asked: "wwm", "wwm-x10", "big"
    base: str  # its function's key in FUNCTIONS, its maker's in prepare_jobs.MAKERS
    shards: int
    rows: int  # in each shard
    scale: int  # N of a -xN job, else 1

    @property
    def fn(self) -> str:
        return FUNCTIONS[self.base]


def job_of(name: str, args: argparse.Namespace) -> Job:
    """The job ``name`` asks for, sized by ``args``; ValueError if there is none."""
    m = SCALED.fullmatch(name)
    base, scale = (m["base"], int(m["times"])) if m else (name, 1)
    if base not in FUNCTIONS:
        raise ValueError(f"{name}: not one of {', '.join(FUNCTIONS)}, nor one of them "
                         f"with -xN (N times the rows a shard, e.g. wwm-x10)")  # fmt: skip
    big_rows = max(1, round(args.big_gib * prepare_jobs.GIB_ROWS))
    rows = {"wwm": args.rows_wwm, "images": args.rows_images, "big": big_rows}
    shards = BIG_SHARDS if base == "big" else args.small_shards if small(base) else args.shards
    return Job(name, base, shards, rows.get(base, args.rows_small) * scale, scale)


def small(base: str) -> bool:
    return base.startswith("small-")


@dataclass
class Contender:
    name: str
    argv: list[str]  # without DEST
    kind: str  # "files" (DEST/<name>.pt of {"out": ...}), "datasets" or "litdata"
    times: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)  # bytes of PSS, a run's highest sample
    fixed: list[Fixed] = field(default_factory=list)  # prep run's, a run's
    workers: int | None = None  # prep run's, as its plan line names them
    failed: str | None = None  # why it exited non-zero
    wrong: str | None = None  # how its output differs from the loop's

    @property
    def ok(self) -> bool:
        return self.failed is None and self.wrong is None and bool(self.times)


# ------------------------------------------------------------------ reading and checking


def read_outputs(kind: str, dest: Path, names: list[str], rows: list[int]) -> list[torch.Tensor]:
    """Each input shard's ``out``, in the inputs' order, read back with the tool's reader."""
    if kind == "files":  # mapped, not read into this process's memory (the big job's GiBs)
        return [torch.load(dest / n, weights_only=True, mmap=True)["out"] for n in names]
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


def reference(
    data: Path, names: list[str], fn_name: str, spill: Path | None = None
) -> tuple[list[torch.Tensor], float]:
    """The plain loop's outputs, computed in this process, and its seconds a row; with
    ``spill``, each output is saved there and mapped back (a GiB shard's is not held)."""
    fn = getattr(prepare_jobs, fn_name)
    outs, spent, n = [], 0.0, 0
    for name in names:
        shard = torch.load(data / name, weights_only=True)
        fn(**{k: v[0] for k, v in shard.items()})  # a first call's one-off costs, untimed
        rows = len(next(iter(shard.values())))
        start = time.perf_counter()
        out = torch.stack([fn(**{k: v[i] for k, v in shard.items()}) for i in range(rows)])
        spent, n = spent + time.perf_counter() - start, n + rows
        del shard
        if spill is not None:
            spill.mkdir(exist_ok=True)
            torch.save({"out": out}, spill / name)
            out = torch.load(spill / name, weights_only=True, mmap=True)["out"]
        outs.append(out)
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
    c: Contender, dest: Path, root: Path, env: dict[str, str], args: argparse.Namespace
) -> Watched | None:
    """The run, watched (``scripts/watch_run.py``), or None after marking ``c`` failed (or
    killed, with every process it started, after ``--timeout`` seconds)."""
    argv = [*c.argv, str(dest)] if c.kind == "prep" else [*c.argv[:3], str(dest), *c.argv[3:]]
    os.sync()
    w = watch(argv, cwd=root, env=env, limit=args.timeout, every=args.pss_ms / 1000)
    if w.returncode is None:
        c.failed = f"killed after {args.timeout:.0f} s (--timeout)"
        return None
    if w.returncode != 0:
        c.failed = f"exit {w.returncode}: {first_error(w.stderr)}"
        return None
    return w


def contenders(args: argparse.Namespace, job: Job, data: Path, files: list[str]) -> list[Contender]:
    py = sys.executable
    out: list[Contender] = []
    for name in SCRIPTS:
        kind = NEEDS.get(name, "files")
        # argv: python SCRIPT FUNCTION [DEST inserted here] WORKERS FILE...
        argv = [py, f"{slug(name)}.py", job.fn, str(args.workers), *files]
        out.append(Contender(name, argv, kind))
    # not --quiet: its progress lines (one a shard, flushed) time its fixed part
    prep = [py, "-m", "prep", "run", str(data), "--fn", f"prepare_jobs:{job.fn}"]
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


def shard_seconds(dest: Path) -> dict[str, float]:
    """Each input's own seconds, from prep's manifest in ``dest`` (finer than its lines)."""
    try:
        lines = (dest / "manifest.jsonl").read_text().splitlines()
    except OSError:
        return {}
    entries = [json.loads(line) for line in lines if line.strip()]
    return {e["input"]: float(e["seconds"]) for e in entries if "seconds" in e}


def race(args: argparse.Namespace, job: Job, root: Path, env: dict[str, str]) -> list[str]:
    """Write the job's shards, race the contenders on them, and return the report's lines."""
    data, spill = root / f"data-{job.name}", root / f"loop-{job.name}"
    try:
        paths = prepare_jobs.write_shards(data, job.base, job.shards, job.rows, seed=1)
        names = [p.name for p in paths]
        shard_bytes = statistics.mean(p.stat().st_size for p in paths)
        # the big job's outputs on disk, mapped: this process holds none of their GiBs
        want, per_row = reference(data, names, job.fn, spill if job.base == "big" else None)
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
                if not (c.failed or c.wrong):  # else reported once: its repeats say nothing new
                    run_and_check(c, root / "out" / slug(c.name), root, env, args, names, job,
                                  want)  # fmt: skip
        del want
        return report(args, job, racing, per_row, shard_bytes, notes)
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(spill, ignore_errors=True)


def run_and_check(
    c: Contender,
    dest: Path,
    root: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    names: list[str],
    job: Job,
    want: list[torch.Tensor],
) -> None:
    """One run of ``c``: its figures recorded, its output checked, then removed."""
    try:
        w = run_once(c, dest, root, env, args)
        if w is None:
            return
        c.times.append(w.seconds)
        if w.peak is not None:
            c.peaks.append(w.peak)
        kind = "files" if c.kind == "prep" else c.kind
        try:
            c.wrong = check(read_outputs(kind, dest, names, [job.rows] * len(names)), want, names)
        except Exception as exc:  # unreadable output: as wrong as a different one
            c.wrong = f"output unreadable ({type(exc).__name__}: {exc})"[:200]
        if c.kind != "prep":
            return
        if c.wrong is None and not (dest / "manifest.jsonl").is_file():
            c.wrong = "no manifest.jsonl beside the outputs"
        fixed = fixed_part(w, shard_seconds(dest))
        if fixed is not None:
            c.fixed.append(fixed)
        c.workers = c.workers or plan_workers(w)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


# ------------------------------------------------------------------ the report


def report(
    args: argparse.Namespace,
    job: Job,
    racing: list[Contender],
    per_row: float,
    shard_bytes: float,
    notes: list[str],
) -> list[str]:
    medians = {c.name: statistics.median(c.times) for c in racing if c.times}
    ok = {c.name: medians[c.name] for c in racing if c.ok}
    loop = ok.get("loop")
    best = min(ok.values()) if ok else None
    big = job.base == "big"
    lines = [
        f"### {job.name}: {job.shards} shards x {job.rows:,} rows ({size(shard_bytes)} "
        f"a shard), `prepare_jobs:{job.fn}` ({per_row * 1e6:,.1f} us a row in this "
        f"process), {args.workers} workers, {args.repeat} repeat(s)",
        "",
    ]
    body = []
    for c in sorted(racing, key=lambda c: (not c.ok, medians.get(c.name, float("inf")))):
        m = medians.get(c.name)
        peak = max(c.peaks) if c.peaks else None
        memory = [mib(peak)] + ([f"{peak / shard_bytes:.2f}" if peak else "-"] if big else [])
        if m is None:
            body.append([f"`{c.name}`", "-", "-", "-", "-", *memory, "-", f"failed ({c.failed})"])
            continue
        status = "ok" if c.ok else f"WRONG: {c.wrong}" if c.wrong else f"failed ({c.failed})"
        body.append([
            f"`{c.name}`",
            f"{m:.2f}",
            f"{min(c.times):.2f}-{max(c.times):.2f}",
            f"{m / loop:.2f}" if loop and c.ok else "-",
            f"{m / best:.2f}" if best and c.ok else "-",
            *memory,
            str(median_fixed(c.fixed)) if c.fixed else "-",
            status,
        ])  # fmt: skip
    header = ["contender", "median s", "min-max s", "/ loop", "/ best", "peak PSS MiB",
              *(["peak / shard"] if big else []), "fixed s (start + end)", "status"]  # fmt: skip
    lines += [table(body, header), "", *notes, *fixed_lines(racing)]
    return lines + targets(args, job, racing, ok, shard_bytes)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def median_fixed(runs: list[Fixed]) -> Fixed:
    clocks = [f.clock for f in runs if f.clock is not None]
    return Fixed(
        statistics.median(f.start for f in runs),
        statistics.median(f.end for f in runs),
        statistics.median(clocks) if clocks else None,
    )


def fixed_lines(racing: list[Contender]) -> list[str]:
    """prep run's fixed part, split where its summary's clock allows."""
    out = []
    for c in racing:
        if not c.fixed:
            continue
        f = median_fixed(c.fixed)
        split = (f" (exec to its run clock {f.clock:.2f} s: interpreter, imports, listing; "
                 f"then {f.start - f.clock:.2f} s: workers, the plan's measurement)"
                 if f.clock is not None else "")  # fmt: skip
        out.append(f"- fixed part of `{c.name}` (medians of {len(c.fixed)}): exec to its "
                   f"first shard starting {f.start:.2f} s{split}; its last shard to exit "
                   f"{f.end:.2f} s")  # fmt: skip
    return out


def targets(
    args: argparse.Namespace,
    job: Job,
    racing: list[Contender],
    ok: dict[str, float],
    shard_bytes: float,
) -> list[str]:
    """The targets' lines: met or not, with the figures they compare."""
    prep = ok.get(PREP)
    others = {n: s for n, s in ok.items() if not n.startswith(PREP)}
    if prep is None:
        raced = [c.name for c in racing]
        why = "did not run correctly" if PREP in raced else "was not raced (--contenders)"
        return [f"- targets ({job.name}): not judged; `{PREP}` (defaults) {why}"]
    out = []
    if others and job.base != "big":  # the big job's target is its memory
        name, s = min(others.items(), key=lambda kv: kv[1])
        most, said = ((1.0, "ahead of it, < 1.00x") if job.scale > 1 else
                      (1.1, "<= 1.1x") if small(job.base) else (1.05, "<= 1.05x"))  # fmt: skip
        mark = "met" if prep < s or (most > 1 and prep <= most * s) else "NOT met"
        out.append(f"- target ({job.name}) {mark}: `{PREP}` {prep:.2f} s, {prep / s:.2f}x the "
                   f"best other tool, `{name}` {s:.2f} s ({said})")  # fmt: skip
    if job.name == "wwm" and "loop" in ok:
        speedup = ok["loop"] / prep
        mark = "met" if speedup >= 1.8 else "NOT met"
        out.append(f"- target ({job.name}) {mark}: `{PREP}` {speedup:.2f}x faster than the "
                   f"loop (>= 1.8x)")  # fmt: skip
    c = next(c for c in racing if c.name == PREP)
    if job.base == "big" and c.peaks:
        workers = c.workers or args.workers
        bound, peak = 2 * workers + 1, max(c.peaks) / shard_bytes
        mark = "met" if peak <= bound else "NOT met"
        out.append(f"- target ({job.name}) {mark}: `{PREP}` peak PSS {peak:.2f} shards "
                   f"(<= {workers} workers x 2 + 1 = {bound})")  # fmt: skip
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


def floor(args: argparse.Namespace, env: dict[str, str]) -> str:
    """What every contender pays before its first row: ``python -c "import torch"``."""
    runs = [watch([sys.executable, "-c", "import torch"], env=env, every=args.pss_ms / 1000)
            for _ in range(args.repeat)]  # fmt: skip
    peaks = [w.peak for w in runs if w.peak is not None]
    return (f'`python -c "import torch"`: {statistics.median(w.seconds for w in runs):.2f} s, '
            f"peak PSS {mib(max(peaks) if peaks else None)} MiB")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="wwm,images",
                    help="comma-separated: wwm, images, small-torch, small-python, big, or "
                         "any of them with -xN, N times the rows a shard (wwm-x10)")  # fmt: skip
    ap.add_argument("--small-shards", type=int, default=2000, help="shards of the small jobs")
    ap.add_argument("--rows-small", type=int, default=8, help="rows per small shard")
    ap.add_argument("--big-gib", type=float, default=1.0,
                    help="GiB per shard of the big job (its 3 shards; 0.02 for a smoke "
                         "test)")  # fmt: skip
    ap.add_argument("--shards", type=int, default=8, help="shards of wwm and images")
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
    ap.add_argument("--pss-ms", type=float, default=PSS_EVERY * 1000,
                    help="milliseconds between two samples of a run's PSS (0: none)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds a run may take before it is killed (and failed)")  # fmt: skip
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test: tiny shards (big: 10 MiB), 1 repeat")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.quick:
        args.shards, args.rows_wwm, args.rows_images, args.repeat = 2, 128, 8, 1
        args.small_shards = min(args.small_shards, 20)
        args.big_gib = min(args.big_gib, 0.01)
        args.timeout = min(args.timeout, 120)
    if args.big_gib <= 0 or args.repeat < 1 or args.pss_ms < 0:
        ap.error(f"--big-gib {args.big_gib} and --repeat {args.repeat} must be > 0, "
                 f"--pss-ms {args.pss_ms} >= 0")  # fmt: skip
    try:
        jobs = [job_of(j.strip(), args) for j in args.jobs.split(",") if j.strip()]
    except ValueError as exc:
        ap.error(f"--jobs {exc}")
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
        subprocess.run([sys.executable, "-c", "import torch, prep"], check=False)  # warm
        print(f"# bench_prepare: prep run against a user's own preparation\n\n{machine()}; "
              f"{args.repeat} repeat(s) interleaved, medians; PREP_WISDOM={args.wisdom}; "
              f"PSS sampled every {args.pss_ms:g} ms; {floor(args, env)}"
              + ("; --quick: a smoke test, its times are mostly start-up and judge nothing"
                 if args.quick else "") + "\n", flush=True)  # fmt: skip
        for job in jobs:
            print("\n".join(race(args, job, root, env)) + "\n", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
