"""What ``scripts/bench_prepare.py`` watches while a contender runs: the peak PSS of its
process tree, and its stderr lines with the moment each arrived; from those lines,
``prep run``'s fixed part.

    watch(argv)  ── Popen, its own session ──▶ the contender, and every process it starts
        sampler thread  every ``every`` s: the sum of ``Pss:`` in /proc/PID/smaps_rollup
                        over every process of that session; the highest sum is kept
        reader thread   each stderr line, with ``time.perf_counter()`` as it arrived

PSS (proportional set size) charges a page shared by N processes 1/N to each, so the
sum over a tree counts a forked worker's copy-on-write pages once, as the machine does;
it also counts file pages a process maps (``torch.load(mmap=True)``, its libraries),
a library page shared with a process outside the tree only in part. Sampling misses a
peak shorter than ``every`` s (a buffer allocated, filled and freed between two reads):
the figure is a lower bound of the true peak. A process that leaves the session
(``setsid``) is not counted. Linux only: elsewhere the peak is None.

    python scripts/watch_run.py python -c "import torch"   # its seconds and peak PSS
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PSS_EVERY", "Fixed", "Watched", "fixed_part", "plan_workers", "session_pss", "watch"]

#: seconds between two samples of the tree's PSS (20 Hz)
PSS_EVERY = 0.05


def session_pss(sid: int) -> int | None:
    """Bytes of PSS of every live process in session ``sid`` (0 where none is found);
    None where this system has no /proc/PID/smaps_rollup (not Linux, or before 4.14)."""
    if not os.path.exists("/proc/self/smaps_rollup"):
        return None
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                # after the command's name, which may hold spaces and parentheses:
                # state ppid pgrp session ...
                if int(f.read().rsplit(b")", 1)[1].split()[3]) != sid:
                    continue
            with open(f"/proc/{name}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024  # kB
                        break
        except (OSError, ValueError, IndexError):
            continue  # it exited between the listing and the read
    return total


@dataclass
class Watched:
    """A finished command: seconds from just before its exec to its exit and the end of
    its stderr (whichever came later, as ``communicate`` waits); its stderr lines with
    their arrival in seconds after that start; its peak PSS in bytes (None: not read)."""

    seconds: float
    returncode: int | None  # None: killed after the time limit
    lines: list[tuple[float, str]] = field(default_factory=list)
    peak: int | None = None

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)


def watch(
    argv: list[str],
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    limit: float | None = None,
    every: float = PSS_EVERY,
) -> Watched:
    """Run ``argv`` in a session of its own (a timeout ends its workers too), sampling the
    session's PSS every ``every`` s (0: not at all) and timestamping its stderr lines."""
    lines: list[tuple[float, str]] = []
    peak: list[int | None] = [None]
    code: int | None = None
    stop = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    err = proc.stderr
    if err is None:  # never with stderr=PIPE; said for the type checker
        raise RuntimeError("Popen(stderr=PIPE) gave no pipe")

    def read() -> None:
        for raw in iter(err.readline, b""):
            lines.append((time.perf_counter() - start, raw.decode(errors="replace").rstrip()))

    def sample() -> None:
        while True:
            now = session_pss(proc.pid)
            if now is None:
                return
            peak[0] = max(peak[0] or 0, now)
            if stop.wait(every):
                return

    threads = [threading.Thread(target=read, daemon=True)]
    if every > 0:
        threads.append(threading.Thread(target=sample, daemon=True))
    for t in threads:
        t.start()
    seconds = 0.0
    try:
        proc.wait(timeout=limit)
        threads[0].join(timeout=limit)  # EOF: every process holding its stderr has exited
        seconds = time.perf_counter() - start
        # a process it left behind still holding stderr after the limit counts as a timeout
        code = None if threads[0].is_alive() else proc.returncode
    except subprocess.TimeoutExpired:
        seconds = time.perf_counter() - start
    finally:
        stop.set()
        if proc.poll() is None or code is None:  # a timeout, or interrupted: end all of it
            with contextlib.suppress(ProcessLookupError):  # else nothing of it is left
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for t in threads:
            t.join(timeout=5)
        err.close()
    return Watched(seconds, code, lines, peak[0])


# ------------------------------------------------------------------ prep run's fixed part

#: ``prep run: [3/8] shard-00002.pt: 2,048 rows in 0.61 s``: printed once the shard's
#: manifest line is durable (its group committed)
_SHARD = re.compile(r"^prep run: \[\d+/\d+\] (?P<name>.+): [\d,]+ rows in (?P<s>[\d.]+) s")
#: the summary; its seconds run from before the workers start to after the last commit
_SUMMARY = re.compile(r"^prep run: \d+ shard\(s\): .* in (?P<s>[\d.]+) s \(")
_WORKERS = re.compile(r"^prep run: shards: .* on (?P<n>\d+) worker processes")


@dataclass(frozen=True)
class Fixed:
    """The fixed part of a ``prep run``, in seconds (see :func:`fixed_part`)."""

    start: float  # exec to the first shard starting
    end: float  # the last shard's line to exit
    clock: float | None  # exec to prep's run clock (interpreter, imports, the listing)

    def __str__(self) -> str:
        return f"{self.start:.2f} + {self.end:.2f}"


def fixed_part(w: Watched, shard_seconds: Mapping[str, float] | None = None) -> Fixed | None:
    """From a non-quiet ``prep run``'s lines: ``start``, exec to the first shard starting
    (the earliest shard line's arrival less the shard's own seconds, ``shard_seconds``
    from its manifest entry where given, else the line's); ``end``, the last shard line's
    arrival to the command's exit; ``clock``, exec to the start of the seconds its summary
    line reports. None where no shard line came (``--quiet``, or nothing done).

    A shard line comes after the shard's result crossed to the parent and its group was
    committed (a few ms, an fsync): ``start`` is an upper bound and ``end`` a lower bound
    by that much, and the last group's commit counts as the shards' time.
    """
    shards = [(t, m) for t, line in w.lines if (m := _SHARD.match(line))]
    if not shards:
        return None
    seconds = shard_seconds or {}
    start = min(t - seconds.get(m["name"], float(m["s"])) for t, m in shards)
    end = w.seconds - max(t for t, _ in shards)
    summary = [(t, m) for t, line in w.lines if (m := _SUMMARY.match(line))]
    clock = summary[-1][0] - float(summary[-1][1]["s"]) if summary else None
    return Fixed(max(start, 0.0), end, clock)


def plan_workers(w: Watched) -> int | None:
    """The worker processes ``prep run``'s plan line names (whole shards), if any."""
    for _, line in w.lines:
        if m := _WORKERS.match(line):
            return int(m["n"])
    return None


if __name__ == "__main__":
    done = watch(sys.argv[1:])
    mib = "-" if done.peak is None else f"{done.peak / 2**20:,.0f} MiB"
    print(f"{done.seconds:.2f} s, exit {done.returncode}, peak PSS {mib}", file=sys.stderr)
