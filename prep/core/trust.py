"""Serial is the reference: checks that another way of running a row function gives
serial's rows, and that the function leaves its input alone.

Three things can make an executor return other values than serial, with no error:

* its rows run in **another interpreter** (``processes``, ``joblib``), which differs
  from this one in ``hash()`` of str and bytes (salted per interpreter), in module
  globals set at run time (a function sent by name is imported afresh there), and
  in the state of ``random`` and numpy's global generator;
* a **batched twin** (``@prep.rowwise(batched=...)``) that does not compute what its
  row function computes;
* a row function that **writes into its input row**: serial and threads change the
  caller's batch, worker processes change their copy.

A :class:`Probe` holds pristine copies of a few rows of the first batch, and what
the row function made of them here. It answers each question on those rows only,
so a check costs a few rows once per function: :meth:`Probe.writes_input`,
:meth:`Probe.deterministic` (the same row computed twice here is equal; a
function that is not, random augmentation say, has no single right answer to
compare with) and :meth:`Probe.disagreement` (the rows another executor made, or
a batched form's, against serial's). ``auto`` drops what disagrees
(:mod:`prep.auto`); an executor the user named explicitly warns once
(:func:`check_named`).
"""

from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._kept import keep_newest
from .._warn import warn
from .generators import States
from .generators import kept as generators_kept
from .identity import key
from .output import Output, Spec, flatten
from .padding import corner
from .rows import Rows, SampleRows, TensorRows
from .state import WithState

#: rows a probe keeps: a few rows once per function (a first batch has tens or more)
ROWS = 2

Leaves = tuple[Spec, list[Tensor]]


def causes(executor: str) -> str:
    """Why ``executor``'s rows can differ from serial's, and the fixes: one text for
    ``explain()`` and for the warning of an executor named explicitly."""
    return (
        f"{executor} runs rows in other Python interpreters, which differ from this one in "
        f"hash() of str and bytes (salted per interpreter), in module globals your program "
        f"set at run time (a function sent by name is imported afresh there) and in the "
        f"state of random and numpy's global generator. Fix: set PYTHONHASHSEED before "
        f"Python starts (or hash with zlib.crc32), build such state in setup=, or pass "
        f"values as arguments instead of reading globals"
    )


def _pristine(rows: Rows, stop: int) -> Rows | None:
    """Rows ``0:stop`` as copies of their own, numbered from 0 (None where a sample cannot
    be copied); under seed=, each draws as the batch's row it copies."""
    seeds = rows.seeds.shifted(rows.offset) if rows.seeds is not None else None
    if isinstance(rows, TensorRows):
        return rows.take(0, stop).seeding(seeds)
    if isinstance(rows, SampleRows):
        try:
            return SampleRows([copy.deepcopy(s) for s in rows.samples[:stop]], seeds=seeds)
        except Exception:  # a sample holding a lock, a file, a C object
            return None
    return None


