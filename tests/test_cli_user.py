"""``prep run`` as a new user meets it (issue 30): each case runs the command and checks
its exit code and the lines it prints; messages name the file, the column and the flag.

The data is a folder of token-id shards, dicts of ``input_ids`` [rows, 16] and a scalar
``lengths`` per row, and the row function :func:`tests.rowfns.wwm_row`, pure Python,
which takes both by name; every output is compared with a plain loop written here.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import prep
from prep.cli import main
from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest

from . import rowfns
from .conftest import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[1]
WWM = ["--fn", "tests.rowfns:wwm_row"]
ROWS = 300


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def tokens(folder: pathlib.Path, shards: int = 4, bad: dict[int, list[int]] | None = None,
           without: tuple[int, ...] = ()) -> pathlib.Path:  # fmt: skip
    """``shards`` shards of ROWS rows; shard k's rows in ``bad[k]`` have length 7 (the
    function raises on them); the shards in ``without`` lack the ``lengths`` column."""
    gen = torch.Generator().manual_seed(0)
    for k in range(shards):
        ids = torch.randint(1000, 30000, (ROWS, 16), generator=gen)
        lengths = torch.randint(8, 17, (ROWS,), generator=gen)
        lengths[(bad or {}).get(k, [])] = 7
        columns = {"input_ids": ids} if k in without else {"input_ids": ids, "lengths": lengths}
        W.save_shard(columns, folder / f"s{k}.pt", "pt")
    return folder


def loop(path: pathlib.Path, skip: bool = False) -> torch.Tensor:
    """The plain loop: every row through wwm_row by name, stacked (failing rows left out)."""
    t = S.load_shard(path)
    rows = [(ids, n) for ids, n in zip(t["input_ids"], t["lengths"]) if not (skip and n == 7)]
    return torch.stack([rowfns.wwm_row(input_ids=ids, lengths=n) for ids, n in rows])


def lines(err: str) -> list[str]:
    return err.strip("\n").splitlines()


# ------------------------------------------------------------------ 1. --fn as a file path


MODULE = """
import torch

def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("spec", "executor"),
    [("./issue30_rows.py:double", "auto"), ("lib/issue30_lib.py:double", "processes")],
)
def test_fn_may_be_a_file_path(tmp_path, capsys, monkeypatch, spec, executor):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's folder goes on it
    module = tmp_path / spec.partition(":")[0]
    module.parent.mkdir(exist_ok=True)
    module.write_text(MODULE)
    data = tmp_path / "data"
    W.save_shard({"x": torch.arange(12.0).view(4, 3)}, data / "a.pt", "pt")
    W.save_shard({"x": torch.arange(6.0).view(2, 3)}, data / "b.pt", "pt")
    code = cli("run", data, "--out", "out", "--fn", spec, "--executor", executor,
               "--workers", 2)  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "2 done, 0 skipped, 0 failed" in err
    for name in ("a.pt", "b.pt"):
        want = S.load_shard(data / name)["x"] * 2
        assert torch.equal(S.load_shard(tmp_path / "out" / name)["out"], want)
    assert Manifest(tmp_path / "out").entries()["a.pt"]["fn"] == spec  # as given


@pytest.mark.parametrize("columns", [[], ["--columns", "x"]])
def test_args_may_share_names_with_prep_s_own_parameters(tmp_path, capsys, columns):
    data = tmp_path / "data"
    W.save_shard({"x": torch.arange(8.0).view(4, 2)}, data / "a.pt", "pt")
    args = ["--arg", "fn=2", "--arg", "names=3", "--arg", "positional=5"]
    code = cli("run", data, "--out", tmp_path / "o", "--fn", "tests.rowfns:scaled_by", *args,
               "--executor", "serial", *columns)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    want = torch.stack([row * 30 for row in torch.arange(8.0).view(4, 2)])
    assert torch.equal(S.load_shard(tmp_path / "o" / "a.pt")["out"], want)


