"""auto's prediction of a started process pool's batch, on its sample: the
processes' cost model measures itself this way (:class:`Prediction`)."""

from __future__ import annotations

import torch

from ..executors import BLOCK, Executor, threads_per_worker
from ._cost import CostModel, Sampling

#: seconds of serial work below which auto does not even consider worker processes
MIN_PROCESS_WORK = 0.01
#: dispatch cost auto assumes for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005


class Prediction:
    """A started pool's batch predicted on auto's sample, or why processes are left out:
    serial's time shared by the workers (serial is timed again with torch on as many
    intra-op threads as each worker gets: when torch's own threads already spread a
    row over the cores, there is less left to divide), the warm pool's dispatch
    (measured once a pool runs, else ``COLD_DISPATCH``), and the copy of the batch
    and result through shared memory. What starting it costs is measured here too,
    for auto's rent or buy."""

    def __init__(self, sample: Sampling, kind: type[CostModel]) -> None:
        self.s, self.cal, self.name, self.kind = sample, sample.cal, kind.name, kind

    def run(self) -> None:
        s, cal = self.s, self.cal
        if (reason := self._left_out()) is not None:
            cal.dropped[self.name] = reason
            return
        ex = s.executor(self.name)
        cal.bytes_per_row = self._bytes_per_row()
        if (reason := self.kind.unsuitable(ex, s.job, cal.bytes_per_row * s.n)) is not None:
            cal.dropped[self.name] = reason
            return
        self._one_thread(ex)
        start = self.kind.start_cost(ex)
        if start is None:
            cal.start.pop(self.name, None)
        else:
            cal.start[self.name] = start
        if start == 0:  # a warm pool: measure what a batch costs it
            cal.dispatch[self.name] = self.kind.dispatch_cost(ex)
            cal.dispatch_measured = True
        else:  # do not start a pool just to measure it: auto starts it when it pays
            cal.dispatch[self.name] = COLD_DISPATCH

    def _left_out(self) -> str | None:
        s, cal = self.s, self.cal
        if (reason := s.left_out.get(self.name) or self.kind.ruled_out(s.job)) is not None:
            return reason
        if s.cores < 2:
            return "one core or one worker"
        if s.main.left * cal.serial_row < MIN_PROCESS_WORK:
            return (
                f"the rest of the batch takes {s.main.left * cal.serial_row * 1e3:.1f} ms "
                f"serially; worker processes cannot pay off"
            )
        return None

    def _bytes_per_row(self) -> int:
        """What one row costs to send through shared memory: its columns and its result."""
        s = self.s
        out = s.job.sink.output
        result = out.nbytes // max(1, len(out)) if out is not None else 0
        return s.job.rows.nbytes // max(1, s.n) + result

    def _one_thread(self, ex: Executor) -> None:
        """Serial again with torch on as many intra-op threads as each of ``ex``'s
        workers has: when torch's own threads already spread a row over the cores,
        the workers have nothing left to divide."""
        s, cal, main = self.s, self.cal, self.s.main
        intra, share = torch.get_num_threads(), threads_per_worker(ex.workers)
        if intra < 2 or share >= intra or main.left < 8:
            return
        rows = int(min(max(0.02 / max(cal.serial_row, 1e-9), 2), BLOCK, main.left // 8))

        def block() -> float:
            t, start = s.now(), main.done
            main.job.run_range(start, start + rows)
            main.done = start + rows
            return (s.now() - t) / rows

        def measure() -> float:
            per_row = block()
            if per_row > 1.2 * cal.serial_row:  # slower: once more before believing it,
                per_row = min(per_row, block())  # as noise only ever slows a block down
            return per_row

        per_row = self.kind.as_worker(ex, measure)
        cal.one_thread_row = per_row
        cal.serial_cores = min(max(1.0, per_row / cal.serial_row), float(s.cores))


__all__ = ["COLD_DISPATCH", "MIN_PROCESS_WORK", "Prediction"]