def same(a: Any, b: Any, atol: float = 0.0) -> bool:
    """Whether two values are equal: tensors in shape, dtype and every element (NaN
    equal to NaN; within ``atol`` when given), containers leaf by leaf."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_meta:
            return True  # no values to compare
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=0.0, atol=atol, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y, atol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], atol) for k in a)
    try:
        return bool(a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    except Exception:  # an == that raises or returns an array: not comparable
        return False


def row_of(output: Output, i: int, spec: Spec, leaves: list[Tensor]) -> list[Tensor] | None:
    """Row ``i`` of ``output`` in the shapes of ``leaves`` (a padded row is cut back
    to its own size), or None where the structure differs."""
    if output.spec != spec or len(output.buffers) != len(leaves):
        return None
    row = []
    for buf, leaf in zip(output.buffers, leaves):
        r = buf[i - output.offset]
        if r.dim() != leaf.dim() or any(s > t for s, t in zip(leaf.shape, r.shape)):
            return None
        row.append(corner(r, leaf.shape))
    return row


@dataclass
class Probe:
    """Pristine copies of a batch's first rows and the row function's results on them
    here (``None`` for a row whose call raised): what the checks compare against."""

    fn: Callable[..., Any]
    rows: Rows
    results: list[Leaves | None]
    #: the rows as they were after the call (for :meth:`writes_input`)
    after: Rows | None = None
    #: where the first results left the random generators: a second run draws on from there
    drawn: States | None = None
    _deterministic: bool | None = field(default=None, repr=False)

    @classmethod
    def take(cls, fn: Callable[..., Any], rows: Rows, skip: Collection[int] = ()) -> Probe | None:
        """Copy the first :data:`ROWS` rows and run ``fn`` on another copy of each, here;
        rows in ``skip`` are not run (rows that failed elsewhere: one that killed its
        worker process must never run in this one)."""
        k = min(ROWS, len(rows))
        pristine, work = _pristine(rows, k), _pristine(rows, k)
        if pristine is None or work is None or k == 0:
            return None
        with generators_kept() as drawn:  # the caller's draws are not the probe's to move
            results = [None if i in skip else _call(fn, work, i) for i in range(k)]
        return cls(fn, pristine, results, work, drawn.end)

    def writes_input(self) -> int | None:
        """The first row the function changed in its input, or None."""
        if self.after is None:
            return None
        for i in range(len(self.rows)):
            if not same(_row_input(self.rows, i), _row_input(self.after, i)):
                return i
        return None

    def deterministic(self) -> bool:
        """Whether the rows computed again here, on fresh copies in this thread, equal
        the first results (those whose first call did not fail; computed once)."""
        if self._deterministic is None:
            work = _pristine(self.rows, len(self.rows))
            assert work is not None, "rows copied once copy again"
            with generators_kept(self.drawn):
                again = [
                    None if first is None else _call(self.fn, work, i)
                    for i, first in enumerate(self.results)
                ]
            self._deterministic = all(
                a is None or b is None or _same_leaves(a, b) for a, b in zip(self.results, again)
            )
        return self._deterministic

    def disagreement(
        self,
        output: Output | None,
        atol: float = 0.0,
        failed: Collection[int] = (),
        at: int = 0,
    ) -> int | None:
        """The first probe row where ``output`` (the same rows, made another way, from
        its row ``at`` on) differs from serial's result here; None where all agree or
        it cannot be told. Probe rows in ``failed`` (failed rows, filled) are skipped."""
        if output is None:
            return None
        for i, ref in enumerate(self.results):
            if ref is None or i in failed:
                continue
            row = row_of(output, at + i, *ref)
            if row is None or not all(same(x, y, atol) for x, y in zip(row, ref[1])):
                return i
        return None


def _call(fn: Callable[..., Any], rows: Rows, i: int) -> Leaves | None:
    try:
        spec, leaves = flatten(rows.window(i, i + 1).call(fn, i))
    except Exception:  # a failing row is the executors' business, not the probe's
        return None
    return spec, [leaf.detach().clone() for leaf in leaves]


def _row_input(rows: Rows, i: int) -> Any:
    if isinstance(rows, TensorRows):
        return [c[i] for c in rows.columns]
    if isinstance(rows, SampleRows):
        return rows.samples[i]
    return None


def _same_leaves(a: Leaves, b: Leaves, atol: float = 0.0) -> bool:
    return a[0] == b[0] and all(same(x, y, atol) for x, y in zip(a[1], b[1]))


# ---------------------------------------------------------------- named executors

# executors named by the user are checked once per function: the functions checked,
# per executor object (an executor lives as long as its pool)
_checked: weakref.WeakKeyDictionary[Any, dict[Any, Callable[..., Any]]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()
#: entries remembered per executor (two a function: its identity and its id); past
#: this the oldest are checked again
KEEP = 128


def first_time(executor: Any, fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (by identity) is new to ``executor`` (any object that lives as long
    as what it checks): a check made once per function and executor."""
    # by _identity.key: a fresh partial or lambda of the same code and values each
    # batch is the function already checked
    with _lock:
        seen = _checked.setdefault(executor, {})
        if seen.get(id(fn)) is fn:
            return False  # the very object: no identity to work out on every batch
    made = key(fn)
    with _lock:
        first = made not in seen
        keep_newest(seen, made, fn, KEEP)
        keep_newest(seen, id(fn), fn, KEEP)
        return first


def forget(executor: Any, fn: Callable[..., Any]) -> None:
    """``fn`` is new to ``executor`` again (its check found something: check it again)."""
    with _lock:
        seen = _checked.get(executor, {})
        seen.pop(id(fn), None)
        seen.pop(key(fn), None)


def check_named(
    executor: Any,
    fn: Callable[..., Any],
    rows: Rows,
    output: Output | None,
    *,
    other_interpreter: bool,
    twin: Any = None,
    failed: Collection[int] = (),
) -> str | None:
    """For an executor the user named: on the first batch of each function, compare a
    few of its rows with serial's here; warn once on a mismatch (and return the
    warning's text). ``twin`` is the batched twin ``vectorized`` called; ``failed``
    the rows that failed (filled). A function given ``state=`` by ``setup=`` is not
    checked: its state would have to be built here, in the caller, just for that."""
    if output is None or len(rows) == 0 or not (other_interpreter or twin is not None):
        return None
    if isinstance(fn, WithState) or not first_time(executor, fn):
        return None
    probe = Probe.take(fn, rows, skip=failed)
    if probe is None or not probe.deterministic():
        return None
    atol = float(getattr(getattr(twin, "twin", None), "atol", 0.0) or 0.0)
    row = probe.disagreement(output, atol, failed)
    if row is None:
        return None
    name = getattr(executor, "name", type(executor).__name__)
    fname = getattr(fn, "__qualname__", repr(fn))
    if twin is not None:
        text = (
            f"executor='vectorized': the batched twin of {fname} gives row {row} other "
            f"values than {fname} itself (serial is the reference); fix the twin, or "
            f"declare the difference you accept with @prep.rowwise(batched=..., atol=...)"
        )
    else:
        text = (
            f"executor={name!r} computed row {row} of {fname} differently from serial "
            f"in this process. {causes(name)}"
        )
    warn(text)  # at the user's line, on every path (imap's thread included)
    return text


def writes_input(row: int) -> str:
    """What ``explain()`` says of processes for a function that writes into its rows."""
    return (
        f"the function writes into its input rows (row {row} changed): serial and threads "
        f"change your batch as they run, worker processes would change copies and leave "
        f"it as it was, so auto keeps to executors that run in this process"
    )


def mismatch_reason(executor: str, row: int) -> str:
    """What ``explain()`` says of an executor dropped for computing other rows."""
    return f"its workers computed row {row} differently from serial here. " + causes(executor)


__all__ = [
    "ROWS",
    "Probe",
    "causes",
    "check_named",
    "first_time",
    "forget",
    "mismatch_reason",
    "writes_input",
    "row_of",
    "same",
]
