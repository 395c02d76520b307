"""Temporary files of shards being written: tracked, abandoned, and cleaned up after crashes.

:func:`~prep.run.save.save_shard` writes ``.{name}.tmp-{pid}-{random}`` next to
the final file and renames it into place. The PID in the name says whose it is:
a run removes the ones whose writer is gone, never those of a live run writing
into the same folder.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from pathlib import Path

from .._writers import writer_alive
from ..errors import Cancelled

__all__ = ["Temps", "remove_stale_temps"]

_TEMP = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]{8}$")  # .{name}.tmp-{pid}-{random}


class Temps:
    """The temporary files of shards in flight, so an abandoned run can remove them.

    After :meth:`abandon`, no new temporary file is created and none is renamed
    into place: an interrupted run leaves only complete outputs behind.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[Path] = set()
        self._abandoned = False

    def _check(self, final: Path) -> None:
        if self._abandoned:
            raise Cancelled(f"{final}: the run was abandoned")

    def new(self, final: Path) -> Path:
        with self._lock:
            self._check(final)
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
            self._live.add(tmp)
            return tmp

    def replace(self, tmp: Path, final: Path) -> None:
        with self._lock:
            self._check(final)
            os.replace(tmp, final)
            self._live.discard(tmp)

    def forget(self, tmp: Path) -> None:
        with self._lock:
            self._live.discard(tmp)
        tmp.unlink(missing_ok=True)

    def abandon(self) -> list[Path]:
        """Remove every temporary file in flight; refuse new ones. Returns those removed."""
        with self._lock:
            self._abandoned = True
            live, self._live = sorted(self._live), set()
        for tmp in live:
            tmp.unlink(missing_ok=True)
        return live


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete the temporary files that crashed runs left under ``folder``; returns them.

    A temporary file is stale when the process named by its PID is gone (or is
    a zombie, or started after the file was last written, so it is another
    process under a reused PID): a live run writing into the same folder keeps
    its files. PIDs are this machine's; on a cluster a worker's temporary file
    may name a process elsewhere, which is judged here by the PID alone.
    """
    stale = []
    for p in folder.rglob(".*.tmp-*"):
        match = _TEMP.match(p.name)
        if match is None or not p.is_file():
            continue
        try:
            mtime = p.stat().st_mtime
        except FileNotFoundError:  # renamed into place meanwhile
            continue
        if not writer_alive(int(match[1]), mtime):
            p.unlink(missing_ok=True)
            stale.append(p)
    return stale
