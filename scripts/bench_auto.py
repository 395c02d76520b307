"""auto against the best fixed executor, on prep's workloads and on real libraries' row functions.

Run it alone on the machine (every figure is a median of interleaved repeats):

    python scripts/bench_auto.py                        # every workload, 256 rows a batch
    python scripts/bench_auto.py --quick                # a smoke test (well under a minute)
    python scripts/bench_auto.py --workloads python,pil_augment --rows 128 --repeat 3
    python scripts/bench_auto.py --json auto.json       # the figures as JSON too

For each workload (prep's own from benchmarks.workloads, and every one of
benchmarks.libraries that can run here) and every executor that applies
(serial, threads, processes, joblib, vectorized, vmap; auto):

* warm: one prep.Pool per executor, warmed by its first --warmup calls (the first
  one's result checked against serial's with torch.equal), then timed with
  prep.bench.interleaved. The fixed executors' pools are kept from one workload to
  the next; auto gets a fresh pool per workload, warmed last (the forkserver is up).
* first 6 calls: a fresh prep.Pool timed over its first 6 calls, start-up and
  calibration included, each measurement in a fresh interpreter
  (``--one WORKLOAD EXECUTOR``, which prints JSON), so every executor pays its own
  start-up, multiprocessing's forkserver included, as in a user's fresh program.
  Repeat r runs every executor once, in an order rotated by r.
* first 6 calls with wisdom: the same, for auto in a second interpreter that finds
  what a first one remembered (prep.auto.wisdom): per repeat, a fresh wisdom file, a
  first interpreter that runs 24 calls (a training script's first run) and, timed, a
  second one's first 6 calls (column "auto 2nd run"). Every other child runs with
  PREP_WISDOM=off, and so does this script itself.
* 16 batches (--batches) of 256 rows of a ~2 ms GIL-bound pure-Python row function
  (python_work with iters tuned here), a fresh Pool("auto") against a fresh
  Pool("processes"), each in a fresh interpreter (``--many EXECUTOR``): the total.

--load: the whole run beside a training-like load, started before the first timed
call and stopped at the end: a process running torch matmuls (512 x 512, float32)
on one intra-op thread, as a training step beside a data pipeline does. Run the
script once with and once without it, alternately, to compare a quiet machine and
a busy one (the report's first line says which).

--quick: 16 rows a batch, 2 warm repeats, 1 of the first 6 calls and of 4 batches
of 16 rows, and the first 6 calls of text_re only (--first6-workloads to change).

Targets: auto within 1.15x of the best fixed executor warm, within 1.3x over the
first 6 calls, within 1.1x over a second interpreter's first 6 calls (wisdom), and
within 1.2x of processes over the 16 batches. The check that rows run in worker
processes equal serial's costs at most 2% of a batch ("check" column).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import prep
from prep.bench import interleaved, table

# the repository root, for benchmarks/: last, so a prep on PYTHONPATH still comes first
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.libraries import LIBRARY_WORKLOADS, available
from benchmarks.libraries import call as call_workload
from benchmarks.workloads import WORKLOADS, Workload, python_work

SCRIPT = Path(__file__).resolve()
PREP_DEFAULT = ["noop", "python", "sleep", "matmul", "tokenize", "side_context_small"]
FIXED = ["serial", "threads", "processes", "joblib", "vectorized", "vmap"]
AUTO = "auto"
EXECUTORS = [*FIXED, AUTO]
BATCHED = ("vectorized", "vmap")  # n/a where they raise (no twin, vmap cannot trace fn)
FIRST_CALLS = 6
AUTO2 = "auto 2nd run"  # a second interpreter's auto, with the first one's wisdom
SEED_CALLS = 24  # calls of the first interpreter that leaves its wisdom
WARM_TARGET, FIRST_TARGET, WISDOM_TARGET, MANY_TARGET = 1.15, 1.3, 1.1, 1.2
CHECK_TARGET = 0.02
MANY_ROW_S = 0.002  # the 16-batch case's row function costs about this much


# ---------------------------------------------------------------- helpers


def find_workload(name: str) -> Workload:
    if name in WORKLOADS:
        return WORKLOADS[name]
    if name in LIBRARY_WORKLOADS:
        return LIBRARY_WORKLOADS[name]
    raise SystemExit(
        f"unknown workload {name!r}; choose from {', '.join([*WORKLOADS, *LIBRARY_WORKLOADS])}"
    )


def is_samples(w: Workload) -> bool:
    return bool(getattr(w, "samples", False))


def last_choice(pool: prep.Pool) -> str:
    """The executor auto chose last, from ``pool.explain()``'s "choice: ..." lines."""
    found = re.findall(r"choice:\s*(\S+)", pool.explain())
    return found[-1] if found else "?"


