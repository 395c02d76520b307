"""prep where PyTorch users run code: ``python -c``, stdin, scripts, notebooks.

A row function defined in ``__main__`` (a notebook cell, ``python -c``, stdin, a
script), a lambda, a closure or a local def must reach the ``processes`` workers
(by value) and the workers must never import or re-run the user's main script.
A function that still cannot be loaded in a worker raises
``prep.errors.FunctionLoadError`` (a ``ConfigError``) naming it, on the first
batch: never ``WorkerCrashed``, never a hang.

Every program runs in a fresh interpreter of this venv, in its own session (so
whatever it leaves behind is cleaned up here), bounded by a timeout. The row
functions hold the GIL for a fixed wall time (:func:`gil_sleep`), so the
processes executor wins on two cores however fast the CPU is: ``auto`` is
checked to pick it there, and only the results are checked on one core.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import prep
from prep.executors import available_cores

from . import registry
from .conftest import wait_until

#: seconds a subprocess may take before it counts as a hang (they take a few seconds)
SUBPROCESS_TIMEOUT = 90


def gil_sleep(seconds: float) -> None:
    """Sleep ``seconds`` while holding the GIL (``PyDLL`` keeps it during the call).

    Work that no thread can overlap and that costs the same on a fast or a slow
    machine: worker processes divide it, threads do not.
    """
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def gil_bound_row(row: torch.Tensor) -> torch.Tensor:
    """10 ms holding the GIL, then pure Python (``.tolist()``: no vmap, no twin)."""
    gil_sleep(0.01)
    return torch.tensor([v * 2.0 + 1.0 for v in row.tolist()])


def auto_until_processes(fn, batch, want, most=8):
    """Batches through a warm ``auto`` pool, each checked against ``want``, until one
    has run after auto chose processes (at most ``most``); returns ``pool.explain()``.

    auto is told, as a wisdom entry an earlier run would have left, that processes
    are far ahead: which executor wins on this machine is the benchmark's business
    (scripts/bench_auto.py). What is tested here is that auto can start processes,
    check their rows against serial's and run them, with a function defined where
    this code runs (``__main__`` of ``-c``, stdin, a script, a notebook). The
    programs below define this same function from its source.
    """
    import os
    import tempfile

    from prep.auto import wisdom
    from prep.core.policy import RAISE
    from prep.core.rows import rows_of

    before = os.environ.get(wisdom.ENV)
    os.environ[wisdom.ENV] = os.path.join(tempfile.mkdtemp(), "wisdom.json")
    try:
        rows = rows_of(batch)
        key = wisdom.key(fn, rows.layout(), len(rows), 2, (False, repr(RAISE)))
        assert key is not None, f"{fn} has no wisdom key"
        figures = {"processes": 1e-4, "serial": 1.0, "threads": 1.0}
        wisdom.remember(key, {"choice": "processes", "rows": len(rows), "figures": figures})
        if available_cores() < 2:  # auto never runs processes on one core: results only
            most = min(most, 3)
        with prep.Pool("auto", workers=2) as pool:
            for i in range(most):
                chose = pool.explain().strip().splitlines()[-1].strip()
                got = pool.map_rows(fn, batch)
                assert torch.equal(got, want), f"auto pool, batch {i}, differs from serial"
                if chose == "choice: processes":
                    break
            return pool.explain()
    finally:
        if before is None:
            os.environ.pop(wisdom.ENV, None)
        else:
            os.environ[wisdom.ENV] = before


AUTO_UNTIL_PROCESSES_SOURCE = inspect.getsource(auto_until_processes)


# The same GIL-bound row function, as the programs below define it in their own
# ``__main__`` (it must not come from an importable module: that is the point).
GIL_BOUND_SOURCE = '''
def gil_bound(row):
    """10 ms holding the GIL, then pure Python: threads cannot overlap it, vmap cannot run it."""
    ctypes.PyDLL(None).usleep(10_000)
    return torch.tensor([v * 2.0 + 1.0 for v in row.tolist()])
'''

# Top-level code: a __main__ row function through every executor, then a warm auto
# pool over a few batches; prints a check line and auto's final choice.
#: gil_bound reads values (.tolist()) and has no twin: vmap and vectorized refuse it
EXECUTORS = registry.executors(registry.NO_TWIN, registry.READS_VALUES)
TOP_LEVEL_PROGRAM = (
    "import ctypes, torch, prep\n"
    f"EXECUTORS = {EXECUTORS!r}\n"
    "from prep.executors import available_cores\n"
    + GIL_BOUND_SOURCE
    + AUTO_UNTIL_PROCESSES_SOURCE
    + textwrap.dedent("""
    x = torch.arange(48.0).view(16, 3)
    want = torch.stack([gil_bound(row) for row in x])  # a loop's
    assert torch.equal(want, x * 2 + 1)
    checked = []
    for name in EXECUTORS:
        got = prep.map_rows(gil_bound, x, executor=name, workers=2)
        assert torch.equal(got, want), f"{name} differs from a loop"
        checked.append(name)
    with prep.Pool("processes", workers=2) as pool:
        for strategy in ("split", "whole"):
            outs = list(pool.imap(gil_bound, [x[:8], x[8:]], strategy=strategy))
            assert torch.equal(torch.cat(outs), want), f"imap {strategy} differs"
            checked.append(f"imap-{strategy}")
    explanation = auto_until_processes(gil_bound, x, want)
    checked.append("auto-pool")
    print(explanation)
    print("cores", available_cores())
    print("FINAL", explanation.strip().splitlines()[-1].strip())
    print("EQUAL TO A LOOP:", " ".join(checked))
    """)
)


# ------------------------------------------------------------------ helpers


def _group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


def _end_group(pgid: int, grace: float) -> None:
    """Give the session's leftovers (forkserver, workers) ``grace`` s to exit, then kill."""
    if not wait_until(lambda: not _group_alive(pgid), grace):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def run_python(
    args: list[str],
    *,
    cwd: os.PathLike | str,
    stdin: str | None = None,
    timeout: float = SUBPROCESS_TIMEOUT,
) -> subprocess.CompletedProcess:
    """This venv's python with ``args``, in a session of its own; a hang fails the test."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    start = time.monotonic()
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc.pid, 0)
        out, err = proc.communicate()
        pytest.fail(
            f"python {' '.join(args)[:60]!r} did not finish within {timeout} s (a hang)"
            f"\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
        )
    finally:
        _end_group(proc.pid, 5)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.seconds = time.monotonic() - start  # type: ignore[attr-defined]
    return done


def _report(done: subprocess.CompletedProcess) -> str:
    return (
        f"exit code {done.returncode}\n--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    )


def _check_top_level_run(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, _report(done)
    want = f"EQUAL TO A LOOP: {' '.join(EXECUTORS)} imap-split imap-whole auto-pool"
    assert want in done.stdout, _report(done)
    cores = int(done.stdout.split("cores ", 1)[1].split()[0])
    if cores >= 2:  # 10 ms of GIL a row: two worker processes halve it, threads cannot
        assert "FINAL choice: processes" in done.stdout, _report(done)


# ------------------------------------------------------------------ python -c and stdin


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["-c", "python -", "plain stdin"])
def test_top_level_function_from_command_line_or_stdin(tmp_path, how):
    """A row function defined at the top level of ``python -c`` or of a program read
    from stdin (``python -`` and plain ``python < code``) runs on every executor."""
    if how == "-c":
        done = run_python(["-c", TOP_LEVEL_PROGRAM], cwd=tmp_path)
    elif how == "python -":
        done = run_python(["-"], stdin=TOP_LEVEL_PROGRAM, cwd=tmp_path)
    else:
        done = run_python([], stdin=TOP_LEVEL_PROGRAM, cwd=tmp_path)
    _check_top_level_run(done)


# ------------------------------------------------------------------ scripts

UNGUARDED_SCRIPT = (
    "import ctypes, os, torch, prep\n"
    "from prep.executors import available_cores\n"
    "HERE = os.path.dirname(os.path.abspath(__file__))\n"
    "# top-level side effects: a worker that re-ran this script would repeat them\n"
    'print("TOP LEVEL RAN in pid", os.getpid(), flush=True)\n'
    'with open(os.path.join(HERE, "side_effects.txt"), "a") as f:\n'
    '    f.write(f"{os.getpid()}\\n")\n'
    + GIL_BOUND_SOURCE
    + AUTO_UNTIL_PROCESSES_SOURCE
    + textwrap.dedent("""
    x = torch.arange(48.0).view(16, 3)
    want = x * 2 + 1
    got = prep.map_rows(gil_bound, x, executor="processes", workers=2)
    assert torch.equal(got, want), "processes"
    explanation = auto_until_processes(gil_bound, x, want)
    print(explanation)
    print("cores", available_cores())
    print("FINAL", explanation.strip().splitlines()[-1].strip())
    print("RESULTS OK")
    """)
)


@pytest.mark.timeout(150)
def test_script_without_main_guard_is_never_rerun_by_workers(tmp_path):
    """A script with no ``if __name__ == "__main__":`` guard: its top level runs once,
    in the main process, however many workers start."""
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = run_python([str(script)], cwd=tmp_path)
    assert done.returncode == 0, _report(done)
    assert done.stdout.count("TOP LEVEL RAN") == 1, _report(done)
    lines = (folder / "side_effects.txt").read_text().splitlines()
    assert len(lines) == 1, f"the script's top level ran in pids {lines}\n{_report(done)}"
    assert "RESULTS OK" in done.stdout, _report(done)
    cores = int(done.stdout.split("cores ", 1)[1].split()[0])
    if cores >= 2:
        assert "FINAL choice: processes" in done.stdout, _report(done)


HELPER_MODULE = textwrap.dedent('''
    import ctypes

    import torch


    def helper_row(row):
        """A module-level row function, sent to the workers by name."""
        ctypes.PyDLL(None).usleep(10_000)
        return torch.tensor([v * 2.0 + 1.0 for v in row.tolist()])
''')

GUARDED_SCRIPT = textwrap.dedent("""
    import torch

    import prep
    from helper_rows import helper_row


    def main():
        x = torch.arange(48.0).view(16, 3)
        want = x * 2 + 1
        assert torch.equal(prep.map_rows(helper_row, x, executor="processes", workers=2), want)
        with prep.Pool("auto", workers=2) as pool:
            for i in range(4):
                assert torch.equal(pool.map_rows(helper_row, x), want), f"auto, batch {i}"
        print("RESULTS OK")


    if __name__ == "__main__":
        main()
