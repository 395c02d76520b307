"""The contract of a cost model: what auto asks of each kind of executor it weighs
(:mod:`.models` has the table), each default fitting one with nothing to start; and
auto's objects as a model sees them (:class:`Sampling`, :class:`Measured`), so that
the models need not import the sample and the figures, which name the models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol

from ..executors import Executor, Job


class Measured(Protocol):
    """What ``auto`` measured on a sample (its :class:`~.calibration.Calibration`), as a
    cost model's :meth:`CostModel.measure` fills it and :meth:`CostModel.estimate` reads it.
    Serial's figures are auto's own (every other one is relative to them); what one
    executor measures of itself is kept under its name, so that auto holds no field
    of any executor: the seconds a row of a batched form, the speed-up of a pool,
    what a batch costs a started executor beyond its rows, and what starting it
    costs here."""

    workers: int
    #: serial's seconds a row, and how many cores' worth torch's own threads made it
    #: faster by (the seconds a row on one worker's share of them: ``one_thread_row``)
    serial_row: float
    serial_cores: float
    one_thread_row: float | None
    #: bytes a row and its result weigh
    bytes_per_row: int
    batched_rows: dict[str, float]
    speedup: dict[str, float]
    dispatch: dict[str, float]
    #: the dispatch costs were measured on a running pool (else they are assumed)
    dispatch_measured: bool
    start: dict[str, float]
    #: why an executor is left out, by its name (``explain`` prints it)
    dropped: dict[str, str]


class RowCursor(Protocol):
    """A job and how many of its rows, from its start, are in its output so far."""

    job: Job
    done: int

    @property
    def left(self) -> int: ...

    def run(self, ex: Executor, stop: int) -> None:
        """Rows ``done:stop`` with ``ex``, into the job's output; ``done`` moves to ``stop``."""


class Sampling(Protocol):
    """A batch under ``auto``'s measurement (its :class:`~._sample.Sample`), as a cost
    model's steps see it (:meth:`CostModel.measure`, and a batched form's
    :meth:`CostModel.first_batch` and :meth:`CostModel.still_agrees`): every row they
    run goes into the output (``main``), so no row of the batch runs twice."""

    job: Job
    n: int
    #: cores the workers may use: ``min(workers, available_cores())``
    cores: int
    #: executors auto may not weigh in this process, each with why (``models.left_out``)
    left_out: Mapping[str, str]
    #: seconds a row of the fastest serial block so far
    best_serial: float

    @property
    def main(self) -> RowCursor:
        """The rows of the job already in its output: a step runs the next ones."""

    @property
    def cal(self) -> Measured:
        """The figures being filled."""

    def now(self) -> float:
        """The time, once a GPU batch's queued kernels have run."""

    def executor(self, name: str) -> Executor:
        """The executor of that name that auto measures and runs (started on first use)."""

    def scratch(self, k: int) -> RowCursor:
        """A cursor over copies of the first ``k`` rows, into an output of its own."""

    def serial(self, budget_rows: int, cursor: RowCursor | None = None) -> None:
        """Serial timed on up to ``budget_rows`` rows of ``cursor`` (``main`` by default)."""

    def serial_block(self, size: int, cursor: RowCursor | None = None) -> float:
        """The next ``size`` rows run serially; the seconds they took."""


class CostModel:
    """What auto knows of one kind of executor; each default fits one with nothing to
    start, that auto does not weigh."""

    name: ClassVar[str] = ""
    #: it spreads the rows over workers of its own: auto wants it predicted clearly
    #: faster (``POOL_MARGIN``) before it takes the cores
    pooled: ClassVar[bool] = False
    #: starting it costs enough that auto predicts it without starting it, and starts
    #: it only once what it would have saved pays for the start (rent or buy)
    rent_or_buy: ClassVar[bool] = False
    #: what ``explain`` says before the reason :meth:`prepare` failed (it is dropped)
    prepare_failed: ClassVar[str] = "its workers could not load the function"

    @classmethod
    def ruled_out(cls, job: Job) -> str | None:
        """Why auto cannot weigh it for ``job`` at all, known before anything is
        measured; None when it may."""
        return None

    @classmethod
    def measure(cls, sample: Sampling) -> None:
        """Measure itself on the next rows of ``sample`` (their results go into the
        output, as for real), keeping its figures in ``sample.cal`` under its name."""

    @classmethod
    def first_batch(cls, sample: Sampling) -> bool:
        """A batched form on a signature's first batch: the whole output in one call,
        checked against serial's rows; False (nothing written) where it cannot."""
        return False

    @classmethod
    def still_agrees(cls, sample: Sampling) -> bool:
        """A batched form on a later batch: whether it still gives serial's rows."""
        return True

    @classmethod
    def estimate(cls, cal: Measured, rows: int, cores: int) -> float | None:
        """Seconds ``rows`` rows would take it once started; None: auto does not weigh it."""
        return None

    @classmethod
    def start_cost(cls, ex: Executor) -> float | None:
        """Seconds starting ``ex`` would take now: 0 when ready, None while not known."""
        return 0.0

    @classmethod
    def warm_up(cls) -> bool:
        """Start in the background what makes :meth:`start_cost` known; True if started."""
        return False

    @classmethod
    def warm_up_cost(cls) -> float | None:
        return None

    @classmethod
    def start_failure(cls) -> str | None:
        """Why its workers could not start here, once that was tried and failed."""
        return None

    @classmethod
    def prepare(cls, ex: Executor, job: Job) -> float:
        """Make ``ex`` ready to run ``job``'s function (workers started and the function
        loaded, or compiled on a few of its rows), within the job's deadline; the
        seconds. :class:`~prep.errors.ExecutorUnavailable` where it cannot."""
        return 0.0


__all__ = ["CostModel", "Measured", "RowCursor", "Sampling"]