def rotated(items: Sequence[str], r: int) -> list[str]:
    k = r % len(items) if items else 0
    return [*items[k:], *items[:k]]


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."


def compare(got: Any, want: Any) -> str:
    """'equal' (torch.equal), 'close' (allclose only) or 'DIFFERS'."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return "DIFFERS"
        if torch.equal(got, want):
            return "equal"
        if (got.is_floating_point() or got.is_complex()) and torch.allclose(
            got, want, rtol=1e-4, atol=1e-6, equal_nan=True
        ):
            return "close"
        return "DIFFERS"
    if isinstance(want, dict):
        if not isinstance(got, dict) or sorted(got) != sorted(want):
            return "DIFFERS"
        return worst([compare(got[k], want[k]) for k in want])
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return "DIFFERS"
        return worst([compare(g, w) for g, w in zip(got, want)])
    return "equal" if got == want else "DIFFERS"


def worst(verdicts: list[str]) -> str:
    for v in ("DIFFERS", "close"):
        if v in verdicts:
            return v
    return "equal"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    value = seconds * 1e3
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def say(line: str) -> None:
    """Progress, on stderr (the report goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    facts = prep.info()
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    libs = {}
    for module in ("numpy", "PIL", "tokenizers", "joblib"):
        try:
            libs[module] = getattr(__import__(module), "__version__", "?")
        except Exception:
            libs[module] = "missing"
    return {
        "cores": facts["cores"],
        "torch": facts["torch"],
        "torch_threads": facts["torch_threads"],
        "python": facts["python"],
        "prep": facts["prep"],
        "start_method": facts["start_method"],
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "libraries": libs,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


# ---------------------------------------------------------------- in a fresh interpreter


def one(name: str, executor: str, rows: int, workers: int, calls: int) -> dict[str, Any]:
    """A fresh Pool's first ``calls`` calls, start-up included (the ``--one`` child)."""
    w = find_workload(name)
    batch = w.batch(rows)
    times: list[float] = []
    began = time.perf_counter()
    pool = prep.Pool(executor, workers=workers)
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            call_workload(pool, w, batch)
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - began
        choice = last_choice(pool) if executor == AUTO else executor
    finally:
        t0 = time.perf_counter()
        pool.close()
        closed = time.perf_counter() - t0
    return {"total_s": total, "calls_s": times, "choice": choice, "close_s": closed}


def many(executor: str, rows: int, workers: int, batches: int, iters: int) -> dict[str, Any]:
    """A fresh Pool over ``batches`` batches of the GIL-bound row fn (the ``--many`` child)."""
    fn = functools.partial(python_work, iters=iters)
    data = [
        torch.arange(b * rows, (b + 1) * rows, dtype=torch.float32).view(rows, 1) + 1
        for b in range(batches)
    ]
    times: list[float] = []
    began = time.perf_counter()
    pool = prep.Pool(executor, workers=workers)
    try:
        for batch in data:
            t0 = time.perf_counter()
            pool.map_rows(fn, batch)
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - began
        choice = last_choice(pool) if executor == AUTO else executor
    finally:
        pool.close()
    return {"total_s": total, "calls_s": times, "choice": choice}


def child(args: list[str], timeout: float, wisdom: str = "off") -> dict[str, Any]:
    """Run this script with ``args`` in a fresh interpreter; its JSON line, or an error."""
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PREP_WISDOM": wisdom},
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:200]}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------- one workload