def test_fn_path_that_is_not_a_file_says_what_to_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tokens(tmp_path / "data", shards=1)
    assert cli("run", data, "--out", "out", "--fn", "rows.py:wwm_row") == 2
    (line,) = lines(capsys.readouterr().err)
    assert line.startswith("prep run: error: --fn 'rows.py:wwm_row': 'rows.py' does not exist")
    assert "a module name without .py, e.g. --fn rows:wwm_row" in line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 2. a missing column


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_error", ["stop", "skip"])
def test_a_shard_without_a_column_fails_alone_naming_file_and_column(tmp_path, capsys, on_error):
    data = tokens(tmp_path / "data", shards=3, without=(0,))  # the first shard lacks it
    out = tmp_path / "out"
    code = cli("run", data, "--out", out, *WWM, "--on-error", on_error, "--jobs", 1,
               "--parallel", "rows")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1  # a file's fault, not a setting's (2)
    failed = [x for x in lines(err) if "FAILED" in x]
    assert failed == [
        f"prep run: [1/3] s0.pt FAILED: {data / 's0.pt'}: has no column 'lengths', which --fn "
        f"tests.rowfns:wwm_row takes (the shard has 'input_ids'); add it to the shard, or "
        f"give the function a value with --arg lengths=VALUE"
    ]
    assert "Traceback" not in err
    done = sorted(Manifest(out).entries())
    assert done == ([] if on_error == "stop" else ["s1.pt", "s2.pt"])
    for name in done:
        assert torch.equal(S.load_shard(out / name)["out"], loop(data / name))


# ------------------------------------------------------------------ 3. state= without --setup


@pytest.mark.parametrize("columns", [[], ["--columns", "x"]])
def test_state_without_setup_names_setup(tmp_path, capsys, columns):
    data = tmp_path / "data"
    W.save_shard({"x": torch.ones(4, 2)}, data / "a.pt", "pt")
    assert cli("run", data, "--out", tmp_path / "o", "--fn", "tests.rowfns:needs_state",
               *columns) == 2  # fmt: skip
    (line,) = lines(capsys.readouterr().err)
    assert line == (
        "prep run: error: --fn tests.rowfns:needs_state takes per-worker state as state=, and "
        "no --setup gives it; pass --setup MODULE:FUNCTION, a function that builds the state "
        "(called once in each worker)"
    )


# ------------------------------------------------------------------ 4. the flag that helps


@pytest.mark.timeout(120)
def test_row_errors_name_on_row_error_and_following_it_works(tmp_path, capsys):
    data = tokens(tmp_path / "data", bad={1: [5, 40]})
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *WWM, "--jobs", 1, "--parallel", "rows") == 1
    err = capsys.readouterr().err
    assert "s1.pt FAILED: row 5: ValueError: bad sample: length 7; --on-row-error skip" in err
    last = lines(err)[-1]
    assert "--on-row-error skip" in last and "fill (--fill VALUE" in last
    assert "--on-error skip" in last  # for shards that fail otherwise, still named
    # following it: the shard is saved without its two failing rows, the others kept
    assert cli("run", data, "--out", out, *WWM, "--resume", "--on-row-error", "skip") == 0
    err = capsys.readouterr().err
    assert "warning: 2 row(s) in 1 shard(s) failed and were left out" in err
    for k in range(4):
        got = S.load_shard(out / f"s{k}.pt")["out"]
        assert torch.equal(got, loop(data / f"s{k}.pt", skip=True))


def test_ragged_rows_name_the_pad_flag(tmp_path, capsys):
    data = tmp_path / "data"
    W.save_shard({"x": torch.arange(24.0).view(8, 3)}, data / "a.pt", "pt")
    args = ["--fn", "tests.rowfns:ragged", "--columns", "x", "--executor", "serial"]
    assert cli("run", data, "--out", tmp_path / "o", *args) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in lines(err) if "FAILED" in x]
    assert "a.pt FAILED: StackError: row 1 returned shape (2,)" in line
    assert line.endswith("(pass --pad VALUE (e.g. --pad 0) to pad them)")
    assert "pad=" not in err
    assert cli("run", data, "--out", tmp_path / "o2", *args, "--pad", 0, "--quiet") == 0


