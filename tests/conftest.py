"""Fixtures that catch leaks: child processes and /dev/shm entries left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import settings

# executor 'compiled' on torch.compile's eager backend: it traces each function as
# inductor would and generates no code, so that a suite over the registry does not pay
# ~9 s of inductor compile a function (tests/test_compiled.py runs inductor itself).
# Set before prep is imported: prep.executors.compiled reads it once, at import.
os.environ.setdefault("PREP_COMPILE_BACKEND", "eager")

import prep  # noqa: E402

# auto's wisdom file (prep.auto.wisdom) is the user's: tests that use it set their own
os.environ["PREP_WISDOM"] = "off"

# property tests draw the same examples on every run (a failure is one to rerun, not a
# roll of the dice), and a failure prints the blob that reproduces it
settings.register_profile("prep", derandomize=True, print_blob=True)
settings.load_profile("prep")


def _table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            table[int(entry)] = (int(fields[1]), fields[0], cmd)
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int | None = None) -> dict[int, str]:
    """Live (non-zombie) descendants of ``pid`` -> their command line."""
    pid = os.getpid() if pid is None else pid
    table = _table()
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for p, (ppid, state, cmd) in table.items():
            if ppid == parent and p not in found:
                frontier.append(p)
                if state != "Z":
                    found[p] = cmd
    return found


# Long-lived helper servers that multiprocessing and loky start once per interpreter
# by design (not per pool): the forkserver and the resource trackers. Pool workers are
# forked *by* the forkserver, so they are found as its children.
SERVERS = ("forkserver import", "resource_tracker", "semaphore_tracker")


def pool_children(pid: int | None = None) -> dict[int, str]:
    """Every process below ``pid`` except the per-interpreter servers themselves."""
    pid = os.getpid() if pid is None else pid
    table = _table()
    servers = {
        p for p, (ppid, _, cmd) in table.items() if ppid == pid and any(s in cmd for s in SERVERS)
    }
    return {p: c for p, c in descendants(pid).items() if p not in servers}


#: /dev/shm names that prep, torch and loky create: torch's segments, prep's, loky's
#: segments and the semaphores loky makes for this process's pools (named after its
#: pid: another process's tests, running beside these, make their own)
SHM_PREFIXES = ("torch_", "prep", "loky", f"sem.loky-{os.getpid()}-")


def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


def wait_until(predicate, timeout: float = 10.0, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """After the test and ``prep.shutdown()``, no pool process or shm entry is left."""
    before_shm = shm_entries()
    yield
    prep.shutdown()
    assert wait_until(lambda: not pool_children()), f"processes left: {pool_children()}"
    assert wait_until(lambda: shm_entries() <= before_shm), (
        f"/dev/shm entries left: {shm_entries() - before_shm}"
    )


def run_script(script: str, *args: str) -> None:
    """``script`` in a fresh interpreter with ``args``; it must print OK."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