class Guard:
    """A variant that records its first exception instead of raising it mid-timing."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.error = ""

    def __call__(self) -> None:
        if not self.error:
            try:
                self.call()
            except Exception as exc:
                self.error = error_text(exc)


def warm(
    w: Workload, rows: int, workers: int, repeat: int, warmup: int, shared: dict[str, prep.Pool]
) -> dict[str, Any]:
    """Warm pools, checked against serial's result, timed interleaved.

    The fixed executors' pools live in ``shared`` from one workload to the next
    (they are warm pools, and starting loky's workers anew for every workload
    would only make the run longer); auto gets a fresh pool for each workload.
    A pool whose executor fails is closed and dropped from ``shared``.
    """
    batch = w.batch(rows)
    executors = [e for e in EXECUTORS if not (is_samples(w) and e in BATCHED)]
    res: dict[str, Any] = {"status": {}, "verified": {}, "warm": {}, "warm_samples": {}}
    if is_samples(w):
        for e in BATCHED:
            res["status"][e] = "n/a: a list of samples has no batched form"
    for e in executors:
        if e != AUTO and e not in shared:
            shared[e] = prep.Pool(e, workers=workers)
    auto_pool = prep.Pool(AUTO, workers=workers)
    pools = {e: auto_pool if e == AUTO else shared[e] for e in executors}

    def drop(e: str) -> None:
        pools.pop(e).close()
        shared.pop(e, None)

    try:
        try:
            reference = call_workload(pools["serial"], w, batch)
        except Exception as exc:
            res["status"] = {e: "failed: serial raised " + error_text(exc) for e in executors}
            return res
        ok: list[str] = []
        for e in executors:  # auto last: the forkserver is up by then, as in a warm program
            try:
                got = reference if e == "serial" else call_workload(pools[e], w, batch)
                for _ in range(warmup - 1):
                    call_workload(pools[e], w, batch)
            except Exception as exc:
                res["status"][e] = ("n/a: " if e in BATCHED else "failed: ") + error_text(exc)
                drop(e)
                continue
            res["verified"][e] = compare(got, reference)
            res["status"][e] = "ok"
            ok.append(e)
        guards = {e: Guard(lambda e=e: call_workload(pools[e], w, batch)) for e in ok}
        timings = interleaved(guards, repeat=repeat, warmup=0)
        for e, guard in guards.items():
            if guard.error:
                res["status"][e] = "failed: " + guard.error
                drop(e)
                continue
            res["warm"][e] = timings[e].median
            res["warm_samples"][e] = list(timings[e].samples)
        if AUTO in pools:
            res["warm_choice"] = last_choice(auto_pool)
            res["warm_explain"] = auto_pool.explain()
            res["check_s"] = sum(c.check_seconds for c in auto_pool.choices())
    finally:
        auto_pool.close()
    return res


def first_calls(
    name: str, executors: list[str], rows: int, workers: int, repeat: int, timeout: float
) -> dict[str, Any]:
    wise = [*executors, AUTO2] if AUTO in executors else executors
    samples: dict[str, list[float]] = {e: [] for e in wise}
    choices: list[str] = []
    errors: dict[str, str] = {}
    firsts: dict[str, list[float]] = {e: [] for e in wise}
    for r in range(repeat):
        for e in rotated(wise, r):
            if e in errors:
                continue
            args = ["--one", name, e, "--rows", str(rows), "--workers", str(workers)]
            out = second_run(args, timeout) if e == AUTO2 else child(args, timeout)
            if "error" in out:
                errors[e] = out["error"]
                continue
            samples[e].append(out["total_s"])
            firsts[e].append(out["calls_s"][0])
            if e == AUTO:
                choices.append(out["choice"])
    return {
        "first6": {e: statistics.median(s) for e, s in samples.items() if s and e not in errors},
        "first6_samples": {e: s for e, s in samples.items() if s},
        "first_call": {e: statistics.median(s) for e, s in firsts.items() if s},
        "first6_choices": choices,
        "first6_errors": errors,
    }


def second_run(args: list[str], timeout: float) -> dict[str, Any]:
    """auto's first calls in a second interpreter, after a first one left its wisdom."""
    import tempfile

    args[2] = AUTO  # ["--one", workload, executor, ...]
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "wisdom.json")
        seed = child([*args, "--calls", str(SEED_CALLS)], timeout, path)
        if "error" in seed:
            return {"error": f"first interpreter: {seed['error']}"}
        return child(args, timeout, path)


