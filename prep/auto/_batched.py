"""What auto does with a batched form (an executor that makes every row in one call,
``per_row`` False) once the form itself has run on the sample: run it on the rows
left, and tell whether it beat serial by more than the cores could.

Which form a job has, how it is tried on a first batch and checked on a later one,
is the form's own (its cost model's ``ruled_out``, ``first_batch``, ``still_agrees``,
in :mod:`.models`): nothing here knows a form by its name."""

from __future__ import annotations

import math

from ..executors import REGISTRY, Job
from ._cost import CostModel
from ._sample import Sample
from .models import POOLS, model


def batched_form(job: Job) -> type[CostModel] | None:
    """The batched form auto tries on ``job``: the first of the registry's batched
    forms not ruled out for it (a twin the user wrote comes before vmap)."""
    forms = (
        model(name)
        for name, kind in REGISTRY.items()
        if not kind.traits.per_row and model(name).ruled_out(job) is None
    )
    return next(forms, None)


class BatchedForms:
    """A batched form's figures on one sample, after it ran (or as it runs the rest)."""

    def __init__(self, sample: Sample) -> None:
        self.s = sample

    def run_rest(self, name: str) -> None:
        """The batched form on all rows left, in one call: seconds per row (its fixed
        cost per call spread over them; the lower of this batch's and the one before)."""
        s = self.s
        left, t = s.main.left, s.now()
        if left:
            s.main.run(s.executor(name), s.n)
        per_row = (s.now() - t) / left if left else math.inf
        per_row = min(per_row, self.prior_row(name) or math.inf)
        if per_row < math.inf:
            s.cal.batched_rows[name] = per_row
        else:
            s.cal.batched_rows.pop(name, None)

    def prior_row(self, name: str) -> float | None:
        """The batch before's figure of a batched form (seconds a row), if any."""
        return self.s.prior.batched_rows.get(name) if self.s.prior else None

    def won_outright(self, per_row: float | None = None) -> bool:
        """Whether a batched form beats serial by more than the cores could: no pool
        divides serial time by more than its cores, so the pools need no measuring."""
        s, cal = self.s, self.s.cal
        best = per_row or min([x for x in cal.batched_rows.values() if x] + [math.inf])
        if best * s.cores >= cal.serial_row:
            return False
        cal.drop(
            POOLS,
            f"a batched form is over {s.cores}x faster than serial, more than {s.cores} cores give",
        )
        return True


__all__ = ["BatchedForms", "batched_form"]
