"""Whether the process that wrote a file may still own it. prep's files of a moment
carry their writer's PID in their names (``prep run``'s outputs being written, a
Loader's dataset for its workers), and a process removes those whose writer is gone:
one that ended before its cleanup ran (killed, or a Jupyter kernel ended) cannot."""

from __future__ import annotations

import os

__all__ = ["running", "writer_alive"]


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed process not yet
    reaped, as good as dead). Reads no clock: a worker watches its parent with it."""
    if not _exists(pid):
        return False
    fields = _stat(pid)
    return fields is None or fields[0] != "Z"


def writer_alive(pid: int, mtime: float) -> bool:
    """Whether process ``pid`` may still be writing a file last written at ``mtime``."""
    if not _exists(pid):
        return False
    started = _started(pid)  # +inf for a zombie: never alive
    # slack: the boot time is whole seconds and the wall clock may have been adjusted;
    # misjudging a stale file as live only leaves it, the other way would break a run
    return started is None or started <= mtime + 60.0


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    except OverflowError:  # no such PID can exist
        return False
    return True


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (Linux); None if unread."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds); +inf for a zombie; None if unknown.

    From ``/proc`` (Linux): a zombie never writes again, and a process started
    after the file's last write did not write it.
    """
    fields = _stat(pid)
    if fields is None:
        return None
    if fields[0] == "Z":
        return float("inf")
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None