def best_of(times: dict[str, float]) -> tuple[str | None, float | None]:
    fixed = {e: t for e, t in times.items() if e not in (AUTO, AUTO2)}
    if not fixed:
        return None, None
    e = min(fixed, key=fixed.__getitem__)
    return e, fixed[e]


def verdict(
    times: dict[str, float], target: float
) -> tuple[str | None, float | None, float | None, bool | None]:
    best, best_t = best_of(times)
    auto_t = times.get(AUTO)
    if best_t is None or auto_t is None:
        return best, best_t, None, None
    ratio = auto_t / best_t if best_t > 0 else float("inf")
    return best, best_t, ratio, ratio <= target


# ---------------------------------------------------------------- the 16-batch case


def tune_iters(target_s: float, probe_iters: int = 20_000, rows: int = 5) -> tuple[int, float]:
    """iters for python_work to take ``target_s`` a row here, and the per-row time measured."""

    def per_row(iters: int) -> float:
        row = torch.ones(1)
        best = float("inf")
        for _ in range(3):  # the fastest block: noise only slows a block down
            t0 = time.perf_counter()
            for _ in range(rows):
                python_work(row, iters=iters)
            best = min(best, (time.perf_counter() - t0) / rows)
        return best

    iters = max(1_000, round(probe_iters * target_s / per_row(probe_iters)))
    return iters, per_row(iters)


def many_case(rows: int, workers: int, batches: int, repeat: int, timeout: float) -> dict[str, Any]:
    iters, row_s = tune_iters(MANY_ROW_S)
    samples: dict[str, list[float]] = {AUTO: [], "processes": []}
    choices: list[str] = []
    errors: dict[str, str] = {}
    for r in range(repeat):
        for e in rotated([AUTO, "processes"], r):
            if e in errors:
                continue
            args = ["--many", e, "--rows", str(rows), "--workers", str(workers)]
            args += ["--batches", str(batches), "--iters", str(iters)]
            out = child(args, timeout)
            if "error" in out:
                errors[e] = out["error"]
                continue
            samples[e].append(out["total_s"])
            if e == AUTO:
                choices.append(out["choice"])
    medians = {e: statistics.median(s) for e, s in samples.items() if s}
    ratio = (
        medians[AUTO] / medians["processes"] if AUTO in medians and "processes" in medians else None
    )
    return {
        "rows": rows,
        "batches": batches,
        "iters": iters,
        "row_s": row_s,
        "total": medians,
        "samples": samples,
        "choices": choices,
        "errors": errors,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= MANY_TARGET,
    }


# ---------------------------------------------------------------- report


