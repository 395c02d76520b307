"""One call of the row function's batched twin (see :func:`prep.rowwise`)."""

from __future__ import annotations

from .._rowwise import twin_of
from .._structure import Output, TensorRows, flatten
from ..errors import ConfigError
from ._base import Executor, Job


class VectorizedExecutor(Executor):
    """Calls ``batched(*columns, **kwargs)`` once; the loop runs inside torch."""

    name = "vectorized"
    per_row = False

    def __init__(self, workers: int | None = 1) -> None:
        super().__init__(workers)

    def run(self, job: Job) -> Output:
        twin = twin_of(job.fn)
        if twin is None:
            raise ConfigError(
                f"executor='vectorized' needs a batched twin, and {_name(job.fn)} has none; "
                f"mark it with @prep.rowwise(batched=...) or pick another executor"
            )
        if not isinstance(job.rows, TensorRows):
            raise ConfigError(
                "executor='vectorized' works on a batch of tensors, not on a list "
                "of samples; use map_rows, or another executor"
            )
        # one call, so its exception (and traceback) reaches the caller as it is
        result = job.rows.call_batched(twin)
        spec, leaves = flatten(result, what=f"the batched twin {_name(twin.twin.batched)}")
        n = len(job.rows)
        for leaf in leaves:
            if leaf.dim() == 0 or leaf.shape[0] != n:
                raise ConfigError(
                    f"the batched twin {_name(twin.twin.batched)} returned shape "
                    f"{tuple(leaf.shape)} for a batch of {n} rows; it must keep "
                    f"the rows along dim 0"
                )
        if job.output is None:
            return Output(spec, leaves)
        # out= was given: copy into it, checking each row's shape like the others do
        given = job.output
        for i in range(min(n, 1)):
            given.write(i, spec.unflatten([leaf[i] for leaf in leaves]))
        for buf, leaf in zip(given.buffers, leaves):
            buf.copy_(leaf)
        return given


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