# ------------------------------------------------------------------ 5. volume


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quiet", [False, True])
def test_one_line_per_failed_shard_and_one_traceback(tmp_path, capsys, quiet):
    data = tokens(tmp_path / "data", shards=5, bad={1: [5, 40], 3: [0]})
    cut = data / "s2.pt"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # truncated
    out = tmp_path / "out"
    flags = ["--quiet"] if quiet else []
    code = cli("run", data, "--out", out, *WWM, "--on-error", "skip", "--executor", "processes",
               "--workers", 2, *flags)  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    for name in ("s1.pt", "s2.pt", "s3.pt"):  # each failed shard: exactly one line
        assert sum(name in x for x in lines(err) if "failed with" not in x) == 1, err
    assert "cannot be read as a shard (truncated: it starts as a zip archive" in err
    assert err.count("Traceback (most recent call last)") == 1
    trace = err[err.index("Traceback") :].splitlines()
    assert trace[1].startswith('  File "') and "rowfns.py" in trace[1]  # the function's line
    assert trace[3] == "ValueError: bad sample: length 7"  # no frame of prep's in between
    assert "prep/executors" not in err and "RemoteTraceback" not in err
    assert len(lines(err)) <= (12 if quiet else 17), err
    # the rest is in the manifest: each failure, with its whole traceback
    failures = Manifest(out).failures()
    assert sorted(failures) == ["s1.pt", "s2.pt", "s3.pt"]
    assert "RowError: row 5" in failures["s1.pt"]["traceback"]
    assert failures["s2.pt"]["error"].startswith(f"{data / 's2.pt'}: cannot be read as a shard")
    assert f"in {out / 'manifest.jsonl'}" in err


# ------------------------------------------------------------------ 6. bytes read


@pytest.mark.timeout(120)
def test_the_summary_counts_what_failed_shards_read(tmp_path, capsys):
    data = tokens(tmp_path / "data", shards=2, bad={0: [1], 1: [2]})
    assert cli("run", data, "--out", tmp_path / "o", *WWM, "--on-error", "skip") == 1
    err = capsys.readouterr().err
    size = sum(p.stat().st_size for p in data.glob("*.pt")) / 1e6
    assert (
        f"0 done, 0 skipped, 2 failed, 0 not finished; 0 rows written; {size:,.1f} MB read" in err
    )
    assert size >= 0.05  # the figure is not 0.0
    # the failures are the manifest's: a second run into the folder needs --resume
    assert cli("run", data, "--out", tmp_path / "o", *WWM) == 2
    assert "(0 shard(s) done, 2 failed); pass --resume" in capsys.readouterr().err


# ------------------------------------------------------------------ 7. a changed recipe


@pytest.mark.timeout(120)
def test_resume_with_a_changed_arg_says_so_before_redoing(tmp_path, capsys):
    data = prep.run.make_shards(tmp_path / "data", shards=3, rows=8, seq=6, dim=2)[0].parent
    out = tmp_path / "out"
    side = ["--fn", "prep.ops:side_context_row", "--arg", "max_len=3"]
    assert cli("run", data, "--out", out, *side, "--quiet") == 0
    assert cli("run", data, "--out", out, *side, "--arg", "side=right", "--resume") == 0
    got = lines(capsys.readouterr().err)
    assert got[0] == (
        "prep run: warning: the recipe changed since 3 shard(s) were done (--arg side: none -> "
        "'right'): they will be computed again and their outputs replaced; to keep them, stop "
        "now (Ctrl-C) and choose a new --out"
    )
    assert "3 done, 0 skipped" in got[-1]
    # an unchanged recipe says nothing of the kind, even without --quiet
    assert cli("run", data, "--out", out, *side, "--arg", "side=right", "--resume") == 0
    assert "recipe changed" not in capsys.readouterr().err


# ------------------------------------------------------------------ 8. files that are not shards


def test_files_that_are_not_shards_are_named(tmp_path, capsys):
    data = tokens(tmp_path / "data", shards=2)
    torch.save({"input_ids": torch.ones(2, 16, dtype=torch.int64)}, data / "extra.pth")
    (data / ".hidden.tmp").write_bytes(b"")  # hidden: a temp file, not worth a word
    assert cli("run", data, "--out", tmp_path / "o", *WWM) == 0
    got = lines(capsys.readouterr().err)
    assert got[0] == (
        f"prep run: note: 1 file(s) under the inputs are not .pt or .safetensors shards, and "
        f"are skipped: {data / 'extra.pth'}; a .pth file torch.save wrote is a .pt file: "
        f"rename it to .pt to include it"
    )
    assert "2 done" in got[-1]


# ------------------------------------------------------------------ 9. --explain, executors


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_explain_honours_executor_and_says_threads_and_jobs(tmp_path, capsys, executor):
    data = tokens(tmp_path / "data", shards=2)
    code = cli("run", data, "--out", tmp_path / "o", *WWM, "--explain", "--executor", executor,
               "--jobs", 3)  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    got = lines(text)
    assert got[0].startswith(f"rows: one shard at a time, its rows spread by --executor {executor}")
    assert got[1].startswith("torch threads: ")
    assert got[2].startswith("jobs: 3 shard(s) in flight, threads of this process (--jobs)")
    assert got[3] == f"each shard's rows: {executor}, from this process (--executor)"
    assert "auto" not in text and "choice" not in text
    assert not (tmp_path / "o").exists()


