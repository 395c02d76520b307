"""``executor="auto"``: measure the row function on the batch, predict, choose, explain.

On the first call for a signature (the function and its bound arguments, the
batch's structure, per-row shapes, dtypes and device), ``auto`` calibrates on
rows of the batch itself, writing their results into the output as it goes:
every row of the batch is computed once. The only extra runs (serial's
timing rows beside a batched form, the vmap checks) work on copies of rows,
so a function that changes its row in place changes the batch once (a failed
vmap try costs those few rows once more):

1. serial: blocks of 1, 2, 4 ... rows (8, 16, 32 for light rows), run as the
   serial executor runs them; the fastest block of two or more rows gives the
   seconds per row (noise only ever slows a block down);
2. a batched form, if there is one, makes the whole output of the first batch
   in one call. A twin runs while serial is timed on copies of a few rows.
   Without a twin, ``torch.func.vmap`` of the row function is tried: a call
   on a copy of one row rules out functions vmap cannot run (``.item()``,
   data-dependent shapes), serial is timed on copies of a few rows, vmap runs
   the whole batch, and its first rows must equal serial's bit for bit (it is
   dropped on any error or mismatch, and not tried when the whole batch
   takes under 0.3 ms serially; an op without a batching rule makes vmap
   loop, which its timing shows). If
   the batched form beats serial by more than the cores could, it has won: no
   pool divides serial time by more than its cores. If not, the next batch
   measures the pools (3-4) and runs its rest with the batched form again;
3. the thread pool, warmed up on a few rows, then timed on the next ones
   (about 0.1 s of work) -> its speed-up over serial, which shows how much of
   the function runs outside the GIL (when threads look faster, serial is
   timed again right after; the speed-up is capped at the cores);
4. processes: predicted from serial time / workers (serial is timed again
   with torch on as many intra-op threads as each worker gets: when torch's
   own threads already spread a row over the cores, there is less left to
   divide), plus the warm pool's dispatch cost (measured once per pool, on a
   no-op), and the cost of copying the batch and result through shared
   memory. The prediction is for a started pool; whether and when to start
   one (its start-up measured here) is :meth:`Decisions.plan_start`'s call.
   Left out inside DataLoader workers, on one core, for functions that cannot
   be pickled, for CUDA batches, and for less than 10 ms of work.

The sample and serial's timing are in :mod:`._sample`; the steps 2-4 are each
executor's own, beside it
(``CostModel.first_batch`` and ``still_agrees`` for a batched form,
``CostModel.measure`` for the rest), so this module runs them in order, over the
registry, and names none. What a whole batch would take is each executor's own
estimate from these figures (``CostModel.estimate``: the formulas above).
No pool is measured for a batch under 2 ms of serial work. What the calibrator
finds is a prediction; :class:`~prep.auto.AutoExecutor` then times
every batch it runs and lets the measured figures decide.
"""

from __future__ import annotations

import math

from ..executors import REGISTRY, Job
from ._cost import CostModel
from ._decisions import Decisions
from ._forms import SEEDED
from ._sample import Sample
from .calibration import Calibration
from .models import BATCHED, POOLS, model

#: seconds of serial work for a whole batch below which no pool is measured: a thread
#: pool's dispatch costs a few tenths of a millisecond
MIN_POOL_WORK = 2e-3


def batched_form(job: Job) -> type[CostModel] | None:
    """The batched form auto tries on ``job``: the first of the registry's batched
    forms not ruled out for it (a twin the user wrote comes before vmap). Which form
    a job has, how it is tried on a first batch and checked on a later one, is the
    form's own (its cost model's ``ruled_out``, ``first_batch``, ``still_agrees``, in
    :mod:`.models`): nothing here knows a form by its name."""
    forms = (
        model(name)
        for name, kind in REGISTRY.items()
        if not kind.traits.per_row and model(name).ruled_out(job) is None
    )
    return next(forms, None)


