"""Starting an executor that costs a start (a process pool): rent or buy, and
serial's word first.

Which executors auto starts only once that pays is each one's own word
(``CostModel.rent_or_buy``). When the figures say a started one pays
(:meth:`Decisions.plan_start`), it starts before the batch; while what starting
it costs is not known yet (prep's forkserver, which imports torch, has not run in
this interpreter), the executor warms up in the background while the batches go
on. Everything here goes through the executor's cost model (``start_cost``,
``warm_up``, ``prepare``: :mod:`.models`), never an executor's class or name.

Before the workers are used for a function, they must have loaded it; the first
batch they run is then compared, on a few rows, with serial's results here
(:mod:`prep.core.trust`), since another interpreter's ``hash()``, module globals and
RNG can differ from this one's: on a difference the batch runs again in this
process and the executor is dropped. A function that writes into its input rows
is kept in this process, where the write lands as it does under serial.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from ..core.state import setup_seconds
from ..core.trust import Probe, mismatch_reason, writes_input
from ..errors import ExecutorUnavailable
from ..executors import Executor, Job, traits_of
from ._decisions import Decisions
from ._sample import now
from .models import model

#: seconds of CPU prep's forkserver is taken to cost (it imports torch) before it has
#: started once in this interpreter and been measured: 0.7-2.5 s on 2-core machines here.
#: It only decides when to start it while another executor keeps every core busy.
SERVER_PRIOR = 1.5


class Starter:
    """Starts, for auto, what costs a start when it pays, once its rows agree with serial's."""

    def __init__(self, get: Callable[[str], Executor], workers: int, lock: threading.Lock) -> None:
        self._get = get
        self.workers = workers
        self._lock = lock  # the auto executor's: calibrations are shared by its threads

    def plan(self, d: Decisions, job: Job, left_out: Mapping[str, str]) -> None:
        """Start what pays before this batch (rent or buy), but what is ``left_out`` here."""
        for name in d.cal.to_start():
            if name not in left_out:
                self._plan(d, name, job)

    def _plan(self, d: Decisions, name: str, job: Job) -> None:
        cal = d.cal
        ex = self._get(name)
        rows = len(job.rows) - job.start
        cost = model(name)
        start = cost.start_cost(ex)
        # each new worker builds its own state first: setup=, once per worker, counted
        # as the CPU time it takes (a 2 s model on two workers is 4 s to win back)
        processes = traits_of(name).needs_processes
        cal.setup_seconds = setup_seconds(job.fn)
        setup = cal.setup_seconds * self.workers if processes else 0.0
        if start is None:  # not known before it has warmed up: warm it, in the background
            failed = cost.start_failure()
            if failed:
                d.drop(name, f"its workers could not start here ({failed})")
            elif (
                d.plan_warm_up(name, (cost.warm_up_cost() or SERVER_PRIOR) + setup, rows)
                and cost.warm_up()
            ):
                cal.events.append(
                    f"batch {cal.batches + 1}: prep's forkserver starting in the background "
                    f"({name} would save {cal.would_save(name, cal.rows) * 1e3:,.1f} ms "
                    f"a batch); {name} are weighed once it is up"
                )
            return
        cal.start[name] = start + setup
        if not d.plan_start(name, start + setup, rows):
            return
        # rows made in other interpreters are checked against a probe of serial's here
        probe = self.probe_for(d, job) if processes else None
        if probe is not None and (row := probe.writes_input()) is not None:
            with self._lock:
                d.drop(name, writes_input(job.start + row))
            return
        d.probe = (job, probe)  # compared with the workers' rows of this very batch
        try:
            took = cost.prepare(ex, job)
        except ExecutorUnavailable as exc:
            with self._lock:
                d.drop(name, f"{cost.prepare_failed}: {exc}")
            return
        with self._lock:
            cal.start[name] = took
            d.started(name, took)

    def probe_for(self, d: Decisions, job: Job) -> Probe | None:
        """Copies of the first rows ``job`` has left, and serial's results on them here:
        the one taken when the pool started, if it was for this job."""
        held = d.probe
        if held is not None and held[0] is job:
            return held[1]
        t = now(False)
        probe = Probe.take(job.fn, job.rows.window(job.start, len(job.rows)))
        d.cal.check_seconds += now(False) - t
        return probe

    def verify(self, d: Decisions, name: str, job: Job, probe: Probe | None) -> str | None:
        """Serial is the reference: after ``name``'s workers ran ``job``, their rows must
        equal the probe's, computed here; the reason to drop ``name``, or None. Only on a
        difference is the function run here again, to tell a function that is not
        deterministic here either (random augmentation: no single right answer to
        compare with) from one that computes other values in other interpreters."""
        cal = d.cal
        t = now(False)
        try:
            if probe is None:
                return None
            failed = [r - job.start for r in job.sink.failures.rows() if r >= job.start]
            row = probe.disagreement(job.sink.output, failed=failed, at=job.start)
            if row is None:
                return None
            if not probe.deterministic():
                with self._lock:
                    cal.events.append(
                        f"batch {cal.batches + 1}: the function gives other values each time "
                        f"here (random augmentation, say), so its rows in the workers were "
                        f"not compared with serial's"
                    )
                return None
            return mismatch_reason(name, job.start + row)
        finally:
            cal.check_seconds += now(False) - t
            d.probe = None
            d.checked.add(name)


__all__ = ["SERVER_PRIOR", "Starter"]