def test_explain_with_a_cluster_honours_executor(tmp_path, capsys):
    data = tokens(tmp_path / "data", shards=2)
    address = "tcp://127.0.0.1:9"  # nothing listens: --explain never connects
    assert cli("run", data, "--out", tmp_path / "o", *WWM, "--explain", "--executor",
               "threads", "--cluster", address) == 0  # fmt: skip
    got = lines(capsys.readouterr().out)
    assert got[0].startswith(f"cluster: shards go to the Dask scheduler at {address}")
    assert got[1] == "each shard's rows: threads on its Dask worker (--executor)"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("flags", "asked"),
    [(["--executor", "threads"], None), (["--parallel", "rows"], "auto"),
     (["--parallel", "shards"], None)],
)  # fmt: skip
def test_progress_and_manifest_say_what_ran_each_shard(tmp_path, capsys, flags, asked):
    data = tokens(tmp_path / "data", shards=2)
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *WWM, *flags, "--workers", 2) == 0
    err = capsys.readouterr().err
    for name, e in Manifest(out).entries().items():
        assert e["executor"] in prep.EXECUTORS and e["executor"] != "auto"
        assert e.get("executor_asked") == asked
        by = f", chosen by {asked}" if asked else ""
        assert f"{name}: {ROWS:,} rows in " in err and f" (rows: {e['executor']}{by})\n" in err
        if flags[0] == "--executor":
            assert e["executor"] == "threads"
        assert torch.equal(S.load_shard(out / name)["out"], loop(data / name))


# ------------------------------------------------------------------ 10. rows under skip


@pytest.mark.timeout(120)
def test_rows_under_skip_are_the_rows_written(tmp_path, capsys):
    data = tokens(tmp_path / "data", shards=2, bad={0: [3, 4, 9]})
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *WWM, "--on-row-error", "skip") == 0
    err = capsys.readouterr().err
    e = Manifest(out).entries()["s0.pt"]
    written = S.load_shard(out / "s0.pt")["out"]
    assert (e["rows"], e["input_rows"], e["failed_rows"]) == (ROWS - 3, ROWS, [3, 4, 9])
    assert written.shape[0] == e["rows"] and torch.equal(written, loop(data / "s0.pt", True))
    assert f"s0.pt: {ROWS - 3:,} rows in " in err and f"; {2 * ROWS - 3:,} rows written" in err


# ------------------------------------------------------------------ 11. stderr after exit


def pipe_holders(inode: int) -> list[str]:
    """The command lines of the processes but this one holding the pipe ``inode``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            held = any(os.readlink(f"/proc/{pid}/fd/{fd}") == f"pipe:[{inode}]" for fd in fds)
            if held:
                with open(f"/proc/{pid}/cmdline") as f:
                    found.append(f.read().replace("\0", " ")[:120])
        except OSError:
            continue
    return found


@pytest.mark.timeout(120)
def test_no_process_holds_the_commands_stderr_after_it_exits(tmp_path):
    data = tokens(tmp_path / "data", shards=2)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "prep", "run", str(data), "--out", str(tmp_path / "o"), *WWM,
         "--executor", "processes", "--workers", "2", "--quiet"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    inode = os.fstat(proc.stderr.fileno()).st_ino
    assert proc.wait(timeout=100) == 0
    # the moment the command has exited, only prep's forkserver (and multiprocessing's
    # resource tracker) may still hold its stderr, inherited, and only while they end:
    # since a07d11a the forkserver exits at once when its caller is gone (9-20 ms from the
    # command's exit to EOF here; 0.4-1 s before). Whoever else held it, or held on,
    # would make `prep run ... 2>&1 | cat` wait. How long it takes is not this test's.
    holders = pipe_holders(inode)
    helpers = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
    # an empty command line is a process caught in the middle of its exit (the kernel
    # releases its memory, and with it the command line, before its files): ending
    others = [cmd for cmd in holders if cmd and not any(h in cmd for h in helpers)]
    assert not others, json.dumps(holders)
    assert wait_until(lambda: not pipe_holders(inode), timeout=30), pipe_holders(inode)
    assert proc.stderr.read() == b""  # EOF: no writer left
    proc.stderr.close()
