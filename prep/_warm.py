"""Executors kept warm, and one batch run through one of them.

:class:`Warm` is what a :class:`~prep.Pool` owns: its executors, made from the
registry on first use and kept until it closes. An ``auto`` made there is given
the others, so it measures and runs the pool's own (one process pool, whichever
name asked for it first). :func:`run_batch` is one call's batch through an
executor: the row function checked against the rows, then ``prep._batch.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._batch import run
from ._kept import Kept
from .core.checks import check_fn, check_row_call
from .core.options import Options
from .core.policy import ResultCheck
from .core.rows import Rows
from .core.state import WithState
from .executors import Executor
from .registry import make

__all__ = ["Warm", "run_batch"]


class Warm(Kept[Executor]):
    """The executors of ``workers`` workers each, by name, made on first use (an
    ``auto`` made here is handed :meth:`get`, to measure and run the pool's own)."""

    def __init__(self, workers: int) -> None:
        super().__init__(lambda name: make(name, workers, self.get))
        self.workers = workers


def run_batch(ex: Executor, fn: Callable[..., Any], rows: Rows, options: Options) -> Any:
    """``fn`` over ``rows`` through ``ex``, as ``map_rows`` returns it."""
    check_fn(fn, None, "map_rows", "batch")  # a Pool's calls come here only
    if isinstance(fn, WithState):  # setup=: the function itself, given state= too
        check_row_call(fn.fn, rows, state=True)
    else:
        check_row_call(fn, rows)
    policy = options.policy
    if policy.per_row_errors:  # a bad result (None, another dtype) then fails its row only
        rows = rows.checking(ResultCheck(policy.padding is not None, options.out))
    return run(ex, fn, rows, options)