def figure_table(
    results: dict[str, dict[str, Any]], key: str, target: float
) -> tuple[str, int, int]:
    columns = [*EXECUTORS, AUTO2] if key == "first6" else EXECUTORS
    header = ["workload", *columns, "best fixed", "auto / best", "auto chose", f"<= {target}x"]
    if key == "first6":
        header += ["2nd run / best", f"<= {WISDOM_TARGET}x"]
    else:
        header += ["check, % of a batch", f"<= {CHECK_TARGET:.0%}"]
    body, met, counted = [], 0, 0
    for name, res in results.items():
        times = res.get(key, {})
        best, _, ratio, ok = verdict(times, target)
        cells = []
        for e in columns:
            if e in times:
                cells.append(ms(times[e]))
            else:
                status = res["status"].get(e, "")
                cells.append("n/a" if status.startswith("n/a") or not status else "failed")
        if key == "warm":
            chose = res.get("warm_choice") or "?"
        else:
            picks = res.get("first6_choices") or []
            chose = ", ".join(sorted(set(picks))) or "?"
        if ok is not None:
            counted += 1
            met += ok
        body.append(
            [
                name,
                *cells,
                best or "?",
                f"{ratio:.2f}x" if ratio is not None else "?",
                chose,
                "?" if ok is None else "met" if ok else "MISSED",
                *extra_cells(res, key),
            ]
        )
    return table(body, header), met, counted


def extra_cells(res: dict[str, Any], key: str) -> list[str]:
    """The second run's ratio (first 6 calls), or the check's share of a batch (warm)."""
    if key == "first6":
        times = res.get(key, {})
        _, best_t = best_of(times)
        second = times.get(AUTO2)
        if best_t is None or second is None:
            return ["?", "?"]
        ratio = second / best_t
        return [f"{ratio:.2f}x", "met" if ratio <= WISDOM_TARGET else "MISSED"]
    batch, check = res.get("warm", {}).get(AUTO), res.get("check_s")
    if not check or not batch:
        return ["none", "met"]  # no pool of other interpreters was started: nothing checked
    share = check / batch
    return [f"{share:.1%}", "met" if share <= CHECK_TARGET else "MISSED"]