class Calibrator:
    """Runs the measurements on one job, writing the results of every row it runs;
    ``done`` is how many rows of the job are in its output when :meth:`run` returns.

    It measures a :class:`Sample` (the job, the executors by name, and the
    signature's unsettled calibration from the batch before, if any: its batched
    form's figure is kept, and this batch measures the pools), through the
    executors' own steps. :meth:`run` returns
    the report; ``decisions`` goes on choosing from it.
    """

    def __init__(self, sample: Sample) -> None:
        self.sample = sample
        self.cal = self.sample.cal
        self.decisions = Decisions(self.cal)

    @property
    def done(self) -> int:
        return self.sample.main.done

    def run(self) -> Calibration:
        s, cal = self.sample, self.cal
        t0 = s.now()
        tensors = s.job.rows.batched and self._batched_forms_allowed()
        form = batched_form(s.job) if tensors else None
        if s.prior is None and form is not None and form.first_batch(s):
            # first batch: a batched form made the whole output in one call
            if not self._won_outright() and not self._too_light_for_pools():
                cal.settled = False
                cal.drop(POOLS, f"measured on the next batch, with {form.name}")
            return self._finish(t0)
        # no batched form, or the batch after one that did not win outright (whose
        # figure it kept): a form that failed or gave other rows is not used again
        batched = form if form and self._prior_row(form.name) is not None else None
        s.serial(budget_rows=max(4, min(32, s.n // 8)))
        if not s.job.rows.batched:
            cal.dropped["vectorized"] = "a list of samples has no batched form"
        elif batched is not None and not batched.still_agrees(s):
            batched = None
        if batched and self._won_outright(self._prior_row(batched.name)):
            self._run_rest(batched.name)
            return self._finish(t0)
        if not self._too_light_for_pools():
            for name in REGISTRY:  # each measures itself (the pools do)
                model(name).measure(s)
        if batched and s.main.left:
            self._run_rest(batched.name)
        return self._finish(t0)

    def _run_rest(self, name: str) -> None:
        """The batched form on all rows left, in one call: seconds per row (its fixed
        cost per call spread over them; the lower of this batch's and the one before)."""
        s = self.sample
        left, t = s.main.left, s.now()
        if left:
            s.main.run(s.executor(name), s.n)
        per_row = (s.now() - t) / left if left else math.inf
        per_row = min(per_row, self._prior_row(name) or math.inf)
        if per_row < math.inf:
            self.cal.batched_rows[name] = per_row
        else:
            self.cal.batched_rows.pop(name, None)

    def _prior_row(self, name: str) -> float | None:
        """The batch before's figure of a batched form (seconds a row), if any."""
        prior = self.sample.prior
        return prior.batched_rows.get(name) if prior else None

    def _won_outright(self, per_row: float | None = None) -> bool:
        """Whether a batched form beats serial by more than the cores could: no pool
        divides serial time by more than its cores, so the pools need no measuring."""
        cal, cores = self.cal, self.sample.cores
        best = per_row or min([x for x in cal.batched_rows.values() if x] + [math.inf])
        if best * cores >= cal.serial_row:
            return False
        cal.drop(
            POOLS,
            f"a batched form is over {cores}x faster than serial, more than {cores} cores give",
        )
        return True

    def _batched_forms_allowed(self) -> bool:
        if self.sample.job.rows.seeds is not None:
            self.cal.drop(BATCHED, SEEDED)
            return False
        if self.sample.job.policy.padding is None:
            return True
        self.cal.drop(
            BATCHED,
            "with pad=, rows are padded one by one (vmap cannot return ragged rows, and a "
            "twin's padded batch says nothing of each row's length)",
        )
        return False

    def _too_light_for_pools(self) -> bool:
        work = self.sample.n * self.cal.serial_row
        if work >= MIN_POOL_WORK:
            return False
        self.cal.drop(
            POOLS,
            f"the batch takes {work * 1e3:.2f} ms serially: about what a pool's dispatch costs",
        )
        return True

    def _finish(self, t0: float) -> Calibration:
        # predicted for a whole batch of this size: the choice is kept for the next ones
        # each executor's cost model estimates its own batch (CostModel.estimate)
        s, cal = self.sample, self.cal
        for name in REGISTRY:
            if (seconds := model(name).estimate(cal, s.n, s.cores)) is not None:
                cal.predicted[name] = seconds
        cal.choice = self.decisions.best()
        cal.sample = self.done
        cal.seconds = s.now() - t0
        return cal


__all__ = ["MIN_POOL_WORK", "Calibrator", "batched_form"]
