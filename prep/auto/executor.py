"""``executor="auto"`` as an executor: calibrate once per signature, then run, time, adapt.

    batch ─▶ signature ─▶ kept Calibration? ──no──▶ remembered (wisdom)? ──no──▶ Calibrator
                               │ yes                       │ yes              (first rows,
                               ▼                           ▼                 into the output)
                 rent or buy a process pool ◀──────── figures ◀─────────────────────┘
                 (its rows checked against serial's)
                               │
                  trial (twice) or the choice ─▶ executor.run(job) ─▶ timed ─▶ observe
                               │
                  ExecutorUnavailable ─▶ warn once, drop it, next best (rows not yet run)

Every batch auto runs is timed and kept as that executor's figure, so a
prediction that was wrong (a short calibration slice, a busy machine, a
library that warms up slowly, a remembered figure from another day) is
replaced by what the batches take. A process pool is started only when it pays
(:mod:`._starter`), and used only once its rows equal serial's. Settled
choices are remembered for later interpreters (:mod:`.wisdom`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from .._kept import keep_newest
from .._warn import warn
from ..core.output import Output
from ..errors import ExecutorUnavailable
from ..executors import REGISTRY, Executor, Job, Traits, in_worker_process, traits_of
from ._decisions import Decisions
from ._memory import Memory
from ._sample import Sample, now, on_cuda, run_tolerant
from ._starter import Starter
from .calibration import Calibration, signature
from .calibrator import Calibrator, batched_form
from .models import left_out

__all__ = ["AutoExecutor"]


#: choices kept per signature, for as many batch sizes more than 4x apart
SIZES = 4
#: signatures kept; past this the oldest is forgotten (a loop that makes a new
#: lambda for every batch would otherwise keep them all, and every function)
SIGNATURES = 64


class AutoExecutor(Executor):
    """Per-signature choices; ``run`` calibrates or reuses, then runs and times.

    A signature keeps a few choices, for batch sizes more than 4x apart (a small
    last batch each epoch does not throw away the full batches' choice), and the
    function itself, so that its id is not reused while the choice is kept.

    ``executors`` gives the executor of a name (``map_rows`` shares its warm pools
    this way); by default auto makes its own, from the table of concrete executors
    (:data:`prep.executors.REGISTRY`), and closes them with itself. It reaches them
    through the executor contract alone.
    """

    name = "auto"
    # a stream tries whole batches on threads (no transport: they win where the rows
    # release the GIL) and on processes (the DataLoader's shape, for the rest)
    traits = Traits(stream_workers=("threads", "processes"))

    def __init__(
        self,
        workers: int | None = None,
        executors: Callable[[str], Executor] | None = None,
    ) -> None:
        super().__init__(workers)
        self._own: dict[str, Executor] = {}
        self._get = executors or self._make
        self._choices: dict[Any, tuple[Any, list[Decisions]]] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._starter = Starter(self._get, self.workers, self._lock)
        self._memory = Memory(self.workers, self._lock)

    def _make(self, name: str) -> Executor:
        with self._lock:
            ex = self._own.get(name)
            if ex is None:
                ex = self._own[name] = REGISTRY[name](self.workers)
            return ex

    def close(self) -> None:
        with self._lock:
            own, self._own = self._own, {}
        for ex in own.values():
            ex.close()

    # ------------------------------------------------------------ the cache

    def _kept(self, key: Any, n: int) -> Decisions | None:
        with self._lock:
            _, kept = self._choices.get(key, (None, []))
            return next((d for d in reversed(kept) if d.cal.rows / 4 <= n <= d.cal.rows * 4), None)

    def _keep(self, key: Any, fn: Any, new: Decisions, old: Decisions | None) -> None:
        with self._lock:
            _, kept = self._choices.get(key, (None, []))
            kept = [c for c in kept if c is not old][-(SIZES - 1) :] + [new]
            keep_newest(self._choices, key, (fn, kept), SIGNATURES)

    def choices(self) -> dict[Any, Calibration]:
        """The latest choice of each signature."""
        with self._lock:
            return {key: kept[-1].cal for key, (_, kept) in self._choices.items()}

    # ------------------------------------------------------------ one batch

    def run(self, job: Job) -> Output | None:
        n = len(job.rows)
        left = left_out(processes_allowed=not in_worker_process())  # once a call
        if n == 0:  # nothing to measure: a batched form if one can run no rows (a twin)
            form = batched_form(job)
            return self._get(form.name if form else "serial").run(job)
        key = signature(job.fn, job.rows, job.sink.pin, job.policy)
        d = self._kept(key, n)
        if d is not None and any(p in left for p in d.cal.predicted):
            d = None  # a choice made where processes were allowed: measure again here
        if d is None and (d := self._memory.recall(job, left)) is not None:
            self._keep(key, job.fn, d, None)
        if d is None or not d.cal.settled:
            prior = d
            calibrator = Calibrator(
                Sample(job, self._get, self.workers, left, prior.cal if prior else None)
            )
            calibrator.run()
            d = calibrator.decisions
            d.wisdom_key = prior.wisdom_key if prior else self._memory.key(job)
            self._keep(key, job.fn, d, prior)
            if calibrator.done >= n:
                d.cal.batches += 1
                self._memory.remember(d)
                return job.sink.output  # None: every row failed (on_error='fill'/'skip')
            rest = job.part(calibrator.done)
            job.sink.output = self._plan_and_run(d, rest, left, calibrated=True)
            return job.sink.output
        return self._plan_and_run(d, job, left, calibrated=False)

    def _plan_and_run(
        self, d: Decisions, job: Job, left: Mapping[str, str], calibrated: bool
    ) -> Output | None:
        """Start a pool if it pays, run the batch (the rest of a calibrated one: its
        figure is not a whole batch's), remember the choice, and stop a pool this
        signature dropped if no other may use it."""
        before = set(d.cal.predicted)
        self._starter.plan(d, job, left)
        name = d.cal.choice if calibrated else d.next_trial() or d.cal.choice
        out = self._run(d, name, job, observe=not calibrated)
        self._memory.remember(d)
        for dropped in before - set(d.cal.predicted):
            self._release(dropped)
        return out

    def _release(self, name: str) -> None:
        """Stop ``name``'s workers when no signature kept here may choose it any more
        (a process pool holds a few hundred MB a worker); a later choice starts them."""
        with self._lock:
            if any(name in d.cal.predicted for _, ds in self._choices.values() for d in ds):
                return
        self._get(name).release()

    # ------------------------------------------------------------ running

    def _run(self, d: Decisions, name: str, job: Job, *, observe: bool) -> Output | None:
        """Run the rows left with ``name``, timed; fall back when it cannot run here."""
        cal, start, cuda = d.cal, job.start, on_cuda(job.rows)
        # rows computed in another interpreter are compared with serial's, once
        check = traits_of(name).needs_processes and name not in d.checked
        probe = self._starter.probe_for(d, job) if check else None
        t = now(cuda)
        try:
            out = run_tolerant(self._get(name), job)
        except ExecutorUnavailable as exc:  # raised before any row ran, by its contract
            self._fall_back(d, name, exc)
            return self._run(d, cal.choice, job, observe=observe)
        took = now(cuda) - t
        if check and (reason := self._starter.verify(d, name, job, probe)):
            with self._lock:  # serial is the reference: these rows run again, here
                d.drop(name, reason)
                cal.events.append(
                    f"batch {cal.batches + 1}: {name} dropped: {reason.split('.')[0]}"
                )
            job.sink.failures.forget(start)
            return self._run(d, cal.choice, job, observe=observe)
        with self._lock:
            cal.batches += 1
            if observe:
                d.observe(name, took, len(job.rows) - start)
            else:  # the rest of a calibrated batch: not a whole batch, but it warmed the pool
                d.warming.discard(name)
        return out

    def _fall_back(self, d: Decisions, name: str, exc: ExecutorUnavailable) -> None:
        cal, reason = d.cal, str(exc).split(";")[0]
        with self._lock:
            d.drop(name, f"it failed here: {reason}")
            cal.events.append(
                f"batch {cal.batches + 1}: {name} failed, so {cal.choice} runs instead"
            )
            first = name not in self._warned
            self._warned.add(name)
        if first:
            warn(
                f"executor='auto' chose {name!r}, which cannot run here ({exc}); using "
                f"{cal.choice!r} instead (prep.explain / Pool.explain() say why)"
            )