def report(
    results: dict[str, dict[str, Any]],
    skipped: dict[str, str],
    many_res: dict[str, Any] | None,
    facts: dict[str, Any],
    args: argparse.Namespace,
) -> str:
    lines = [
        f"## auto against the best fixed executor ({facts['condition']})",
        "",
        f"{facts['cores']} cores ({facts['cpu']}), torch {facts['torch']} "
        f"({facts['torch_threads']} intra-op threads), Python {facts['python']}, "
        f"prep {facts['prep']}, start method {facts['start_method']}; "
        + ", ".join(f"{k} {v}" for k, v in facts["libraries"].items())
        + f"; load average at start {facts['load_average']}",
        f"{args.rows} rows a batch, workers={args.workers}, {args.repeat} interleaved repeats "
        f"(warm), {args.first_repeat} (first 6 calls); milliseconds, medians",
        "",
        "### Workloads",
        "",
    ]
    body = []
    for name, res in results.items():
        bad = {e: v for e, v in res["verified"].items() if v != "equal"}
        body.append(
            [
                name,
                "samples" if res["samples"] else "tensor",
                ms(res["warm"].get("serial")),
                "all equal to serial"
                if not bad
                else "; ".join(f"{e}: {v}" for e, v in bad.items()),
                res["about"],
            ]
        )
    lines.append(table(body, ["workload", "batch", "serial ms", "verified", "about"]))
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{n} ({why})" for n, why in skipped.items())]
    text, warm_met, warm_n = figure_table(results, "warm", WARM_TARGET)
    lines += ["", "### Warm: one call of a warmed pool, ms", "", text]
    first_done = {n: r for n, r in results.items() if r.get("first6")}
    first_met = first_n = 0
    if first_done:
        text, first_met, first_n = figure_table(first_done, "first6", FIRST_TARGET)
        lines += [
            "",
            f"### First {FIRST_CALLS} calls of a fresh Pool, start-up and calibration "
            f"included, each in a fresh interpreter, ms",
            "",
            text,
        ]
    notes = []
    for name, res in results.items():
        for e, status in res["status"].items():
            if status != "ok":
                notes.append(f"- {name} / {e}: {status}")
        for e, err in res.get("first6_errors", {}).items():
            notes.append(f"- {name} / {e} (first 6 calls): {err}")
    if notes:
        lines += ["", "Not run or failed:", "", *notes]
    if many_res is not None:
        m = many_res
        tot = m["total"]
        lines += [
            "",
            f"### {m['batches']} batches of {m['rows']} rows, GIL-bound pure Python "
            f"({m['row_s'] * 1e3:.2f} ms a row, python_work iters={m['iters']}), "
            f"fresh pools in fresh interpreters",
            "",
            table(
                [
                    [
                        ms(tot.get("processes")),
                        ms(tot.get(AUTO)),
                        f"{m['ratio']:.2f}x" if m["ratio"] is not None else "?",
                        ", ".join(sorted(set(m["choices"]))) or "?",
                        "?" if m["met"] is None else "met" if m["met"] else "MISSED",
                    ]
                ],
                [
                    "processes total ms",
                    "auto total ms",
                    "auto / processes",
                    "auto chose",
                    f"<= {MANY_TARGET}x",
                ],
            ),
        ]
        for e, err in m["errors"].items():
            lines.append(f"- {e}: {err}")
    lines += ["", "### Targets", ""]
    rows = [[f"warm, auto within {WARM_TARGET}x of the best", f"{warm_met} of {warm_n}"]]
    if first_done:
        rows.append([f"first 6 calls, within {FIRST_TARGET}x", f"{first_met} of {first_n}"])
        seconds = [extra_cells(r, "first6")[1] for r in first_done.values()]
        rows.append(
            [
                f"a second interpreter's first 6 calls (wisdom), within {WISDOM_TARGET}x",
                f"{seconds.count('met')} of {len(seconds) - seconds.count('?')}",
            ]
        )
    checks = [extra_cells(r, "warm")[1] for r in results.values()]
    rows.append(
        [f"the check costs at most {CHECK_TARGET:.0%} of a batch", f"{checks.count('met')} of "
         f"{len(checks)}"]
    )  # fmt: skip
    if many_res is not None and many_res["met"] is not None:
        rows.append(
            [
                f"{many_res['batches']} batches, auto within {MANY_TARGET}x of processes",
                "met" if many_res["met"] else "MISSED",
            ]
        )
    lines.append(table(rows, ["target", "met"]))
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="rows a batch (default 256)")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved repeats (5)")
    parser.add_argument(
        "--first-repeat", type=int, default=None, help="repeats of the first 6 calls (--repeat)"
    )
    parser.add_argument("--workers", type=int, default=None, help="default: one per core")
    parser.add_argument("--workloads", default=None, help="a,b,c (default: prep's and libraries')")
    parser.add_argument(
        "--first6-workloads",
        default=None,
        help="workloads to time the first 6 calls of (default: all; --quick: text_re)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="calls before warm timing")
    parser.add_argument("--batches", type=int, default=None, help="the many-batch case (16)")
    parser.add_argument("--no-many", action="store_true", help="skip the 16-batch case")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1-2 repeats")
    parser.add_argument(
        "--load", action="store_true", help="beside a process of one-thread torch matmuls"
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "EXECUTOR"), help=argparse.SUPPRESS)
    parser.add_argument("--many", metavar="EXECUTOR", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=FIRST_CALLS, help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, default=20_000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    q = args.quick
    args.rows = args.rows or (16 if q else 256)
    args.repeat = args.repeat or (2 if q else 5)
    args.first_repeat = args.first_repeat or (1 if q else args.repeat)
    args.workers = args.workers or prep.info()["cores"]
    args.batches = args.batches or (4 if q else 16)
    return args


LOAD = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(512, 512)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.load and not (args.one or args.many):
        load = subprocess.Popen([sys.executable, "-c", LOAD])
        try:
            return measure(args)
        finally:
            load.kill()
            load.wait()
    return measure(args)


def measure(args: argparse.Namespace) -> int:
    if not args.one:
        os.environ["PREP_WISDOM"] = "off"  # the warm pools measure as a first run does
    if args.one:
        name, executor = args.one
        try:
            out = one(name, executor, args.rows, args.workers, args.calls)
        except Exception as exc:
            out = {"error": error_text(exc)}
        print(json.dumps(out), flush=True)
        return 0
    if args.many:
        try:
            out = many(args.many, args.rows, args.workers, args.batches, args.iters)
        except Exception as exc:
            out = {"error": error_text(exc)}
        print(json.dumps(out), flush=True)
        return 0

    names = (
        [n.strip() for n in args.workloads.split(",") if n.strip()]
        if args.workloads
        else [*PREP_DEFAULT, *LIBRARY_WORKLOADS]
    )
    for n in names:
        find_workload(n)  # unknown names exit here, before any timing
    _, skipped = available([n for n in names if n in LIBRARY_WORKLOADS])
    names = [n for n in names if n not in skipped]
    if args.first6_workloads:
        first6 = [n.strip() for n in args.first6_workloads.split(",") if n.strip()]
    else:
        first6 = ([n for n in names if n == "text_re"] or names[:1]) if args.quick else names

    facts = machine()
    facts["condition"] = "beside a training-like load" if args.load else "quiet"
    say(f"condition: {facts['condition']}")
    say(
        f"{facts['cores']} cores, torch {facts['torch']}, Python {facts['python']}; "
        f"{args.rows} rows, workers={args.workers}, repeat={args.repeat}, "
        f"first-6 repeat={args.first_repeat}"
    )
    results: dict[str, dict[str, Any]] = {}
    shared: dict[str, prep.Pool] = {}
    try:  # warm, every workload, with the fixed executors' pools shared between workloads
        for name in names:
            w = find_workload(name)
            t0 = time.perf_counter()
            res = warm(w, args.rows, args.workers, args.repeat, args.warmup, shared)
            res.update(about=w.about, samples=is_samples(w))
            results[name] = res
            say(
                f"warm {name}: serial {ms(res['warm'].get('serial'))} ms, auto "
                f"{ms(res['warm'].get(AUTO))} ms, chose {res.get('warm_choice')} "
                f"({time.perf_counter() - t0:.1f} s)"
            )
    finally:
        for pool in shared.values():
            pool.close()
        shared.clear()
        prep.shutdown()
    # then the first 6 calls, in fresh interpreters, with no pool of ours idling beside them
    for name in first6:
        if name not in results:
            continue
        t0 = time.perf_counter()
        ran = [e for e in EXECUTORS if results[name]["status"].get(e) == "ok"]
        res = first_calls(name, ran, args.rows, args.workers, args.first_repeat, args.timeout)
        results[name].update(res)
        say(
            f"first 6 {name}: serial {ms(res['first6'].get('serial'))} ms, auto "
            f"{ms(res['first6'].get(AUTO))} ms ({time.perf_counter() - t0:.1f} s)"
        )
    many_res = None
    if not args.no_many:
        many_res = many_case(
            256 if not args.quick else args.rows,
            args.workers,
            args.batches,
            args.first_repeat,
            args.timeout,
        )
        say(
            f"{args.batches} batches: processes {ms(many_res['total'].get('processes'))} ms, "
            f"auto {ms(many_res['total'].get(AUTO))} ms"
        )
    facts["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(report(results, skipped, many_res, facts, args))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": facts,
                    "args": {k: v for k, v in vars(args).items() if k not in ("one", "many")},
                    "workloads": results,
                    "skipped": skipped,
                    "many_batches": many_res,
                },
                indent=2,
                default=str,
            )
        )
    prep.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
