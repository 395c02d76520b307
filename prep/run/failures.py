"""A failed shard, said once: one line on the terminal, the whole story in the manifest.

    exception ─▶ line(exc)        "row 5: ValueError: bad sample ...; --on-row-error skip
                                   or fill keeps the shard" (the library's keywords said
                                   as the command line's flags: pad= is --pad VALUE)
              ─▶ short(exc)       the traceback of the first cause, without prep's own
                                   frames where others remain: the row function's lines
              ─▶ entry(task, exc) the manifest line: the error and the full traceback

Only the row function's own exception (a RowError) and a bug get a traceback on the
terminal: any other PrepError is prep's complete verdict on a file, a setting or a
result (the manifest still holds its traceback).
"""

from __future__ import annotations

import datetime
import re
import traceback
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import PrepError, RemoteTraceback, RowError, ShardError
from .manifest import SCHEMA
from .task import ShardTask

__all__ = ["entry", "full", "line", "short", "wants_traceback"]

#: the library's keywords in its messages, and the flags of ``prep run`` that set them
_FLAGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"pass pad=(?: to pad them| for ragged rows)?"),
        "pass --pad VALUE (e.g. --pad 0) to pad them",
    ),
    (re.compile(r"\bpad_to="), "--pad-to "),
    (re.compile(r"\bon_error='(\w+)'"), r"--on-row-error \1"),
    (re.compile(r"\bon_error=(\w+)"), r"--on-row-error \1"),
    (re.compile(r"\bfill=(?=\w|')"), "--fill "),
)
_PREP = str(Path(__file__).resolve().parents[1])
_FRAME = re.compile(r'^  File "([^"]+)", line \d+')


def line(exc: BaseException) -> str:
    """The failure in one line, in the command line's words, with the fix where known."""
    text = str(exc).splitlines()[0] if str(exc).strip() else ""
    what = text if isinstance(exc, (ShardError, RowError)) else f"{type(exc).__name__}: {text}"
    for pattern, flag in _FLAGS:
        what = pattern.sub(flag, what)
    if isinstance(exc, RowError):
        what += "; --on-row-error skip (or fill) keeps the shard without the rows that fail"
    return what


def wants_traceback(exc: BaseException) -> bool:
    """Whether the terminal should show where ``exc`` came from: the row function's own
    exception, or a bug; prep's verdict on a file, a setting or a result says it all."""
    return isinstance(exc, RowError) or not isinstance(exc, PrepError)


def short(exc: BaseException) -> str:
    """The traceback of ``exc``'s first cause (the row function's own exception, or a
    bug's), without prep's frames where other frames remain."""
    root = exc
    while root.__cause__ is not None or (
        root.__context__ is not None and not root.__suppress_context__
    ):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    if isinstance(root, RemoteTraceback):  # a worker's: its text, first section
        text = str(root).strip().strip('"').strip()
        first = text.split("\nThe above exception was the direct cause")[0]
        return _drop_prep_frames(first.strip("\n") + "\n")
    return _drop_prep_frames("".join(traceback.format_exception(root, chain=False)))


def full(exc: BaseException) -> str:
    """The whole traceback, every cause included (for the manifest)."""
    return "".join(traceback.format_exception(exc))


def entry(task: ShardTask, exc: BaseException) -> dict[str, Any]:
    """The manifest line of a failed shard (``--resume`` redoes it)."""
    return {
        "schema": SCHEMA,
        "input": task.source.rel,
        "failed": True,
        "error": line(exc),
        "traceback": full(exc),
        "prep": __version__,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _drop_prep_frames(text: str) -> str:
    """``text`` (a formatted traceback) without the frames of files under prep/, unless
    every frame is one of prep's (a bug in prep: then they are the story)."""
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    frames = dropped = 0
    skipping = False
    for ln in lines:
        m = _FRAME.match(ln)
        if m is not None:
            frames += 1
            skipping = str(Path(m.group(1)).resolve()).startswith(_PREP)
            dropped += skipping
        elif not ln.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(ln)
    return text if frames == dropped else "".join(kept)
