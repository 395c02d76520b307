"""``prep run``: a folder of tensor shards through a row function, durably and resumably.

The pieces, in the order a shard meets them (:mod:`prep.run.jobs` draws the flow)::

    shards.py    find and load (weights_only) shard files
    save.py      save them (temp file, fsync, rename), a call's outputs fsynced together
    manifest.py  manifest.jsonl: a line per finished shard, fsynced a group at a time
    calls.py     --fn and --setup found (a module or a .py path); a row call checked
    config.py    RunConfig: the function, its arguments, the row options; checked up front
    task.py      one shard's work, wherever it runs: load -> map_rows -> save -> entry
    rows.py      what an output holds under the row options: lengths, failed rows recorded
    jobs.py      run_shards: what to do, where it runs, Ctrl-C/SIGTERM handled
    driver.py    shards in flight; results recorded by group commit, a full disk stops it
    plan.py      whole shards on worker processes, or rows spread out: measured, decided
    explain.py   --explain: the plan, threads, jobs and each shard's executor
    local.py     where shards run by default: whole on worker processes, or here by rows
    dask.py      where they run with ``cluster``: a Dask scheduler (prep[dask])
    progress.py  what the person watching sees, and the run's Summary
    failures.py  a failed shard: one line on the terminal, its traceback in the manifest
    temps.py     temporary files: tracked, and removed once their writer is gone
    signals.py   SIGTERM as an exception, and cleanup shielded from a second signal

>>> import tempfile, prep.run
>>> data, out = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> _ = prep.run.make_shards(data, shards=2, rows=8, seq=6, dim=2)
>>> config = prep.run.RunConfig("prep.ops:side_context_row", {"max_len": 3})
>>> prep.run.run_shards([data], out, config).exit_code
0
"""

from __future__ import annotations

from .calls import load_fn
from .config import ROW_ERRORS, RunConfig
from .explain import explain_cluster, explain_first_shard, explain_run
from .jobs import ON_ERROR, run_shards
from .manifest import Manifest
from .plan import PARALLEL, ShardFigures, ShardPlan, decide
from .progress import ShardProgress, Summary
from .save import OutOfSpace, save_shard
from .shards import FORMATS, ShardFile, find_shards, load_shard
from .signals import sigterm_raises
from .synthetic import make_shards
from .task import NoRows, ShardTask, run_shard
from .temps import remove_stale_temps

__all__ = [
    "FORMATS",
    "ON_ERROR",
    "PARALLEL",
    "ROW_ERRORS",
    "Manifest",
    "NoRows",
    "OutOfSpace",
    "RunConfig",
    "ShardFigures",
    "ShardFile",
    "ShardPlan",
    "ShardProgress",
    "ShardTask",
    "Summary",
    "decide",
    "explain_cluster",
    "explain_first_shard",
    "explain_run",
    "find_shards",
    "load_fn",
    "load_shard",
    "make_shards",
    "remove_stale_temps",
    "run_shard",
    "run_shards",
    "save_shard",
    "sigterm_raises",
]
