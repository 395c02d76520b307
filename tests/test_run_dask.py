"""``prep run --cluster`` when the Dask scheduler dies mid-run (issue 29, item 8): the run
ends with exit code 1 and one line naming the scheduler's address, and the shards in
flight are left for ``--resume``. Real ``dask scheduler`` and ``dask worker`` processes;
every step waits on an event (a line the scheduler prints, a file a row touches, a
process's exit), never on a sleep; how fast it ends is measured elsewhere, not here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest

from .conftest import wait_until
from .test_cli import ROOT, cli, outputs

pytest.importorskip("distributed")

ENV = dict(os.environ, PYTHONPATH=str(ROOT))


class Scheduler:
    """A ``dask scheduler`` process on a free port, and ``dask worker`` processes."""

    def __init__(self, workers: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
        )  # fmt: skip
        assert self.proc.stderr is not None
        self.address = ""
        for line in self.proc.stderr:  # an event: the scheduler says where it listens
            found = re.search(r"Scheduler at:\s+(tcp://\S+)", line)
            if found:
                self.address = found.group(1)
                break
        assert self.address, "the scheduler never said its address"
        self.proc.stderr.close()
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=ENV,
                cwd=ROOT,
            )  # fmt: skip
            for _ in range(workers)
        ]

    def close(self) -> None:
        for p in [self.proc, *self.workers]:
            p.kill()
            p.wait(timeout=30)


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    s = Scheduler(workers=2)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.timeout(240)
def test_a_dead_scheduler_ends_the_run_with_one_line_and_leaves_the_rest_to_resume(
    tmp_path, scheduler
):
    data = tmp_path / "data"
    for k in range(6):
        W.save_shard({"x": torch.arange(4.0)[:, None] + 10 * k}, data / f"s{k}.pt", "pt")
    started, go = tmp_path / "started", tmp_path / "go"
    out = tmp_path / "out"
    args = ["run", str(data), "--out", str(out), "--fn", "tests.rowfns:waits_for_go",
            "--columns", "x", "--arg", f"started={started}", "--arg", f"go={go}",
            "--executor", "serial"]  # fmt: skip
    run = subprocess.Popen(
        [sys.executable, "-m", "prep", *args, "--cluster", scheduler.address],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # an event: a shard is in flight on a worker, held there until `go` exists
        assert wait_until(lambda: started.exists() or run.poll() is not None, timeout=120)
        assert run.poll() is None, run.communicate()[1]
        scheduler.proc.kill()
        _, err = run.communicate(timeout=120)  # bounded: a hang fails, it is not timed
    finally:
        go.touch()  # the held rows may end; the workers are killed by the fixture
        run.kill()
    assert run.returncode == 1, err
    lines = err.strip("\n").splitlines()
    assert lines[-1] == (
        f"prep run: error: lost the Dask scheduler at --cluster {scheduler.address} in the "
        f"middle of the run; the shards in flight are not recorded: once a scheduler runs "
        f"there, rerun with --resume to finish"
    )
    assert "Traceback" not in err and "distributed" not in err, err
    assert len(lines) <= 2, err  # the summary line, and that one
    # nothing in flight was recorded, as done or as failed: --resume redoes all of it
    assert Manifest(out).entries() == {} and Manifest(out).failures() == {}
    assert cli(*args, "--resume", "--quiet") == 0
    want = {p.name: S.load_shard(p)["x"] for p in sorted(data.glob("*.pt"))}
    assert sorted(outputs(out)) == sorted(want)
    for name, x in want.items():
        assert torch.equal(S.load_shard(out / name)["out"], x)
