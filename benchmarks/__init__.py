"""The repository's benchmarks: which executor wins for which workload, and prep against
the tools people use instead. Not part of the ``prep`` package (nor of its wheel):
``prep bench`` (:mod:`prep.bench`) times a user's own function; this is the rest.

    python -m benchmarks --out bench-out           # every built-in workload (3-4 minutes)
    python -m benchmarks --quick --peers           # a smoke test, against every peer

=================  ============================================================
``harness``        the run: a Grid of workloads x rows x workers x variants
``grid``           the variants by name, and :class:`~benchmarks.grid.Grid`
``workloads``      the built-in workloads (:data:`~benchmarks.workloads.WORKLOADS`)
``libraries``      the real libraries' workloads (PIL, HF tokenizers, numpy, ...)
``baselines``      the loop and plain joblib users write; the question's side-context loop
``peers``          the peer tools' table: ``prep bench --peers``' two and six more
                   (``peer_pools``: concurrent.futures, joblib, mpire; ``peer_loaders``:
                   torchdata)
``results``        the cells, start-up probes and results a run finds
``auto_vs_best``,  what the figures say of auto, and of prep against its peers
``alternatives``
``report``,        results.json, report.md, the terminal table, the prose summary
``summary``,       and the two pictures (the ``bench`` extra's matplotlib)
``plots``
=================  ============================================================

Its modules import nothing from here (this file is only this map), so a worker
process that unpickles a workload's row function imports only its module.
The timing (:func:`prep.bench.interleaved`) and the result checks are
:mod:`prep.bench`'s, shared with ``prep bench``.

>>> from benchmarks.grid import Grid
>>> from benchmarks.harness import run
>>> res = run(Grid(workloads=("noop",), executors=("serial", "loop"), rows=(4,),
...                workers=(1,), repeat=1))
>>> sorted(c.executor for c in res.cells)
['loop', 'serial']
"""
