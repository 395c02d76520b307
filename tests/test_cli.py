"""The ``prep`` command line, in-process (``main(argv)``) and as ``python -m prep``."""

from __future__ import annotations

import io
import json
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import prep
from prep.cli import COMMANDS, main, parse_value
from prep.ops import side_context
from prep.run import ShardProgress
from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest

from .conftest import wait_until
from .test_shards import Evil

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIDE = ["--fn", "prep.ops:side_context_row", "--arg", "max_len=5"]
# 0.05 s a row (tests.rowfns.slow), 6 rows a shard: slow enough to be interrupted mid-run
SLOW = ["--fn", "tests.rowfns:slow", "--columns", "x", "--executor", "serial"]


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def make(folder: pathlib.Path, shards: int = 3, rows: int = 24, fmt: str = "pt") -> pathlib.Path:
    assert cli("make-shards", "--out", folder, "--shards", shards, "--rows", rows,
               "--seq", 12, "--dim", 3, "--format", fmt, "--quiet") == 0  # fmt: skip
    return folder


def outputs(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the manifest, by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.jsonl"
    }


def alive(pid: int) -> bool:
    """Running (a zombie is not: PID 1 of a container may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def temps_in(folder: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name]


class Child:
    """``python -m prep ...`` with its stderr lines collected by a thread."""

    def __init__(self, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prep", *map(str, args)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, n: int, timeout: float = 60) -> bool:
        """Wait until ``n`` shards are reported done; False if the run ended first."""
        end = time.monotonic() + timeout
        while sum("] " in x and "FAILED" not in x for x in self.seen) < n:
            line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            if line is None:
                return False
            self.seen.append(line)
        return True

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.seen)


# ------------------------------------------------------------------ prep run


def test_run_side_context_out_of_the_box(tmp_path, capsys):
    data = make(tmp_path / "data")
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *SIDE, "--arg", "side=right") == 0
    err = capsys.readouterr().err
    assert "[3/3] shard-0000" in err and "pt: 24 rows in" in err
    assert "3 done, 0 skipped, 0 failed" in err
    for path in sorted(data.glob("*.pt")):
        t = S.load_shard(path)
        want = side_context(t["x"], t["mask"], side="right", max_len=5, lengths=t["length"])
        got = S.load_shard(out / path.name)
        assert list(got) == ["out"] and torch.equal(got["out"], want)
    entries = Manifest(out).entries()
    assert sorted(entries) == ["shard-00000.pt", "shard-00001.pt", "shard-00002.pt"]
    e = entries["shard-00001.pt"]
    assert e["fn"] == "prep.ops:side_context_row" and e["args"] == {"max_len": 5, "side": "right"}
    assert e["output_sha256"] == W.sha256_file(out / "shard-00001.pt")
    assert e["rows"] == 24 and e["torch"] == torch.__version__ and e["prep"] == prep.__version__
    assert e["input_size"] == (data / "shard-00001.pt").stat().st_size


def test_executors_jobs_and_formats_agree_byte_for_byte(tmp_path, no_leaks):
    data = make(tmp_path / "data", shards=4)
    assert cli("run", data, "--out", tmp_path / "a", *SIDE, "--quiet") == 0
    assert cli("run", data, "--out", tmp_path / "b", *SIDE, "--quiet", "--jobs", 3,
               "--executor", "processes", "--workers", 2) == 0  # fmt: skip
    assert outputs(tmp_path / "a") == outputs(tmp_path / "b")
    assert cli("run", data, "--out", tmp_path / "c", *SIDE, "--format", "safetensors",
               "--quiet") == 0  # fmt: skip
    c = tmp_path / "c"
    assert sorted(outputs(c)) == [f"shard-0000{i}.safetensors" for i in range(4)]
    a = S.load_shard(tmp_path / "a" / "shard-00003.pt")["out"]
    assert torch.equal(S.load_shard(c / "shard-00003.safetensors")["out"], a)


def test_columns_are_positional_in_the_given_order(tmp_path):
    src = tmp_path / "in"
    W.save_shard({"a": torch.ones(4, 2), "b": torch.arange(8.0).view(4, 2)}, src / "s.pt", "pt")
    assert cli("run", src, "--out", tmp_path / "o", "--fn", "tests.rowfns:pair",
               "--columns", "b,a", "--quiet") == 0  # fmt: skip
    got = S.load_shard(tmp_path / "o" / "s.pt")
    assert list(got) == ["out0", "out1"]
    assert torch.equal(got["out1"], torch.arange(8.0).view(4, 2).sum(1))  # pair(a=b, ...)


def test_resume_skips_only_what_is_proven_done(tmp_path, capsys):
    data = make(tmp_path / "data", shards=3)
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *SIDE, "--quiet") == 0
    clean = outputs(out)
    # without --resume a used folder is refused
    assert cli("run", data, "--out", out, *SIDE) == 2
    assert "pass --resume to finish that run, or choose a new --out" in capsys.readouterr().err
    # a damaged output and a stale temp file: only that shard is redone
    (out / "shard-00001.pt").write_bytes(b"garbage")
    (out / ".shard-00002.pt.tmp-99999999-0badc0de").write_bytes(b"half")  # no such PID
    assert cli("run", data, "--out", out, *SIDE, "--resume") == 0
    err = capsys.readouterr().err
    assert "2 shard(s) already done per the manifest, skipped; 1 stale temporary" in err
    assert "1 done, 2 skipped" in err
    assert outputs(out) == clean
    # other arguments: everything is redone, and the manifest says so
    assert cli("run", data, "--out", out, *SIDE, "--arg", "side=right", "--resume") == 0
    assert "3 done, 0 skipped" in capsys.readouterr().err
    assert all(e["args"]["side"] == "right" for e in Manifest(out).entries().values())


@pytest.mark.timeout(60)
def test_bad_shards_skip_or_stop(tmp_path, capsys):
    data = make(tmp_path / "data", shards=4)
    marker = tmp_path / "pwned"
    torch.save({"x": torch.ones(24, 12, 3), "payload": Evil(marker)}, data / "shard-00001.pt")
    cut = data / "shard-00002.pt"
    cut.write_bytes(cut.read_bytes()[:100])
    out = tmp_path / "skip"
    assert cli("run", data, "--out", out, *SIDE, "--on-error", "skip") == 1
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "2 done, 0 skipped, 2 failed" in err
    assert "shard-00001.pt FAILED: " in err and "--trust-pickle" in err
    assert "shard-00002.pt FAILED: " in err and "truncated" in err
    assert "Traceback" not in err  # prep's verdict on a file says it all; the rest:
    failures = Manifest(out).failures()
    assert sorted(failures) == ["shard-00001.pt", "shard-00002.pt"]
    assert "Traceback" in failures["shard-00002.pt"]["traceback"]
    assert sorted(outputs(out)) == ["shard-00000.pt", "shard-00003.pt"]
    assert sorted(Manifest(out).entries()) == ["shard-00000.pt", "shard-00003.pt"]
    # stop (the default): shards in flight finish, no new one starts
    assert cli("run", data, "--out", tmp_path / "stop", *SIDE, "--jobs", 1) == 1
    err = capsys.readouterr().err
    assert "1 done, 0 skipped, 1 failed, 2 not finished" in err
    assert "shard-00001.pt FAILED" in err and "2 shard(s) not started" in err
    assert not marker.exists()


def test_missing_column_names_file_and_column(tmp_path, capsys):
    data = make(tmp_path / "data", shards=1)
    assert cli("run", data, "--out", tmp_path / "o", "--fn", "tests.rowfns:pair",
               "--columns", "x,nope") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "shard-00000.pt: has no column 'nope'; it has 'x', 'mask', 'length'" in err
    assert "Traceback" not in err  # prep's own verdict on the file says it all


def test_a_failed_shard_shows_its_traceback(tmp_path, capsys, monkeypatch):
    def broken_save(*args, **kwargs):
        raise RuntimeError("a bug inside prep")

    monkeypatch.setattr("prep.run.task.save_shard", broken_save)
    data = make(tmp_path / "data", shards=2)
    assert cli("run", data, "--out", tmp_path / "o", *SIDE, "--quiet", "--on-error", "skip") == 1
    err = capsys.readouterr().err
    assert "prep run: shard-00000.pt failed with (prep's own frames left out):" in err
    for name in ("shard-00000.pt", "shard-00001.pt"):
        assert f"\n  {name}: RuntimeError: a bug inside prep\n" in err  # the one-line list
    assert err.count("Traceback (most recent call last)") == 1  # the first failure's only
    assert "in broken_save" in err and "in run_shard" not in err
    # the whole of each, prep's frames included, is in the manifest
    failures = Manifest(tmp_path / "o").failures()
    assert all("in run_shard" in f["traceback"] for f in failures.values())
    assert len(failures) == 2
    # and for code, in the summary
    config = prep.run.RunConfig("prep.ops:side_context_row", {"max_len": 5})
    summary = prep.run.run_shards([data], tmp_path / "o2", config, on_error="skip")
    assert sorted(summary.tracebacks) == ["shard-00000.pt", "shard-00001.pt"]
    assert "in broken_save" in summary.tracebacks["shard-00000.pt"]


def test_a_row_function_error_shows_the_function_line(tmp_path, capsys):
    data = tmp_path / "data"
    W.save_shard({"x": torch.arange(8.0)}, data / "a.pt", "pt")
    args = ["--fn", "tests.rowfns:fail_on_5", "--columns", "x", "--executor", "serial"]
    assert cli("run", data, "--out", tmp_path / "o", *args, "--quiet") == 1
    err = capsys.readouterr().err
    assert "in fail_on_5" in err and "ValueError: cannot handle" in err


def test_unwritable_outputs(tmp_path, capsys):
    # Tests run as root, and chmod does not stop root from writing, so make writing
    # fail another way: a regular file where the output folder (or a subfolder) must be.
    data = make(tmp_path / "data", shards=2)
    (data / "sub").mkdir()
    W.save_shard(S.load_shard(data / "shard-00000.pt"), data / "sub" / "c.pt", "pt")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli("run", data, "--out", blocker, *SIDE) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert cli("run", data, "--out", blocker / "below", *SIDE) == 2
    assert "cannot be created" in capsys.readouterr().err
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("in the way")
    assert cli("run", data, "--out", out, *SIDE, "--on-error", "skip") == 1
    err = capsys.readouterr().err
    assert "sub/c.pt FAILED: FileExistsError" in err or "sub/c.pt FAILED: NotADirectoryError" in err
    assert sorted(Manifest(out).entries()) == ["shard-00000.pt", "shard-00001.pt"]
    assert temps_in(out) == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--fn", "nope_module_xyz:f"], "cannot import module 'nope_module_xyz'"),
        (["--fn", "prep.ops:side_context_row", "--arg", "max_len"], "is not KEY=VALUE"),
        (["--fn", "prep.ops:side_context_row", "--arg", "a=1", "--arg", "a=2"], "more than once"),
        (["--fn", "prep.ops:side_context_row", "--jobs", "0"], "not a positive integer"),
        (["--fn", "prep.ops:side_context_row", "--executor", "gpu"], "invalid choice"),
        (["--fn", "prep.ops:side_context_row", "--columns", "x,,y"], "empty column name"),
        (["--fn", "prep.ops:side_context_row", "--device", "gpu"], "is not a torch device"),
        pytest.param(
            ["--fn", "prep.ops:side_context_row", "--device", "cuda"],
            "torch has no CUDA here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
    ],
)
def test_bad_arguments_exit_2(tmp_path, capsys, args, match):
    data = make(tmp_path / "data", shards=1)
    assert cli("run", data, "--out", tmp_path / "o", *args) == 2
    assert match in capsys.readouterr().err


def test_out_must_not_overlap_the_inputs(tmp_path, capsys):
    data = make(tmp_path / "data", shards=1)
    assert cli("run", data, "--out", data / "ready", *SIDE) == 2
    assert "overlap" in capsys.readouterr().err


def test_quiet_prints_nothing(tmp_path, capsys):
    data = make(tmp_path / "data", shards=2)
    assert cli("run", data, "--out", tmp_path / "o", *SIDE, "--quiet") == 0
    assert capsys.readouterr() == ("", "")


def test_progress_bar_on_a_terminal():
    stream = io.StringIO()
    p = ShardProgress(stream=stream, bar=True)
    p.start(2, 0, 0)
    p.done({"input": "a.pt", "rows": 1000, "seconds": 0.1})
    p.done({"input": "b.pt", "rows": 1000, "seconds": 0.1})
    p.finish(prep.run.Summary(shards=2, done=2, rows=2000, bytes_read=10**6, seconds=0.5))
    text = stream.getvalue()
    assert "2/2" in text and "2,000 rows" in text and "rows/s" in text and "\r" in text
    assert "2 done, 0 skipped" in text and "2.0 MB/s" in text


@pytest.mark.parametrize("value", ["16", "-3", "0.5", "1e-3", "true", "False", "left", "1,2"])
def test_parse_value(value):
    want = {"16": 16, "-3": -3, "0.5": 0.5, "1e-3": 0.001, "true": True, "False": False}
    assert parse_value(value) == want.get(value, value)
    assert type(parse_value(value)) is type(want.get(value, value))


# ------------------------------------------------------------------ other commands


def test_info(capsys):
    assert cli("info") == 0
    text = capsys.readouterr().out
    assert "torch" in text and "threads per worker" in text and "shm free" in text
    assert cli("info", "--json") == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["cores"] >= 1 and facts["torch"] == torch.__version__


def test_commands_table_and_help(capsys):
    assert list(COMMANDS) == ["run", "make-shards", "info", "bench", "forget"]
    assert cli("--help") == 0
    text = capsys.readouterr().out
    assert all(f"    {name}" in text for name in COMMANDS)
    assert cli("frobnicate") == 2


@pytest.mark.timeout(60)
def test_cluster_without_dask_says_how_to_install(tmp_path, capsys, monkeypatch):
    data = make(tmp_path / "data", shards=1)
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    assert cli("run", data, "--out", tmp_path / "o", *SIDE, "--cluster", "local") == 2
    assert "pip install 'prep[dask]'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_dask_cluster_gives_the_same_bytes(tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    data = make(tmp_path / "data", shards=3)
    cut = data / "shard-00002.pt"
    cut.write_bytes(cut.read_bytes()[:-10])
    assert cli("run", data, "--out", tmp_path / "local", *SIDE, "--on-error", "skip") == 1
    with distributed.LocalCluster(
        n_workers=1, processes=True, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address
        assert cli("run", data, "--out", tmp_path / "dask", *SIDE, "--on-error", "skip",
                   "--cluster", address) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("shard-00002.pt FAILED: ") == 2
    assert outputs(tmp_path / "dask") == outputs(tmp_path / "local")
    assert sorted(Manifest(tmp_path / "dask").entries()) == ["shard-00000.pt", "shard-00001.pt"]


# ------------------------------------------------------------------ as a process


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory) -> tuple[pathlib.Path, dict[str, bytes]]:
    """8 shards of 6 rows, and their outputs from an uninterrupted run."""
    root = tmp_path_factory.mktemp("slow")
    data = make(root / "data", shards=8, rows=6)
    assert cli("run", data, "--out", root / "clean", *SLOW, "--jobs", 4, "--quiet") == 0
    return data, outputs(root / "clean")


@pytest.mark.timeout(120)
def test_sigkill_anywhere_then_resume_is_byte_identical(tmp_path, slow_data):
    data, clean = slow_data
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *SLOW, "--jobs", 2, "--resume"]
    codes = []
    # each kill comes after an event (a shard reported done); the delay after it only
    # moves the kill point into the next shard's load, compute or save. Nothing waits on
    # it: wherever the kill lands, the resumed run must give the clean run's bytes
    for shards_done, delay in [(1, 0.0), (1, 0.17), (2, 0.08)]:
        child = Child(*args)
        if child.wait_for(shards_done):
            time.sleep(delay)
        child.proc.kill()
        codes.append(child.finish())
        for name in outputs(out):  # whatever has a final name is complete
            S.load_shard(out / name)
    assert codes.count(-signal.SIGKILL) >= 2, f"most runs must be killed mid-way: {codes}"
    child = Child(*args)
    assert child.finish() == 0, child.stderr
    assert outputs(out) == clean
    assert temps_in(out) == []
    assert sorted(Manifest(out).entries()) == sorted(clean)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("sig", "code", "executor"),
    [(signal.SIGTERM, 143, ["processes", "--workers", 2]), (signal.SIGINT, 130, ["threads"])],
)
def test_signal_abandons_in_flight_cleanly(tmp_path, slow_data, sig, code, executor):
    from .conftest import descendants

    data, clean = slow_data
    out = tmp_path / "out"
    child = Child("run", data, "--out", out, *SLOW[:-1], *executor, "--jobs", 2)
    assert child.wait_for(1)
    helpers = descendants(child.proc.pid)  # the row executor's worker processes, if any
    child.proc.send_signal(sig)
    assert child.finish() == code, child.stderr
    assert f"interrupted by {sig.name}" in child.stderr and "--resume" in child.stderr
    assert temps_in(out) == []
    entries = Manifest(out).entries()
    assert 1 <= len(entries) < len(clean)
    for e in entries.values():  # every recorded shard is complete and matches
        assert W.sha256_file(out / e["output"]) == e["output_sha256"]
    gone = lambda: not any(alive(pid) for pid in helpers)
    assert wait_until(gone, timeout=15), f"orphans: {helpers}"
    assert cli("run", data, "--out", out, *SLOW, "--resume", "--quiet") == 0
    assert outputs(out) == clean


def test_explain_prints_the_choice_and_writes_nothing(tmp_path, capsys):
    data = make(tmp_path / "in", shards=2, rows=256)
    code = cli(
        "run",
        data,
        "--out",
        tmp_path / "out",
        "--fn",
        "prep.ops:side_context_row",
        "--arg",
        "max_len=8",
        "--explain",
        "--parallel",
        "rows",  # rows spread by auto: its calibration on the first shard, whatever the plan
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "shard-00000.pt:" in text and "auto: 256 rows" in text
    # the op has a batched twin, measured on the shard (which one wins is the machine's
    # call: scripts/bench_auto.py measures it)
    assert "vectorized" in text and "\n  choice: " in text
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(240)
def test_two_runs_into_one_out_at_once_both_finish(tmp_path, capsys):
    """Concurrent runs never remove each other's temporary files (nor a third writer's)."""
    data = make(tmp_path / "data", shards=12, rows=6)  # 0.3 s a shard: the runs overlap
    assert cli("run", data, "--out", tmp_path / "ref", *SLOW, "--quiet") == 0
    out = tmp_path / "out"
    out.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        theirs = out / f".shard-00000.pt.tmp-{writer.pid}-0123abcd"  # a live run's, mid-write
        theirs.write_bytes(b"in flight")
        crashed = out / ".shard-00001.pt.tmp-99999999-0badc0de"  # a dead one's
        crashed.write_bytes(b"half")
        for _ in range(2):  # the second round redoes the two outputs the first lost
            args = ["run", data, "--out", out, *SLOW, "--resume"]
            runs = [
                subprocess.Popen(
                    [sys.executable, "-m", "prep", *map(str, args)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            errs = [r.communicate(timeout=120)[1] for r in runs]
            assert [r.returncode for r in runs] == [0, 0], errs
            assert theirs.exists(), errs
            assert not crashed.exists()
            assert temps_in(out) == [theirs]
            # remove the outputs of some shards: the next round redoes them concurrently
            for name in ("shard-00003.pt", "shard-00007.pt"):
                (out / name).unlink()
    finally:
        writer.kill()
        writer.wait()
    theirs.unlink()
    assert cli("run", data, "--out", out, *SLOW, "--resume") == 0
    assert "2 done, 10 skipped" in capsys.readouterr().err
    assert outputs(out) == outputs(tmp_path / "ref")
    manifest = Manifest(out)
    entries = manifest.entries()
    recipe = prep.run.RunConfig("tests.rowfns:slow", columns=("x",)).recipe()
    assert all(manifest.is_done(entries.get(s.rel), s, recipe) for s in S.find_shards([data]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_run_with_setup_gives_the_row_function_its_state(tmp_path, executor):
    data = make(tmp_path / "data", shards=2, rows=8)
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, "--fn", "tests.statefns:add_offset",
               "--setup", "tests.statefns:offset_state", "--columns", "x",
               "--executor", executor, "--workers", 2, "--quiet") == 0  # fmt: skip
    for name in ("shard-00000.pt", "shard-00001.pt"):
        source = S.load_shard(data / name)["x"]
        assert torch.equal(S.load_shard(out / name)["out"], source + 100.0)
    (entry,) = [e for e in Manifest(out).entries().values()][:1]
    assert entry["setup"] == "tests.statefns:offset_state"
