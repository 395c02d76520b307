"""The manifest of a ``prep run``: one JSON line per finished shard, appended durably.

``manifest.jsonl`` lives in the output folder. The run's driver is its only
writer, and it writes by group commit: the lines of the shards that landed
within a few milliseconds (:meth:`Manifest.add`) are written at once
(:meth:`Manifest.commit`), after their outputs are durable::

    worker: output to a temp file ─fsync─▶ rename        (each shard, where it ran; a
            worker given several shards at once does that while the next computes)
    driver: fsync the outputs' folders ─▶ write the group's lines ─fsync─▶ durable

so a line is never on disk before its output, and a crash loses at most the shards
in flight and the group not yet committed: their outputs may be in place, but
with no line ``--resume`` redoes them, to the same bytes. A crash in the middle
of a commit leaves a torn last line, which :meth:`Manifest.open` cuts off before
appending again.

One entry (schema 1; keys sorted when written)::

    {"schema": 1,
     "input": "sub/a.pt", "input_size": 123, "input_mtime_ns": 1700000000000000000,
     "output": "sub/a.pt", "output_size": 45, "output_sha256": "9f...",
     "rows": 1024, "fn": "prep.ops:side_context_row", "args": {"max_len": 16},
     "columns": null, "prep": "0.1.0", "torch": "2.13.0",
     "seconds": 0.41, "finished": "2025-01-01T12:00:00Z"}

``rows`` is what the output holds and ``input_rows`` what the input held (they
differ under ``--on-row-error skip``); ``executor`` is what ran the shard's rows
(``auto``'s choice, or the one asked for: ``executor_asked``), recorded, not compared.
The row-level options (:class:`~prep.run.RunConfig`) add their fields only when given,
so an entry without them is one made with the defaults; ``--on-row-error
fill``/``skip`` also record the shard's failed rows, every index, and the errors
of the first 100::

     "pad": 0, "pad_to": [16], "on_row_error": "fill", "fill": -1,
     "failed_rows": [3, 17],
     "row_errors": [{"row": 3, "error": "ValueError: bad sample 4"},
                    {"row": 17, "error": "ValueError: bad sample 18"}]

A shard that failed gets a line too, with ``"failed": true``, its one-line ``error``
and its whole ``traceback`` (what the terminal leaves out); :meth:`Manifest.entries`
skips those lines and :meth:`Manifest.failures` returns them::

    {"schema": 1, "input": "b.pt", "failed": true,
     "error": "row 5: ValueError: bad sample; --on-row-error skip ...",
     "traceback": "Traceback (most recent call last): ...", ...}

A shard counts as done (and ``--resume`` skips it) only when its latest entry
matches the input's current size and mtime, the same ``fn``, ``args`` and
``columns`` and row-level options, and the output file's current sha256. A
shard with failed rows is as done as any other: its output is what those
options make. Versions and timings are recorded, not compared: executors agree
bit for bit, so the executor, the worker count and the device are not part of
the match either.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from .save import sha256_file, sync_folders
from .shards import ShardFile

__all__ = ["NAME", "SCHEMA", "Manifest", "recipe_changes"]

NAME = "manifest.jsonl"
SCHEMA = 1
#: the fields that say which computation produced an output (absent: the default)
RECIPE = ("fn", "args", "columns", "pad", "pad_to", "on_row_error", "fill")
#: each recipe field as the flag that sets it, for recipe_changes
_FLAGS = {
    "fn": "--fn", "columns": "--columns", "pad": "--pad", "pad_to": "--pad-to",
    "on_row_error": "--on-row-error", "fill": "--fill", "setup": "--setup",
}  # fmt: skip


def recipe_changes(entry: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[str]:
    """What differs between the recipe an entry was made with and ``recipe``, as flags:
    ``["--arg side: 'left' -> 'right'", "--pad: none -> 0"]``; empty if nothing does."""
    old_args, new_args = entry.get("args") or {}, recipe.get("args") or {}
    changes = [
        (f"--arg {key}", old_args.get(key, _NONE), new_args.get(key, _NONE))
        for key in sorted(set(old_args) | set(new_args))
    ]
    changes += [(flag, entry.get(key), recipe.get(key)) for key, flag in _FLAGS.items()]
    return [f"{flag}: {_said(old)} -> {_said(new)}" for flag, old, new in changes if old != new]


_NONE = object()


def _said(value: Any) -> str:
    return "none" if value is None or value is _NONE else repr(value)


class Manifest:
    """Read and append the manifest of one output folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / NAME
        self._file: IO[str] | None = None
        self.pending: list[Mapping[str, Any]] = []  # added, not yet committed

    def entries(self) -> dict[str, dict[str, Any]]:
        """The latest finished shard's entry per input (later lines win); failures, torn
        and foreign lines are skipped."""
        return {e["input"]: e for e in self._lines() if not e.get("failed")}

    def failures(self) -> dict[str, dict[str, Any]]:
        """The failure per input whose line is the input's latest (not redone since)."""
        latest = {e["input"]: e for e in self._lines()}
        return {k: e for k, e in latest.items() if e.get("failed")}

    def _lines(self) -> list[dict[str, Any]]:
        """Every entry of this schema, in order; a torn last line is skipped."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line from a crash mid-append
            if isinstance(entry, dict) and entry.get("schema") == SCHEMA and "input" in entry:
                found.append(entry)
        return found

    def is_done(
        self, entry: Mapping[str, Any] | None, shard: ShardFile, recipe: Mapping[str, Any]
    ) -> bool:
        """Whether ``entry`` proves that ``shard``'s output under this folder is current."""
        if entry is None or entry.get("failed"):
            return False
        if any(entry.get(k) != recipe.get(k) for k in RECIPE):
            return False
        try:
            st = shard.path.stat()
        except OSError:
            return False
        if (entry.get("input_size"), entry.get("input_mtime_ns")) != (st.st_size, st.st_mtime_ns):
            return False
        output = self.folder / str(entry.get("output", ""))
        try:
            return output.is_file() and sha256_file(output) == entry.get("output_sha256")
        except OSError:
            return False

    def open(self) -> IO[str]:
        """Open for appending, cutting off a torn last line first."""
        if self._file is not None:
            return self._file
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(self.path, "r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held for the run)
        return self._file

    def append(self, entry: Mapping[str, Any]) -> None:
        """Add one entry durably (written, flushed and fsynced before returning)."""
        self.add(entry)
        self.commit()

    def add(self, entry: Mapping[str, Any]) -> None:
        """Hold ``entry`` for the next :meth:`commit` (its output renamed into place)."""
        self.pending.append(entry)

    def commit(self) -> list[Mapping[str, Any]]:
        """Make the held entries durable (:meth:`write`) and return them; on an OSError
        they stay held (none counts as recorded)."""
        group = self.pending
        self.write(group)
        self.pending = []
        return group

    def write(self, group: list[Mapping[str, Any]]) -> None:
        """Make ``group`` durable, outputs first: fsync the folders their outputs were
        renamed into, then write the lines and fsync the manifest once. One writer at a
        time (``prep run``'s commit thread)."""
        if not group:
            return
        sync_folders(self._folders(group))
        f = self._file or self.open()
        try:
            f.write("".join(
                json.dumps(dict(e), sort_keys=True, separators=(",", ":")) + "\n" for e in group
            ))  # fmt: skip
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            # closed, so that the next open cuts off what part of the group was written
            self._file = None
            with contextlib.suppress(OSError):
                f.close()
            raise

    def _folders(self, group: list[Mapping[str, Any]]) -> list[Path]:
        """The folders of the group's outputs, and theirs up to this one (a sub-folder
        made for an output is an entry of its parent)."""
        found: dict[Path, None] = {}
        for entry in group:
            if "output" in entry:
                folder = (self.folder / str(entry["output"])).parent
                while folder != self.folder and self.folder in folder.parents:
                    found[folder] = None
                    folder = folder.parent
        return [*found, self.folder]

    def close(self) -> None:
        """Close the file. It is safe to call this several times."""
        f, self._file = self._file, None
        if f is not None:
            f.close()
