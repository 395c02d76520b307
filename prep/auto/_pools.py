"""The pools auto weighs: the thread pool, timed on rows of the batch, and worker
processes, predicted rather than started just to be measured (whether and when
to start them is :meth:`~prep.auto._decisions.Decisions.plan_start`'s call).
Whether processes can take the batch, what starting and dispatching cost them
and how a worker runs torch, the executor itself says (its contract), so no
executor class is named here."""

from __future__ import annotations

import torch

from ..executors import BLOCK, Executor
from ._sample import Sample

#: seconds of serial work below which worker processes are not even considered
MIN_PROCESS_WORK = 0.01
#: dispatch cost assumed for a pool not yet started (a warm one is measured)
COLD_DISPATCH = 0.005


class PoolEstimates:
    """The thread pool measured and a process pool predicted, on one sample."""

    def __init__(self, sample: Sample) -> None:
        self.s = sample

    def measure_threads(self) -> None:
        """The thread pool itself on the next rows: its speed-up over serial, as it runs."""
        s, cal, main = self.s, self.s.cal, self.s.main
        ex = s.get("threads")
        # a new thread's first torch call sets up its own state: warm each one untimed
        main.run(ex, min(s.n, main.done + cal.workers))
        # about 0.1 s of serial work, at least two rows per thread, at most 8 blocks
        rows = int(min(max(0.1 / max(cal.serial_row, 1e-9), 2 * cal.workers), 8 * BLOCK))
        rows = min(rows, max(2 * cal.workers, main.left // 4))  # leave the most
        start, stop = main.done, min(s.n, main.done + rows)
        t = s.now()
        main.run(ex, stop)
        per_row = (s.now() - t) / max(1, stop - start)
        if cal.serial_row > 1.2 * per_row and main.left:
            # threads look faster: serial again, side by side, before believing it
            s.serial_block(min(BLOCK, max(2, rows // 2)))
            cal.serial_row = s.best_serial
        # no pool divides serial time by more than its cores
        cal.thread_speedup = min(s.cores, cal.serial_row / per_row)

    def consider_processes(self) -> None:
        """Predict a started process pool's batch, or say why processes are left out."""
        s, cal = self.s, self.s.cal
        if (reason := self._no_processes()) is not None:
            cal.dropped["processes"] = reason
            return
        ex = s.get("processes")
        cal.bytes_per_row = self._bytes_per_row()
        if (reason := ex.unsuitable(s.job, cal.bytes_per_row * s.n)) is not None:
            cal.dropped["processes"] = reason
            return
        self._one_thread(ex)
        cal.process_start = ex.start_cost()
        if cal.process_start == 0:  # a warm pool: measure what a batch costs it
            cal.process_dispatch = ex.dispatch_cost()
            cal.dispatch_measured = True
        else:  # do not start a pool just to measure it: auto starts it when it pays
            cal.process_dispatch = COLD_DISPATCH

    def _no_processes(self) -> str | None:
        s, cal = self.s, self.s.cal
        left = s.main.left
        if not s.allow_processes:
            return "inside a DataLoader worker (no child processes)"
        if s.cores < 2:
            return "one core or one worker"
        if left * cal.serial_row < MIN_PROCESS_WORK:
            return (
                f"the rest of the batch takes {left * cal.serial_row * 1e3:.1f} ms "
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
        s, cal, main = self.s, self.s.cal, self.s.main
        intra, share = torch.get_num_threads(), ex.worker_threads()
        if intra < 2 or share is None or share >= intra or main.left < 8:
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

        # in a thread of its own: torch's setting is per thread, and the caller's stays
        per_row = ex.as_worker(measure)
        cal.one_thread_row = per_row
        cal.serial_cores = min(max(1.0, per_row / cal.serial_row), float(s.cores))


__all__ = ["COLD_DISPATCH", "MIN_PROCESS_WORK", "PoolEstimates"]
