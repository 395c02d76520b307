"""Wisdom: what ``auto`` measured, remembered across interpreters.

A training script runs many times on one machine with the same function and
shapes; without a memory, every run pays calibration and the rent-or-buy of a
process pool again. ``auto`` writes its settled choice for a signature and each
executor's figure (seconds a batch) to a small JSON file, and a later
interpreter with the same key starts on that choice from its first call. It
still times every batch and re-decides when the figures run off, so a stale
entry costs a few batches, never a wrong result: the checks that rows computed
elsewhere equal serial's (:mod:`prep.core.trust`) run in every interpreter.

The key covers everything that changes the answer:

* the function: module, qualified name, a digest of its code, and of the
  arguments bound to it (``functools.partial``, closure cells, defaults). A
  function bound to a value that cannot be digested stably (an open file, a
  model object) is not remembered;
* the batch's layout (per-row shapes, dtypes, device), its size to within 4x,
  ``pad=``/``on_error=``, pinned output, and the number of workers;
* the machine: CPU model, cores, the Python, torch and prep versions.

The file is ``$XDG_CACHE_HOME/prep/wisdom.json`` (``~/.cache/prep/...``);
``PREP_WISDOM=/some/file`` moves it and ``PREP_WISDOM=off`` turns wisdom off.
:func:`forget` (``prep forget``) clears it. Several processes may write at once
(DataLoader workers, ``prep run --jobs``, two scripts): each write takes an
exclusive lock, merges its entry into what the file holds then, and replaces
the file atomically, so no entry is lost and no reader sees half a file. A
corrupt file or entry is ignored (and replaced by the next write).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .._kept import keep_newest
from .._version import __version__
from ..core.identity import identity
from ..executors import available_cores

__all__ = [
    "ENV",
    "flush",
    "forget",
    "key",
    "location",
    "named",
    "recall",
    "remember",
    "remember_later",
]

ENV = "PREP_WISDOM"
#: the file's format; another version's file is ignored
FORMAT = 1
#: entries kept; past this the oldest are dropped
ENTRIES = 2000
_OFF = {"", "0", "off", "no", "false", "none"}
#: seconds the background writer waits for more entries before it writes them all
COALESCE = 2.0


def location() -> Path | None:
    """The wisdom file, or None where ``PREP_WISDOM`` turns wisdom off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "prep" / "wisdom.json"


# ---------------------------------------------------------------- the key


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """What a remembered figure holds for: this CPU, its cores, these versions."""
    return {
        "cpu": _cpu_model(),
        "cores": available_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "prep": __version__,
        "os": sys.platform,
    }


def key(fn: Callable[..., Any], layout: Any, rows: int, workers: int, options: Any) -> str | None:
    """The wisdom key of a signature, or None where the function cannot be keyed."""
    who = identity(fn)
    if who is None:
        return None
    size = round(math.log(max(rows, 1), 4))  # batch sizes within 4x share a choice
    text = json.dumps([FORMAT, who, repr(layout), size, workers, repr(options), machine()])
    return hashlib.sha256(text.encode()).hexdigest()


