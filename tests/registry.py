"""The executors every feature suite runs over, and the one list of what an executor may
refuse, and why.

A suite parametrizes over :func:`executors` (every name in ``prep.EXECUTORS``, ``auto``
included, less those that refuse or cannot be tested with what the suite needs): a
new executor joins every suite the day it is registered, and leaving one takes a line
here, with its reason. A test that checks a refusal itself asks :func:`refusals` for
the error's type and the words that name the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import prep

#: every executor a user can name, ``auto`` included
EVERY: tuple[str, ...] = tuple(sorted(prep.EXECUTORS))

# What a case may need, as the suites name it.
NO_TWIN = "a row function without a batched twin"
READS_VALUES = "a row function that reads values (int(row[0]), .item(), an if on data)"
SAMPLES = "map_samples (a list of samples, not a batch of tensors)"
PAD = "pad= (ragged rows) with a twin that takes no pad="
PER_ROW_ERRORS = "on_error='fill' or 'skip' (a failed row that does not fail the batch)"
STATE = "setup= (per-worker state given to the row function as state=)"
CRASH = "a row that kills its process (a segfault, os._exit, SIGKILL)"
HANG = "a row that never returns, under timeout="
PROCESSES = "worker processes of its own (pids other than the caller's)"
WHOLE = "a stream's strategy='whole' (workers to give whole batches to)"
PARTS = "a stream's strategy='split' with several batches in flight (parts on its workers)"
TORCH_DRAWS = "a row function that draws from torch's default generator (torch.rand)"
GLOBAL_DRAWS = "a row function that draws from Python's random or numpy's global generator"
FOLLOWS = "a row function that reads the environment or the directory, changed between batches"


@dataclass(frozen=True)
class Refusal:
    """``executor`` refuses a case that needs ``need`` with ``error`` whose text holds
    ``words``; ``why`` is the reason a user would be given."""

    executor: str
    need: str
    error: type[BaseException]
    words: str
    why: str


#: Every refusal an executor may give, and why: an executor not listed for a need
#: must run the case and give what a plain loop gives.
REFUSALS: tuple[Refusal, ...] = (
    Refusal("vectorized", NO_TWIN, prep.ConfigError, "needs a batched twin",
            "it runs the batched twin, in one call: there is nothing else to run"),
    Refusal("vectorized", SAMPLES, prep.ConfigError, "not on a list of samples",
            "a twin takes a batch of tensors"),
    Refusal("vectorized", PAD, prep.ConfigError, "cannot pad",
            "only a twin that takes pad= can pad its rows"),
    Refusal("vectorized", PER_ROW_ERRORS, prep.ConfigError, "needs a per-row executor",
            "one call makes every row, so a failing row fails it"),
    Refusal("serial", WHOLE, prep.ConfigError, "has no workers to give them to",
            "it has no workers"),
    Refusal("vectorized", WHOLE, prep.ConfigError, "has no workers to give them to",
            "one call, no workers"),
    Refusal("vmap", WHOLE, prep.ConfigError, "has no workers to give them to",
            "one call, no workers"),
    Refusal("vmap", READS_VALUES, prep.VmapUnsupported, "cannot run",
            "vmap traces the function: it has no values to read"),
    Refusal("vmap", TORCH_DRAWS, prep.VmapUnsupported, "random operation",
            "torch.func.vmap refuses a random op in its default randomness mode"),
    Refusal("vmap", GLOBAL_DRAWS, prep.VmapUnsupported, "every row would get the same numbers",
            "vmap calls the function once for every row: one draw for all of them"),
    Refusal("vmap", SAMPLES, prep.ConfigError, "not on a list of samples",
            "vmap maps over a batch of tensors"),
    Refusal("vmap", PAD, prep.ConfigError, "cannot return ragged rows",
            "every row of a vmap has one shape"),
    Refusal("vmap", PER_ROW_ERRORS, prep.ConfigError, "needs a per-row executor",
            "one call makes every row, so a failing row fails it"),
)  # fmt: skip
#: compiled is vmap's form, compiled: it refuses what vmap refuses, for vmap's reasons
REFUSALS += tuple(replace(r, executor="compiled") for r in REFUSALS if r.executor == "vmap")

#: What an executor does not refuse but cannot be tested with, and why: the case
#: would end or hang the test process, or the executor has no processes to show.
CANNOT: dict[str, dict[str, str]] = {
    CRASH: {
        "serial": "rows run in the caller's process: the crash ends the caller, as a loop's would",
        "threads": "rows run in the caller's process: the crash ends the caller",
        "vectorized": "one call in the caller's process",
        "vmap": "one call in the caller's process",
        "compiled": "one call in the caller's process",
        # auto measures its first rows in the caller's process: tested in a child
        # process of its own (tests/test_faults.py), not in the table of crashes
        "auto": "measures the first rows in the caller's process (tested in a child)",
    },
    HANG: {
        "serial": "checks timeout= before each row: a row that never returns is not interrupted",
        "vectorized": "one call, checked before it (docs/errors.md)",
        "vmap": "one call, checked before it (docs/errors.md)",
        "compiled": "one call, checked before it (docs/errors.md)",
        "auto": "measures the first rows of a function's first batch in the caller's thread, "
        "which timeout= cannot interrupt (a documented limit: docs/errors.md)",
    },
    PARTS: {
        "serial": "no workers: one batch at a time",
        "joblib": "one batch at a time through it (docs/api.md, Pool.imap)",
        "vectorized": "one call a batch",
        "vmap": "one call a batch",
        "compiled": "one call a batch",
        "auto": "one batch at a time through auto under split (docs/api.md, Pool.imap)",
    },
    FOLLOWS: {
        # a documented limit (docs/api.md, executor="compiled"): dynamo keeps the graph it
        # traced of the row function's code, and guards neither os.environ nor os.getcwd()
        "compiled": "what the function reads of them is fixed at its compile, as torch.compile "
        "fixes it",
    },
    PROCESSES: {
        "serial": "runs in the caller's process",
        "threads": "runs in the caller's process",
        "vectorized": "runs in the caller's process",
        "vmap": "runs in the caller's process",
        "compiled": "runs in the caller's process",
        "auto": "runs wherever its choice runs",
    },
}

#: every need a suite may name (STATE: no executor refuses setup= itself)
_NEEDS = {NO_TWIN, READS_VALUES, SAMPLES, PAD, PER_ROW_ERRORS, STATE, CRASH, HANG, PROCESSES,
          WHOLE, PARTS, TORCH_DRAWS, GLOBAL_DRAWS, FOLLOWS}  # fmt: skip


def refusals(executor: str, *needs: str) -> list[Refusal]:
    """The refusals ``executor`` may give a case that needs each of ``needs``."""
    unknown = set(needs) - _NEEDS
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not needs this module lists")
    return [r for r in REFUSALS if r.executor == executor and r.need in needs]


def refuses(executor: str, *needs: str) -> bool:
    return bool(refusals(executor, *needs))


def executors(*needs: str) -> list[str]:
    """Every executor that runs a case needing ``needs`` (none refuses, none cannot)."""
    unknown = set(needs) - _NEEDS
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not needs this module lists")
    return [
        name
        for name in EVERY
        if not refuses(name, *needs) and not any(name in CANNOT.get(n, {}) for n in needs)
    ]


def without(*needs: str) -> list[str]:
    """The executors that refuse or cannot run ``needs``: a suite tests what they do."""
    keep = set(executors(*needs))
    return [name for name in EVERY if name not in keep]
