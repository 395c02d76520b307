"""Faults become clear, fast errors: never a hang, an orphan or a leaked segment.

One table of cases, each bounded by a timeout, like loky's crash tests; the
``no_leaks`` fixture checks processes and /dev/shm after every one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import prep
from prep.executors import _base as executors_base
from prep.executors import _transport as transport_module
from tests import registry, rowfns
from tests.conftest import wait_until
from tests.registry import CRASH, HANG, NO_TWIN, PROCESSES, READS_VALUES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, row function, what it needs (tests/registry.py), expected error, the pattern any
# executor's message must match, {executor: a stricter pattern}, timeout=). Each case
# runs on every executor the registry gives for its needs, a new one included; each
# is bounded by pytest's timeout (a hang fails it), never by a wall-clock figure
FAULTS = [
    ("sigkill", rowfns.suicide, (CRASH, READS_VALUES), prep.WorkerCrashed, r"SIGKILL",
     {"processes": r"pid \d+ died with signal SIGKILL while it worked on rows 0-3 of a batch",
      "joblib": r"died while rows .*SIGKILL"}, None),
    ("segfault", rowfns.segfault, (CRASH, READS_VALUES), prep.WorkerCrashed, r"SIGSEGV",
     {"processes": r"pid \d+ died with signal SIGSEGV"}, None),
    ("hang", rowfns.hang, (HANG, READS_VALUES), prep.BatchTimeout, r"timeout=2 s",
     {"processes": r"rows 0-3 of a batch .*timeout=2 s.*worker \(pid \d+\)",
      "threads": r"timeout=2 s.*abandoned"}, 2),
    ("fail_on_5", rowfns.fail_on_5, (READS_VALUES,), prep.RowError,
     r"row 5: ValueError: cannot handle 5", {}, None),
    ("not_a_tensor", rowfns.not_a_tensor, (READS_VALUES,), TypeError,
     r"on row 0, returned a list", {}, None),
    ("unpicklable", functools.partial(rowfns.with_lock, lock=threading.Lock()), (PROCESSES,),
     prep.ConfigError, r"rowfns\.with_lock.*cannot be pickled.*must be picklable.*'threads'",
     {}, None),
]  # fmt: skip

CASES = [
    pytest.param(fn, executor, error, specific.get(executor, match), timeout,
                 id=f"{name}-{executor}")
    for name, fn, needs, error, match, specific, timeout in FAULTS
    for executor in registry.executors(NO_TWIN, *needs)
]  # fmt: skip


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("fn", "executor", "error", "match", "timeout"), CASES)
def test_fault(no_leaks, fn, executor, error, match, timeout):
    x = torch.arange(8.0).view(8, 1)
    if executor == "joblib":  # loky's workers are shared: start them without a deadline
        prep.map_rows(rowfns.affine, x, executor="joblib", workers=2)
    with prep.Pool(executor, workers=2, timeout=timeout) as pool:
        pool.map_rows(rowfns.affine, x)  # warm: the pool is up before the fault
        with pytest.raises(error, match=match) as info:
            pool.map_rows(fn, x)
        if isinstance(info.value, prep.RowError) and executor in registry.executors(PROCESSES):
            assert "Traceback" in str(info.value.__cause__.__cause__)  # the worker's
        # and the same pool works afterwards (rebuilt if it had to be)
        assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)


_AUTO = """
import sys, torch
sys.path.insert(0, {root!r})
import prep
from tests import rowfns
if __name__ == "__main__":
    x = torch.arange(8.0).view(8, 1)
    with prep.Pool("auto", workers=2, timeout={timeout}) as pool:
        pool.map_rows(rowfns.affine, x)
        try:
            got = pool.map_rows(rowfns.{fn}, x)
        except Exception as exc:
            print(type(exc).__name__, exc, flush=True)
        else:
            print("result", got.flatten().tolist(), flush=True)