""")


@pytest.mark.timeout(150)
def test_guarded_script_with_a_helper_module_next_to_it(tmp_path):
    """The by-name path: a function imported from a module beside the script (found
    through the script's folder on sys.path, not the working directory)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helper_rows.py").write_text(HELPER_MODULE)
    (folder / "guarded.py").write_text(GUARDED_SCRIPT)
    done = run_python([str(folder / "guarded.py")], cwd=tmp_path)
    assert done.returncode == 0, _report(done)
    assert "RESULTS OK" in done.stdout, _report(done)


# ------------------------------------------------------------------ functions sent by value

BY_VALUE_PROGRAM = textwrap.dedent("""
    import functools, os, traceback
    import torch, prep


    def scale(row, *, k, shift):  # a __main__ function, bound by a partial
        return row * k + shift


    def make_closure(t, k):
        def closure(row):  # captures a tensor and an int
            return row * k + t
        return closure


    def main():
        x = torch.arange(24.0).view(8, 3)
        t = torch.tensor([10.0, 20.0, 30.0])

        def local_def(row):
            return row.flip(0)

        me = os.getpid()
        cases = {
            "lambda": (lambda row: row * 3 - 1, x * 3 - 1),
            "closure": (make_closure(t, 4), x * 4 + t),
            "local-def": (local_def, x.flip(1)),
            "partial": (functools.partial(scale, k=5, shift=2.0), x * 5 + 2),
        }
        for name, (fn, want) in cases.items():
            try:
                got = prep.map_rows(fn, x, executor="processes", workers=2)
                assert torch.equal(got, want), f"wrong result {got.tolist()}"
                with prep.Pool("processes", workers=2) as pool:
                    for _ in range(2):  # a warm pool, the function sent once
                        assert torch.equal(pool.map_rows(fn, x), want), "wrong result (pool)"
            except Exception as exc:
                traceback.print_exc()
                print("FAILED", name, type(exc).__name__, str(exc).splitlines()[0][:200])
            else:
                print("OK", name)
        # the rows really ran in worker processes, not in this one
        pid_of = lambda row: torch.tensor([os.getpid()])
        pids = prep.map_rows(pid_of, x, executor="processes", workers=2)
        print("WORKER PIDS", sorted(set(pids.flatten().tolist())), "MAIN", me)
        assert me not in pids.flatten().tolist(), "rows ran in the main process"
        print("OK worker-pids")


    main()
""")


@pytest.mark.timeout(150)
def test_lambdas_closures_local_defs_and_partials_through_processes(tmp_path):
    done = run_python(["-c", BY_VALUE_PROGRAM], cwd=tmp_path)
    for case in ("lambda", "closure", "local-def", "partial", "worker-pids"):
        assert f"OK {case}\n" in done.stdout, f"case {case!r} failed\n{_report(done)}"
    assert done.returncode == 0, _report(done)


def _make_scaler(t: torch.Tensor, k: int):
    def scaler(row: torch.Tensor) -> torch.Tensor:
        return gil_bound_row(row) * k + t

    return scaler


@pytest.mark.timeout(120)
def test_lambda_and_closure_from_this_process_through_processes_and_auto(no_leaks):
    """In the test process itself: a lambda and a closure (of an importable module,
    but not reachable by name) go to the workers by value; ``auto`` considers
    processes for them and, on two cores, picks them for GIL-bound rows."""
    x = torch.arange(48.0).view(16, 3)
    t = torch.tensor([1.0, 2.0, 3.0])
    want = x * 2 + 1
    lam = lambda row: gil_bound_row(row) - 1  # noqa: E731
    closure = _make_scaler(t, 3)
    with prep.Pool("processes", workers=2) as pool:
        assert torch.equal(pool.map_rows(lam, x), want - 1)
        assert torch.equal(pool.map_rows(closure, x), want * 3 + t)
    explanation = auto_until_processes(lam, x, want - 1)
    if available_cores() >= 2:
        assert explanation.strip().splitlines()[-1].strip() == "choice: processes", explanation


# ------------------------------------------------------------------ a function workers cannot load

UNLOADABLE_PROGRAM = textwrap.dedent("""
    import importlib, os, shutil, sys, tempfile, time, traceback
    import torch, prep

    how = sys.argv[1]
    if how == "module-deleted":
        # a module the parent imported, then deleted and took off sys.path: sent by
        # name, it cannot be imported in a worker
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "vanishing_rows.py"), "w") as f:
            f.write("def vanishing_row_fn(row):\\n    return row + 1\\n")
        sys.path.insert(0, folder)
        fn = importlib.import_module("vanishing_rows").vanishing_row_fn
        sys.path.remove(folder)
        shutil.rmtree(folder)
        importlib.invalidate_caches()
    else:
        # a __main__ function whose captured default cannot be rebuilt in a worker
        class Unrebuildable:
            def __reduce__(self):
                return (int, ("this object cannot be rebuilt",))

        def vanishing_row_fn(row, _guard=Unrebuildable()):
            return row + 1

        fn = vanishing_row_fn

    x = torch.arange(8.0).view(8, 1)
    assert torch.equal(prep.map_rows(fn, x, executor="serial"), x + 1)
    start = time.monotonic()
    try:
        prep.map_rows(fn, x, executor="processes", workers=2)
    except Exception as exc:
        took = time.monotonic() - start
        traceback.print_exc()
        public = getattr(prep.errors, "FunctionLoadError", None)
        print("RAISED", type(exc).__name__, flush=True)
        print("IS FunctionLoadError", public is not None and isinstance(exc, public))
        print("IS ConfigError", isinstance(exc, prep.ConfigError))
        print("MESSAGE", " ".join(str(exc).split()))
        print("SECONDS", round(took, 2))
    else:
        print("NO ERROR")
        sys.exit(2)
    # the pool is still usable afterwards, with a function the workers can load
    ok = prep.map_rows(torch.neg, x, executor="processes", workers=2)
    assert torch.equal(ok, -x)
    print("POOL STILL WORKS")
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["module-deleted", "unrebuildable-default"])
def test_a_function_workers_cannot_load_raises_function_load_error(tmp_path, how):
    done = run_python(["-c", UNLOADABLE_PROGRAM, how], cwd=tmp_path, timeout=60)
    report = _report(done)
    assert "NO ERROR" not in done.stdout, report
    assert "WorkerCrashed" not in done.stderr + done.stdout, report
    assert "FunctionLoadError" in done.stderr, report
    assert "IS FunctionLoadError True" in done.stdout, report
    assert "IS ConfigError True" in done.stdout, report
    message = done.stdout.split("MESSAGE ", 1)[1].splitlines()[0]
    assert "vanishing_row_fn" in message, f"the error does not name the function\n{report}"
    # (never a hang: run_python's timeout fails the test; no wall-clock bound of its own)
    assert "POOL STILL WORKS" in done.stdout, report
    assert done.returncode == 0, report


def test_function_load_error_is_a_public_config_error():
    from prep.errors import FunctionLoadError

    assert issubclass(FunctionLoadError, prep.ConfigError)
    assert issubclass(FunctionLoadError, prep.PrepError)


# ------------------------------------------------------------------ a Jupyter kernel

NOTEBOOK_CELLS = [
    """
    import ctypes, os, sys
    import torch, prep
    from prep.executors import available_cores
    assert sys.executable == {executable!r}, sys.executable
    assert sys.prefix == {prefix!r}, sys.prefix
    print(sys.executable, torch.__version__, prep.__file__, "cores", available_cores())
    """,
    """
    def gil_bound(row):
        # 20 ms holding the GIL (PyDLL keeps it): the same on a fast or a slow machine
        ctypes.PyDLL(None).usleep(20_000)
        return torch.tensor([v * 2.0 + 1.0 for v in row.tolist()])

    assert gil_bound.__module__ == "__main__"
    x = torch.arange(96.0).view(32, 3)
    want = prep.map_rows(gil_bound, x, executor="serial")
    assert torch.equal(want, x * 2 + 1)
    """,
    """
    got = prep.map_rows(gil_bound, x, executor="processes", workers=2)
    assert torch.equal(got, want), "processes differs from serial"
    """,
    """
    got = prep.map_rows(gil_bound, x, executor="joblib", workers=2)
    assert torch.equal(got, want), "joblib differs from serial"
    """,
    """
    k = 3
    got = prep.map_rows(lambda row: row * k, x, executor="processes", workers=2)
    assert torch.equal(got, x * 3), "a lambda of a cell, through processes"
    """,
    """
    with prep.Pool("processes", workers=2) as pool:  # a stream, both ways of processes
        for strategy in ("split", "whole"):
            outs = list(pool.imap(gil_bound, [x[:8], x[8:16]], strategy=strategy))
            assert torch.equal(torch.cat(outs), want[:16]), f"imap {strategy} differs"
    """,
    """
    class Squares:  # a map-style dataset of the notebook's own (``__main__``)
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.full((3,), float(i * i))

    def plus_one(sample):
        return sample + 1

    ds = Squares()
    expected = [torch.stack([plus_one(ds[i]) for i in range(s, min(s + 4, 10))]) for s in (0, 4, 8)]
    loader = prep.Loader(ds, plus_one, batch_size=4, executor="processes", workers=2)
    got = list(loader)
    assert len(got) == 3 and all(torch.equal(g, w) for g, w in zip(got, expected)), got
    epoch = iter(loader)  # mid-epoch: its state resumes after the batch the loop saw
    assert torch.equal(next(epoch), expected[0])
    state = loader.state_dict()
    epoch.close()
    again = prep.Loader(ds, plus_one, batch_size=4, executor="processes", workers=2)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 2 and all(torch.equal(g, w) for g, w in zip(rest, expected[1:])), rest
    print("LOADER OK")
    """,
    AUTO_UNTIL_PROCESSES_SOURCE,
    """
    explanation = auto_until_processes(gil_bound, x, want)
    print(explanation)
    if available_cores() >= 2:  # 20 ms of GIL a row: two worker processes halve it
        final = explanation.strip().splitlines()[-1].strip()
        assert final == "choice: processes", explanation
    print("NOTEBOOK OK")
    """,
    """
    prep.shutdown()  # close the warm pools before the kernel is shut down
    """,
]


@pytest.mark.timeout(240)
def test_jupyter_kernel_runs_cell_functions_on_processes_joblib_and_auto(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    # a "python3" kernelspec that runs this very interpreter, found first on JUPYTER_PATH
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "prep test venv",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    temp = tmp_path / "tmp"  # the kernel's temporary files: none may be left behind
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    work = tmp_path / "notebook"
    work.mkdir()

    fill = {"executable": sys.executable, "prefix": sys.prefix}
    nb = nbformat.v4.new_notebook()
    sources = [textwrap.dedent(c).strip() for c in NOTEBOOK_CELLS]
    sources[0] = sources[0].format(**fill)  # only the first cell is a template
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    client = NotebookClient(
        nb,
        timeout=120,
        startup_timeout=60,
        kernel_name="python3",
        resources={"metadata": {"path": str(work)}},
    )
    failure = None
    try:
        client.execute()
    except (CellExecutionError, DeadKernelError) as exc:
        failure = f"a notebook cell failed in the kernel:\n{_plain(str(exc))}"
    text = _outputs(nb)
    if failure:  # outside the except: the kernel's traceback once, not twice
        pytest.fail(f"{failure}\n\n{text}")
    assert "NOTEBOOK OK" in text and "LOADER OK" in text, text
    # prep.shutdown() in the last cell removed the Loaders' dataset files
    assert not list(temp.glob("prep-loader-*")), sorted(p.name for p in temp.iterdir())


def _outputs(nb) -> str:
    """Every cell's source and printed output, for a failure message."""
    parts = []
    for i, cell in enumerate(nb.cells):
        parts.append(f"--- cell {i} ---\n{cell.source}")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(f"[{out.get('name')}] {out.get('text', '')}")
            elif out.get("output_type") == "error":
                parts.append(f"[error] {out.get('ename')}: {out.get('evalue')}")
    return _plain("\n".join(parts))


def _plain(text: str) -> str:
    """Text without the terminal colours IPython puts in tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
