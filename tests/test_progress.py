"""``progress=True``: a tqdm bar on a terminal, moved as rows finish; nothing elsewhere."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest
import torch

import prep

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import time, torch, prep
    def slowish(row):
        time.sleep(0.002)
        return row * 2
    x = torch.arange(400.0).view(400, 1)
    for executor in ("serial", "threads", "processes"):
        out = prep.map_rows(slowish, x, executor=executor, workers=2, progress=True)
        assert torch.equal(out, x * 2)
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
def test_a_bar_on_a_terminal_moves_as_rows_finish():
    text = _run_on_a_terminal(SCRIPT)
    assert "DONE" in text, text[-2000:]
    assert "row/s" in text, text[-2000:]
    counts = {int(part.split("/400")[0].split()[-1]) for part in text.split("\r") if "/400" in part}
    assert len(counts - {0, 400}) >= 1, f"the bar only jumped from 0 to 400: {sorted(counts)}"


def test_no_bar_off_a_terminal(capsys):
    out = prep.map_rows(torch.neg, torch.ones(8, 2), executor="serial", progress=True)
    assert torch.equal(out, -torch.ones(8, 2))
    assert capsys.readouterr().err == ""


def test_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress=1 is not True or False"):
        prep.map_rows(torch.neg, torch.ones(2, 2), executor="serial", progress=1)
