"""What crosses between the parent and a worker, by name, as ``concurrent.futures``
names its ``_CallItem`` and ``_ResultItem``: never a tuple read by index.

    parent ──▶ worker                         worker ──▶ parent
    Context(cwd, env)   cwd and environment   Reply(seq, started, ended, outcome)
    Function(key, blob) a row function        outcome: Done(start, stop)     rows written
    Build(seq, key, rows, policy, into)                Chunk(start, stop, output, failed)
    Call(seq, key, args)                               Returned(value)   a call's value
    Load(seq, key)                                     Loaded()          the function is there
    Close()                                            Failure(...)      what went wrong

Threads reply with the same outcomes (their failures carry the live exception). This
module imports nothing but typing, so the workers prep's forkserver preloads load it
at no cost.
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: what a failure is: a row's error, a result that cannot be stored, a function the
#: worker could not load, or a call unit's exception
ERROR, BAD_RESULT, LOAD_ERROR, CALL_ERROR = "error", "bad-result", "load-error", "call-error"


class Function(NamedTuple):
    """A row function's pickled bytes, under the key units name it by."""

    key: str
    blob: bytes


class Build(NamedTuple):
    """Rows to build with the keyed function: written into ``into`` (the batch's shared
    output) where given, else into a chunk of their own."""

    seq: int
    key: str
    rows: Any
    policy: Any
    into: Any


class Call(NamedTuple):
    """The keyed function called once on ``args`` (a ``prep run`` shard)."""

    seq: int
    key: str
    args: tuple[Any, ...]


class Load(NamedTuple):
    """Load the keyed function (if not yet) and say so."""

    seq: int
    key: str


class Close(NamedTuple):
    """Exit once the units before this one are answered."""


class Done(NamedTuple):
    """Rows ``start:stop`` written into the output the unit gave."""

    start: int
    stop: int


class Chunk(NamedTuple):
    """Rows ``start:stop`` in an output of their own (None: every row failed), and the
    failures of the rows that failed alone (``on_error='fill'``/``'skip'``)."""

    start: int
    stop: int
    output: Any
    failed: list[Failure]


class Failure(NamedTuple):
    """What went wrong (``kind``), on which row (-1: none), as the exception's type
    name, text and traceback text, and the pickled exception (or, from a thread of the
    caller's process, the exception itself); ``had_cause``: a call's exception had a
    cause of its own (a verdict such as a ShardError has none to show)."""

    kind: str
    row: int
    name: str
    text: str
    tb: str
    blob: Any
    had_cause: bool = False


class Returned(NamedTuple):
    """A call unit's return value."""

    value: Any


class Loaded(NamedTuple):
    """The worker holds the function."""


class Reply(NamedTuple):
    """A worker's answer to unit ``seq``: when it began and ended it (its clock), and how
    it went."""

    seq: int
    started: float
    ended: float
    outcome: Done | Chunk | Failure | Returned | Loaded


Outcome = Done | Chunk | Failure | Returned | Loaded

__all__ = [
    "BAD_RESULT",
    "CALL_ERROR",
    "ERROR",
    "LOAD_ERROR",
    "Build",
    "Call",
    "Chunk",
    "Close",
    "Done",
    "Failure",
    "Function",
    "Load",
    "Loaded",
    "Outcome",
    "Reply",
    "Returned",
]