"""


def _auto(fn: str, timeout: float | None) -> subprocess.CompletedProcess[str]:
    """auto on ``fn`` in a child of its own (a crash there must not end the tests)."""
    code = _AUTO.format(root=ROOT, fn=fn, timeout=timeout)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=40)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fn", "signal_"), [("suicide", signal.SIGKILL), ("segfault", signal.SIGSEGV)]
)
def test_auto_with_a_row_that_kills_its_process_ends_as_the_executor_it_runs(fn, signal_):
    """auto measures its first rows in the caller's process (tests/registry.py, CRASH):
    a row that kills its process ends the caller, as a loop's would, or, where auto
    runs it on worker processes, is a WorkerCrashed. Never a result, never a hang."""
    done = _auto(fn, None)
    if done.returncode == 0:
        assert done.stdout.startswith("WorkerCrashed") and signal_.name in done.stdout, done
    else:
        assert done.returncode == -signal_, done


def _script(body: str) -> list[str]:
    code = textwrap.dedent(f"""
        import os, sys, time, torch
        sys.path.insert(0, {ROOT!r})
        import prep
        from tests import rowfns
        if __name__ == "__main__":
            pool = prep.Pool("processes", workers=2)
            pool.map_rows(rowfns.affine, torch.ones(4, 1))
            print(" ".join(map(str, pool._get("processes").engine.pids)), flush=True)
    """) + textwrap.indent(textwrap.dedent(body), "    ")
    return [sys.executable, "-c", code]


def _gone(pids: list[int]) -> bool:
    def dead(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    return all(dead(p) for p in pids)


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_at_once_and_leaves_no_orphans(tmp_path):
    mark = tmp_path / "started"
    proc = subprocess.Popen(
        _script(f"""
        import functools
        row = functools.partial(rowfns.marks_then_sleeps, path={str(mark)!r}, seconds=0.05)
        try:
            pool.map_rows(row, torch.ones(1000, 1))  # 25 s of rows on two workers
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    assert wait_until(mark.exists, 30), "the batch never started"  # in the middle of it
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends: the whole group
    # well before the batch's 25 s: the interrupt did not wait for the rows
    out, _ = proc.communicate(timeout=10)
    assert "interrupted" in out and proc.returncode == 3
    assert wait_until(lambda: _gone(pids), 5), "workers outlived an interrupted parent"


