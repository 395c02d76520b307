"""``map_rows``, ``map_samples``, ``explain`` and ``shutdown``: the public face of the
executors. Each call runs through the shared pool of its executor, workers and
``setup=`` (:data:`prep.pool.SHARED`), which keeps them warm between calls;
:class:`prep.Pool` is the one you hold yourself.

Data flows one way (one batch's trip is :func:`prep._batch.run`)::

    batch ──rows_of──▶ Rows ──executor.run──▶ Output (CPU, pinned if bound for CUDA)
                                                  │
                       out= (given) ◀──copy_──────┤ (only when out= lives elsewhere)
                       result ◀──.to(device, non_blocking)──┘
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._explanation import Explanation
from ._fetch import forget_files
from .auto import Calibrator, Sample, left_out
from .core.checks import check_fn
from .core.options import CallOptions, Options
from .core.rows import Rows, rows_of, samples_of
from .core.seeding import Seeding, takes_rng
from .executors import Job, in_worker_process, resolve_workers
from .pool import SHARED
from .registry import AUTO

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AUTO", "explain", "in_worker_process", "map_rows", "map_samples", "shutdown"]


def shutdown() -> None:
    """Close the warm pools that ``map_rows`` keeps between calls (also run at exit),
    and the per-worker states their ``setup=`` made; remove the files a
    :class:`~prep.Loader`'s worker processes read its dataset from (written anew if it
    runs again)."""
    SHARED.close()
    forget_files()


def map_rows(
    fn: Callable[..., Any],
    batch: Any,
    *,
    executor: str = AUTO,
    workers: int | None = None,
    setup: Callable[[], Any] | None = None,
    **options: Unpack[CallOptions],
) -> Any:
    """Run ``fn`` on every row of ``batch`` and stack the results into one output.

    ``batch`` is a Tensor (``fn(row)``), a tuple/list of Tensors with equal dim 0
    (``fn(*row)``) or a dict of Tensors (``fn(**row)``). ``fn`` returns a
    Tensor, a tuple or a dict of Tensors; the result has the same structure with
    a new leading dim of one entry per row, written in place (no list, no
    ``torch.stack``). ``executor`` is one of ``serial``, ``threads``,
    ``processes``, ``joblib``, ``vectorized``, ``vmap`` or ``auto``; ``auto``
    measures ``fn`` on the first rows of the first batch of each signature and
    picks the executor it predicts fastest (see :func:`explain`). Pools stay warm
    between calls (see :func:`shutdown`); ``workers=None`` is one per core.

    The options (:class:`~prep.core.options.Options`): ``out=`` is filled and returned
    instead of allocating; ``device=`` is where the result lands (from pinned
    memory, ``non_blocking``, for CUDA); ``timeout=`` seconds for the batch.
    Ragged rows: with ``pad=`` (a number, or one per result like ``{"ids": 0,
    "mask": False}``) rows may differ in size, each padded at the end of every dim
    to the batch's largest, or to ``pad_to=``; ``return_lengths=True`` also returns
    each row's size. Bad rows: ``on_error="fill"`` fills a failed row with
    ``fill=`` (default: the pad value, else 0), ``"skip"`` leaves it out; either
    warns once; ``return_valid=True`` also returns a bool ``[B]`` mask of the rows
    that succeeded, ``return_errors=True`` a dict of each failed row's
    ``RowError``: ``(out, lengths, valid, errors)``, those asked for, in that
    order. ``progress=True`` shows a bar of rows on a terminal. Results carry no
    autograd history (this is preprocessing).

    Per-worker state: with ``setup=`` (a function of no arguments) each worker
    calls it once, where it runs, and ``fn`` receives the result as ``state=``.

    >>> import torch, prep
    >>> prep.map_rows(lambda r: r.flip(0), torch.arange(6).view(2, 3), executor="threads")
    tensor([[2, 1, 0],
            [5, 4, 3]])
    >>> prep.map_samples(torch.arange, [2, 4, 1], pad=-1, executor="serial")
    tensor([[ 0,  1, -1, -1],
            [ 0,  1,  2,  3],
            [ 0, -1, -1, -1]])
    """
    check_fn(fn, batch, "map_rows", "batch")
    rows = rows_of(batch)
    pool = SHARED.pool(executor, workers, setup)
    return pool.run(fn, rows, Options.of("map_rows", options))


def map_samples(
    fn: Callable[[Any], Any],
    samples: Sequence[Any],
    *,
    executor: str = AUTO,
    workers: int | None = None,
    setup: Callable[[], Any] | None = None,
    **options: Unpack[CallOptions],
) -> Any:
    """Like :func:`map_rows`, over a list of arbitrary samples: ``fn(sample)`` for each."""
    check_fn(fn, samples, "map_samples", "samples")
    rows = samples_of(samples)
    pool = SHARED.pool(executor, workers, setup)
    return pool.run(fn, rows, Options.of("map_samples", options))


def explain(
    fn: Callable[..., Any],
    batch: Any,
    *,
    workers: int | None = None,
    **options: Unpack[CallOptions],
) -> Explanation:
    """Calibrate ``auto`` on ``batch`` and return what it measured, predicted and chose.

    Only the rows calibration needs are computed (all of them where a batched
    twin or vmap runs the rest at once). ``options`` are :func:`map_rows`'s, checked
    as it checks them; those that shape the output (``pad=``, ``pad_to=``,
    ``on_error=``, ``fill=``) change what auto may choose, and the first line shows
    them. The :class:`~prep.Explanation` is the text to print (a
    ``str``), with the calibration behind it: its fields (``predicted``,
    ``choice``, ...) are there for code. ``Pool.explain()`` returns the same type.

    >>> import torch, prep
    >>> why = prep.explain(lambda r: r * 2, torch.ones(64, 3))
    >>> lines = why.splitlines()  # one sentence first, then the figures
    >>> lines[0].startswith(f"{why.choice}: "), lines[1][:14], lines[-1][:9]
    (True, 'auto: 64 rows,', '  choice:')
    """
    rows = batch if isinstance(batch, Rows) else rows_of(batch)
    if len(rows) == 0:
        raise ValueError("the batch has 0 rows: there is nothing to measure")
    n_workers = resolve_workers(workers)
    given = Options.of("explain", options)
    if given.seed is not None:  # what auto may weigh for a seeded function, as map_rows runs it
        rows = rows.seeding(Seeding(given.seed, takes_rng(fn)))
    job = Job.new(fn, rows, policy=given.policy)
    sample = Sample(job, SHARED.executors(n_workers), n_workers, left_out(not in_worker_process()))
    return Explanation([Calibrator(sample).run()])
