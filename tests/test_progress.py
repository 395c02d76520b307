"""``progress=True``: a tqdm bar on a terminal, moved as rows finish; nothing elsewhere."""

from __future__ import annotations

import fcntl
import functools
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import prep
from tests import registry
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import torch, prep
    x = torch.arange(64.0).view(64, 1)
    out = prep.map_rows(torch.neg, x, executor="threads", workers=2, progress=True)
    assert torch.equal(out, torch.stack([-row for row in x]))
    print("DONE", flush=True)
    """
)


def _run_on_a_terminal(script: str) -> str:
    """The script's output, run with stdout and stderr on a pseudo-terminal."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 wide
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=child,
        stderr=child, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    os.close(main)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.timeout(120)
def test_a_bar_is_drawn_on_a_terminal():
    """On a real terminal the bar is drawn (and cleared at the end: leave=False). That
    it moves through the rows is for the tests below: what a terminal shows in between
    depends on tqdm's redraw interval, a matter of time."""
    text = _run_on_a_terminal(SCRIPT)
    assert "DONE" in text, text[-2000:]
    assert "row/s" in text and "/64 [" in text, text[-2000:]


# ---------------------------------------------------------------- the bar moves, per executor
# Rows (or batches) of the second half wait for a gate (a file) that the bar opens when it
# shows a count strictly between 0 and the total: a bar that moves lets them through at
# once; a bar that jumps from 0 to the end leaves them waiting until GIVE_UP, then the
# test fails on what the bar showed. No sleep decides anything; no figure of time.

#: how long a gated row waits for a bar that never moves before it gives up (a bound,
#: only reached by a defect)
GIVE_UP = 20.0


def gated(row: torch.Tensor, *, gate: str, half: int) -> torch.Tensor:
    """``row * 2``; rows whose first value is ``half`` or more wait for ``gate`` to exist
    (the first to give up opens it for the rest)."""
    if int(row.flatten()[0]) >= half and not wait_until(Path(gate).exists, GIVE_UP, 0.005):
        Path(gate).touch()
    return row * 2


class Recorder:
    """Stands in for tqdm (prep._progress.tqdm): records every count the bar shows, and
    opens the gate at the first one strictly between 0 and the end."""

    bars: list[Recorder] = []
    gate: Path
    end: int

    def __init__(self, total: int | None = None, **_: Any) -> None:
        self.total, self.n, self.shown = total, 0, [0]
        self.closed = False
        self.postfix = ""
        self._lock = threading.Lock()
        Recorder.bars.append(self)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            self.shown.append(self.n)
            if 0 < self.n < Recorder.end:
                Recorder.gate.touch()

    def set_postfix_str(self, text: str, **__: Any) -> None:
        self.postfix = text

    def write(self, *_: Any, **__: Any) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch, tmp_path):
    """The bars prep makes from here on, recorded, as if stderr were a terminal; the
    gate is reset for each (a fresh file name)."""
    import prep._progress

    monkeypatch.setattr(prep._progress, "on_terminal", lambda: True)
    monkeypatch.setattr(prep._progress, "tqdm", Recorder)
    monkeypatch.setattr(Recorder, "bars", [])
    calls = iter(range(100))

    def arm(end: int) -> str:
        Recorder.gate = tmp_path / f"gate-{next(calls)}"
        Recorder.end = end
        return str(Recorder.gate)

    return arm


def moved(bar: Recorder, end: int) -> None:
    assert bar.shown == sorted(bar.shown), f"the bar went back: {bar.shown}"
    assert bar.shown[-1] == end and bar.closed, f"the bar did not end at {end}: {bar.shown}"
    assert any(0 < n < end for n in bar.shown), f"the bar jumped from 0 to {end}: {bar.shown}"


#: gated reads values and has no twin: vectorized and vmap refuse it (tests/registry.py);
#: each makes a batch in one call, so its bar can only go from 0 to the end
EXECUTORS = registry.executors(registry.NO_TWIN, registry.READS_VALUES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_bar_of_a_batch_moves_as_rows_finish(no_leaks, bars, executor):
    x = torch.arange(64.0).view(64, 1)
    want = torch.stack([row * 2 for row in x])
    with prep.Pool(executor, workers=2, progress=True) as pool:  # the pool's default
        fn = functools.partial(gated, gate=bars(64), half=32)
        assert torch.equal(pool.map_rows(fn, x), want)
        fn = functools.partial(gated, gate=bars(64), half=64)  # no bar: none waits
        assert torch.equal(pool.map_rows(fn, x, progress=False), want)  # a call's own
    fn = functools.partial(gated, gate=bars(64), half=32)
    assert torch.equal(prep.map_rows(fn, x, executor=executor, workers=2, progress=True), want)
    assert len(Recorder.bars) == 2  # none for progress=False
    for bar in Recorder.bars:
        moved(bar, 64)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_bar_of_a_stream_moves_as_batches_finish(no_leaks, bars, executor):
    batches = [torch.full((4, 1), float(k)) for k in range(8)]
    with prep.Pool(executor, workers=2, progress=True) as pool:
        fn = functools.partial(gated, gate=bars(8), half=4)  # batches 4-7 wait
        got = list(pool.imap(fn, batches))
    assert all(torch.equal(g, torch.stack([r * 2 for r in b])) for g, b in zip(got, batches))
    (bar,) = Recorder.bars
    moved(bar, 8)
    # the rows so far, and the share of the stream's time the loop waited (what bounds it)
    assert re.fullmatch(r"32 rows, [\d,]+ rows/s, waited \d+%", bar.postfix), bar.postfix


def test_no_bar_off_a_terminal(capsys):
    out = prep.map_rows(torch.neg, torch.ones(8, 2), executor="serial", progress=True)
    assert torch.equal(out, -torch.ones(8, 2))
    assert capsys.readouterr().err == ""


def test_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress=1 is not True or False"):
        prep.map_rows(torch.neg, torch.ones(2, 2), executor="serial", progress=1)