@pytest.mark.timeout(60)
def test_workers_exit_when_the_parent_is_killed(tmp_path):
    mark = tmp_path / "started"
    proc = subprocess.Popen(
        _script(f"""
        import functools
        row = functools.partial(rowfns.marks_then_sleeps, path={str(mark)!r}, seconds=3600)
        pool.map_rows(row, torch.ones(4, 1))
    """),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert wait_until(mark.exists, 30), "the batch never started"
    proc.kill()
    proc.wait(5)
    assert wait_until(lambda: _gone(pids), 10), "workers outlived a killed parent"
    os.killpg(proc.pid, signal.SIGKILL) if not _gone(pids) else None


# the thread settings differ from serial's on purpose: the workers' are capped
@pytest.mark.filterwarnings("ignore:executor=.* computed row 0 of thread_settings")
@pytest.mark.parametrize("executor", registry.executors(PROCESSES, NO_TWIN))
@pytest.mark.parametrize("workers", [1, 2])
def test_each_worker_process_runs_torch_on_one_thread(no_leaks, executor, workers, monkeypatch):
    """One intra-op thread per worker process, whatever the worker count and the cores
    (8 here, told to prep: cores // workers would give 8 and 4), as a DataLoader's
    workers have: the caller runs torch beside them (issue 48, item 5)."""
    monkeypatch.setattr(executors_base, "available_cores", lambda: 8)
    with prep.Pool(executor, workers=workers) as pool:
        got = pool.map_rows(rowfns.thread_settings, torch.ones(4, 1))
        streamed = list(pool.imap(rowfns.thread_settings, [torch.ones(4, 1)] * 2))
    assert all(s[:, :2].eq(1).all() for s in streamed)  # a stream's batches, the same
    assert prep.info(workers=workers)["threads_per_process"] == 1
    assert got[:, 0].tolist() == [1] * 4  # torch intra-op threads in each worker
    assert got[:, 1].tolist() == [1] * 4  # OMP_NUM_THREADS for libraries loaded later


def test_shm_preflight(monkeypatch):
    monkeypatch.setattr(transport_module, "shm_free", lambda: 1 << 20)
    x = torch.ones(1024, 1024)  # 4 MiB, more than the "free" 1 MiB
    with pytest.raises(prep.ConfigError, match=r"needs 4\.0 MiB .* has 1\.0 MiB free.*'threads'"):
        prep.map_rows(rowfns.affine, x, executor="processes", workers=2)


def test_tensors_without_data_never_reach_workers():
    # a meta tensor stood in for CUDA here; it is now refused before any executor (see
    # tests/test_bad_inputs.py), and CUDA's own refusal is tested in tests/test_cuda.py
    meta = torch.empty(4, 2, device="meta")
    with pytest.raises(prep.ConfigError, match=r"batch column 0 is on the meta device"):
        prep.map_rows(rowfns.affine, meta, executor="processes", workers=2)


def test_fork_after_cuda_is_refused(monkeypatch):
    from prep.executors import _spawn

    monkeypatch.setenv("PREP_START_METHOD", "fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(prep.ConfigError, match=r"'fork' after CUDA.*'forkserver'"):
        _spawn.context()


def test_an_unknown_start_method_is_refused(monkeypatch):
    from prep.executors import _spawn

    monkeypatch.setenv("PREP_START_METHOD", "spawn")
    with pytest.raises(prep.ConfigError, match=r"PREP_START_METHOD='spawn' is not one of"):
        _spawn.context()


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i))


def _collate_with_processes(batch: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = prep.map_samples(rowfns.affine, batch, executor="processes", workers=2)
    return out, torch.tensor(sum("cannot start a process pool" in str(w.message) for w in caught))


@pytest.mark.timeout(90)
def test_processes_inside_a_dataloader_worker_fall_back_to_threads(no_leaks):
    loader = torch.utils.data.DataLoader(
        _Rows(),
        batch_size=2,
        num_workers=1,
        collate_fn=_collate_with_processes,
        multiprocessing_context="forkserver",
    )
    batches = list(loader)
    assert [b[0].tolist() for b in batches] == [[[1.0] * 3, [3.0] * 3], [[5.0] * 3, [7.0] * 3]]
    assert [int(b[1]) for b in batches] == [1, 0]  # warned once in that worker, then quiet


def test_threads_run_torch_on_their_share_of_the_cores_and_leave_the_callers_alone():
    before = torch.get_num_threads()
    got = prep.map_rows(rowfns.thread_settings, torch.ones(6, 1), executor="threads", workers=2)
    assert got[:, 0].tolist() == [min(before, prep.info(workers=2)["threads_per_worker"])] * 6
    assert torch.get_num_threads() == before


def test_a_worker_that_died_while_idle_is_replaced(no_leaks):
    x = torch.arange(8.0).view(8, 1)
    with prep.Pool("processes", workers=2) as pool:
        pool.map_rows(rowfns.affine, x)
        worker = pool._get("processes").engine._lanes.all[0].worker
        os.kill(worker.proc.pid, signal.SIGKILL)
        # the parent learns of the death from the forkserver a moment after the kill
        assert wait_until(lambda: not worker.proc.is_alive(), 10)
        assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)


