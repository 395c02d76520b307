"""Every exception prep raises on purpose, in one tree.

    PrepError
    ├── ConfigError      a setting that cannot work (bad executor name, workers < 1,
    │   │                CUDA asked for where torch has none, CUDA tensors sent to
    │   │                processes, ...)
    │   ├── ExecutorUnavailable   the executor cannot run this job here: its workers
    │   │   │                     cannot start, or /dev/shm has no room
    │   │   └── FunctionLoadError a worker could not load the row function
    │   ├── SetupError   ``setup=`` raised (never a row error, never filled)
    │   ├── VmapUnsupported  ``executor="vmap"`` cannot run this row function (``.item()``,
    │   │                data-dependent shapes, ...); the message says why and what to use
    │   └── UsageError   command-line arguments that cannot work together (exit 2)
    ├── RowError         the row function raised; ``.row`` is the row's index and
    │                    ``__cause__`` carries the original exception or traceback
    ├── StackError       two rows returned results of different shape or dtype
    ├── WorkerCrashed    a worker process died (signal, OOM killer, segfault)
    ├── BatchTimeout     the batch did not finish within ``timeout`` seconds
    ├── ShardError       a saved shard could not be read or is not what was expected
    │   ├── OutOfSpace   an output could not be written: the disk is full, over quota
    │   │                or read-only (no shard's fault: the run starts no other)
    │   └── NoRows       a shard of 0 rows, and no done shard shows its output's layout
    ├── ClusterLost      the Dask scheduler of ``prep run --cluster`` went away mid-run
    └── Cancelled        ``prep run`` was abandoned while this shard was in flight

    Terminated (a KeyboardInterrupt, not a PrepError: it must pass ``except
    Exception``): SIGTERM, raised in the main thread the way Ctrl-C is

Bad arguments that are not about configuration (a wrong shape, a wrong type)
raise the built-in ``ValueError`` / ``TypeError``, as torch does.
"""

from __future__ import annotations

__all__ = [
    "BatchTimeout",
    "Cancelled",
    "ClusterLost",
    "ConfigError",
    "ExecutorUnavailable",
    "FunctionLoadError",
    "NoRows",
    "OutOfSpace",
    "PrepError",
    "RemoteTraceback",
    "RowError",
    "SetupError",
    "ShardError",
    "StackError",
    "Terminated",
    "UsageError",
    "VmapUnsupported",
    "WorkerCrashed",
]


class PrepError(Exception):
    """Base class of every error prep raises on purpose."""


class ConfigError(PrepError, ValueError):
    """A setting that cannot work; the message names the value and the fix."""


class ExecutorUnavailable(ConfigError):
    """The chosen executor cannot run this job here (not the row function's fault).

    ``auto`` falls back to its next best executor on this error, with a warning.
    """


class SetupError(ConfigError):
    """``setup=`` raised where a worker called it: not a row's fault, so never a
    :class:`RowError` (nor a filled row); ``__cause__`` is its exception."""


class VmapUnsupported(ConfigError):
    """``torch.func.vmap`` cannot run this row function, though the function itself runs
    on a row: it reads values (``.item()``, ``int(row[0])``, a branch on data), makes a
    shape that depends on them, or calls an op vmap has no rule for. ``__cause__`` is
    torch's own error; the message names the function, torch's reason and the
    executors that can run it. Not an :class:`ExecutorUnavailable`: ``auto`` never
    picks vmap without checking it first, so this is raised where vmap was asked for.
    """


class FunctionLoadError(ExecutorUnavailable):
    """A worker process could not load the row function sent to it.

    ``__cause__`` carries the worker's traceback. The message names the function,
    the reason and what to do (usually: make the modules it needs importable in a
    fresh interpreter, or use ``executor="threads"``).
    """


class RowError(PrepError):
    """The row function raised on row ``row``.

    The original exception (or, from a worker process, its traceback text
    wrapped in :class:`RemoteTraceback`) is attached as ``__cause__``.
    """

    def __init__(self, row: int, message: str) -> None:
        super().__init__(message)
        self.row = row

    def __reduce__(self):  # keep ``row`` when pickled across processes
        return (type(self), (self.row, str(self)))


class StackError(PrepError, ValueError):
    """Rows returned results that cannot be written into one output; ``.row`` is the
    row that did not fit (None where no one row is to blame)."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


class WorkerCrashed(PrepError):
    """A worker process died while it held rows of the batch.

    The pool that owned it rebuilds itself on the next call.
    """

    def __init__(
        self,
        message: str,
        *,
        pid: int | None = None,
        exitcode: int | None = None,
        rows: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode
        self.rows = rows

    def __reduce__(self):
        return (_rebuild_crash, (str(self), self.pid, self.exitcode, self.rows))


def _rebuild_crash(message, pid, exitcode, rows):
    return WorkerCrashed(message, pid=pid, exitcode=exitcode, rows=rows)


class BatchTimeout(PrepError, TimeoutError):
    """The batch took longer than its ``timeout``; stuck workers were replaced."""


class ShardError(PrepError):
    """A shard file is truncated, not a dict of tensors, or lacks a column."""


class OutOfSpace(ShardError):
    """An output could not be written: its disk is full, over quota or read-only. No
    shard's fault: the run starts no other shard, and ``--resume`` finishes it."""


class NoRows(ShardError):
    """A shard of 0 rows, and no shard done yet whose output's layout it can take."""


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process.

    Used as ``__cause__`` of :class:`RowError` so the worker's stack shows up
    in the parent's traceback, the way ``concurrent.futures`` does it.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


# ---- the shard pipeline (prep run)


class UsageError(ConfigError):
    """Command-line arguments that parse but cannot work together (``--arg k=1 --arg k=2``).

    ``prep``'s command line reports it like argparse's own errors, with exit code 2.
    """


class ClusterLost(PrepError):
    """The Dask scheduler of ``prep run --cluster`` went away in the middle of the run:
    the run ends (exit code 1) and the shards in flight are left for ``--resume``."""


class Cancelled(PrepError):
    """The run was abandoned (Ctrl-C, SIGTERM) while this shard was in flight."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread the way Ctrl-C raises ``KeyboardInterrupt``.

    Not a :class:`PrepError`: like Ctrl-C it must pass ``except Exception``.
    """