def busy() -> str:
    """Why this machine's figures would mislead a later run now ("" when they would
    not): other processes keep more than its cores busy (the last minute's load
    average, which counts prep's own workers too, above the cores). A figure taken
    then (a batched op on oversubscribed cores ran 100x slower here) would be
    remembered as this machine's, and a later quiet run would start from it."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return ""
    cores = available_cores()
    return f"the load average is {load:.1f} on {cores} cores" if load > cores else ""


# ---------------------------------------------------------------- the file


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # none yet, or corrupt: ignored, and replaced by the next write
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: Path, entries: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f)
        os.replace(tmp, path)  # readers see the old file or the new one, never half
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def valid(entry: Any, known: Callable[[str], bool]) -> bool:
    """Whether an entry is whole: a known choice among finite, positive figures."""
    if not isinstance(entry, dict):
        return False
    figures, choice = entry.get("figures"), entry.get("choice")
    return (
        isinstance(figures, dict)
        and isinstance(choice, str)
        and choice in figures
        and isinstance(entry.get("rows"), int)
        and all(
            known(n) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0
            for n, v in figures.items()
        )
    )


#: figures an older entry kept under a key of their own, not by executor: the key,
#: and the figure and executor it is (read, never written)
_OLD_KEYS = {"process_start": ("start", "processes"), "thread_speedup": ("speedup", "threads")}


def named(entry: dict[str, Any], figure: str) -> dict[str, float]:
    """``entry``'s ``figure`` of each executor (``"start"``: seconds starting it costs,
    ``"speedup"``: a pool's over serial), by executor name; an older entry's too."""
    kept = entry.get(figure)
    found = {
        str(n): float(v)
        for n, v in (kept.items() if isinstance(kept, dict) else ())
        if isinstance(v, (int, float))
    }
    for old, (was, name) in _OLD_KEYS.items():
        if was == figure and isinstance(entry.get(old), (int, float)):
            found.setdefault(name, float(entry[old]))
    return found


_cache: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def _entries(path: Path) -> dict[str, Any]:
    """The file's entries, read again only when it changed (a new signature asks)."""
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    kept = _cache.get(path)
    if kept is None or kept[0] != stamp:
        kept = _cache[path] = (stamp, _read(path))
    return kept[1]


def recall(wkey: str | None, known: Callable[[str], bool]) -> dict[str, Any] | None:
    """The remembered entry of ``wkey``, if there is a whole one."""
    path = location()
    if wkey is None or path is None:
        return None
    entry = _entries(path).get(wkey)
    return entry if valid(entry, known) else None


def remember(wkey: str | None, entry: dict[str, Any]) -> bool:
    """Merge ``entry`` into the file under ``wkey`` now; False where wisdom is off or
    the file cannot be written (a read-only home: auto works on without it)."""
    path = location()
    if wkey is None or path is None:
        return False
    return _merge(path, {wkey: {**entry, "saved": time.time()}})


def _merge(path: Path, new: dict[str, Any]) -> bool:
    try:
        with _locked(path):
            entries = _read(path)
            for wkey, entry in new.items():
                keep_newest(entries, wkey, entry, ENTRIES)
            _write(path, entries)
    except OSError:
        return False
    return True


class _Writer:
    """Entries auto wants remembered, written by a background thread: a write (a lock,
    a read, a replace) costs about a millisecond, which a batch of light rows must
    not wait for. What is still pending is written at exit, or by :func:`flush`."""

    def __init__(self) -> None:
        self.pending: dict[Path, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.writing = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, path: Path, wkey: str, entry: dict[str, Any]) -> None:
        with self.lock:
            self.pending.setdefault(path, {})[wkey] = {**entry, "saved": time.time()}
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True, name="prep-wisdom")
                self.thread.start()
        self.wake.set()

    def _loop(self) -> None:
        while True:
            self.wake.wait()
            # a moment for more entries to come (a new choice often brings a new
            # figure): one write for them all, and none while a short program's first
            # batches run (the write holds the GIL while it makes its JSON)
            time.sleep(COALESCE)
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        # one flush at a time: the one at exit waits for the thread's write to end
        with self.writing:
            with self.lock:
                pending, self.pending = self.pending, {}
            for path, entries in pending.items():
                _merge(path, entries)


_writer = _Writer()


def remember_later(wkey: str | None, entry: dict[str, Any]) -> None:
    """:func:`remember`, in the background (auto's batches do not wait for the disk)."""
    path = location()
    if wkey is not None and path is not None:
        _writer.add(path, wkey, entry)


def flush() -> None:
    """Write what :func:`remember_later` still holds, now."""
    _writer.flush()


def _forget_writer_in_child() -> None:
    # a forked child (a DataLoader worker) has no writer thread; its entries are its own
    global _writer
    _writer = _Writer()


atexit.register(flush)
os.register_at_fork(after_in_child=_forget_writer_in_child)


def forget() -> int:
    """Clear the wisdom file; the number of remembered choices it held."""
    path = location()
    flush()  # what this interpreter still had to write is forgotten too
    if path is None or not path.exists():
        return 0
    with _locked(path):
        held = len(_read(path))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return held