def test_a_function_workers_cannot_load_does_not_poison_the_pool(no_leaks, tmp_path):
    import importlib
    import sys

    (tmp_path / "gone_soon.py").write_text("def f(row):\n    return row\n")
    sys.path.insert(0, str(tmp_path))
    try:
        fn = importlib.import_module("gone_soon").f
        (tmp_path / "gone_soon.py").unlink()  # the workers cannot import it any more
        x = torch.arange(8.0).view(8, 1)
        with prep.Pool("processes", workers=2) as pool:
            with pytest.raises(
                prep.errors.FunctionLoadError,
                match=r"could not load the row function gone_soon\.f .*No module named "
                r"'gone_soon'.*importable",
            ) as info:
                pool.map_rows(fn, x)
            cause = info.value.__cause__  # the worker's own error, its traceback as its cause
            assert isinstance(cause, ModuleNotFoundError)
            assert "Traceback" in str(cause.__cause__)
            assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)
            assert torch.equal(pool.map_rows(lambda r: r - 1, x), x - 1)  # sent by value
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gone_soon", None)


@pytest.mark.timeout(60)
def test_closing_a_process_pool_while_another_thread_runs_a_batch(no_leaks, tmp_path):
    pool = prep.Pool("processes", workers=2)
    x = torch.arange(8.0).view(8, 1)
    pool.map_rows(rowfns.affine, x)
    failed: list[BaseException] = []
    mark = tmp_path / "started"
    row = functools.partial(rowfns.marks_then_sleeps, path=str(mark), seconds=3600)

    def stuck() -> None:
        try:
            pool.map_rows(row, x)  # its rows never return; no timeout
        except BaseException as exc:  # the batch fails once its workers are gone
            failed.append(exc)

    t = threading.Thread(target=stuck, daemon=True)
    t.start()
    assert wait_until(mark.exists, 30), "the batch never started"
    pool.close()  # must not wait for the stuck batch (it never ends), nor write into its pipes
    t.join(10)
    assert not t.is_alive() and failed, failed


@pytest.mark.timeout(120)
def test_a_joblib_pool_timing_out_leaves_the_users_own_joblib_running(no_leaks):
    """prep's joblib executor kills its workers on a timeout; they must be its own, not
    loky's one executor per interpreter that the user's ``joblib.Parallel`` runs on."""
    import joblib
    from joblib.externals.loky import get_reusable_executor

    stop, failures, rounds = threading.Event(), [], [0]

    def users_joblib() -> None:
        while not stop.is_set():
            try:
                got = joblib.Parallel(n_jobs=2)(joblib.delayed(rowfns.nap)(i) for i in range(20))
            except BaseException as exc:
                failures.append(exc)
                return
            assert got == list(range(20))
            rounds[0] += 1

    user = threading.Thread(target=users_joblib, daemon=True)
    user.start()
    try:
        assert wait_until(lambda: rounds[0] > 0, timeout=60), "the user's joblib never ran"
        x = torch.arange(8.0).view(8, 1)
        with prep.Pool("joblib", workers=2, timeout=1) as pool:
            with pytest.raises(prep.BatchTimeout):
                pool.map_rows(rowfns.hang, x)
            assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)  # new workers
        seen = rounds[0]
        assert wait_until(lambda: rounds[0] >= seen + 2 or failures, timeout=30)
    finally:
        stop.set()
        user.join(30)
        get_reusable_executor().shutdown(wait=True)  # the user's, ended by the user
    assert not failures, f"the user's joblib.Parallel failed: {failures[0]!r}"


def test_a_stopped_worker_leaves_no_shared_memory_name_behind(tmp_path):
    # torch names a segment and unlinks the name at once: a worker killed in between
    # would leave it in /dev/shm for good. The test leaves one in the worker's name
    from prep.executors import _handles, _spawn

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    w = _handles.Worker(_spawn.context(), 1)
    left = f"/dev/shm/torch_{w.proc.pid}_0_0"
    try:
        open(left, "wb").close()
        w.proc.kill()
        w.stop()
        assert not os.path.exists(left)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(left)
    # another process's names are not touched (a pid that is a prefix of it)
    (tmp_path / "torch_120_1_2").touch()
    (tmp_path / "torch_12_1_2").touch()
    assert _handles.unlink_leftovers(12, shm=str(tmp_path)) == ["torch_12_1_2"]
    assert (tmp_path / "torch_120_1_2").exists()
