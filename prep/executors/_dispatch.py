"""One batch through the worker processes: row ranges out, replies in.

Rows go out as ranges, a few per worker, so fast workers take up the slack;
the parent waits on every busy worker's pipe and every worker's sentinel at
once, under the batch's deadline. A reply is "done", a row's error (the other
ranges in flight still come back, so the lowest row's error is the one
raised, as serial would), or, for a batch whose output is not allocated yet,
row 0's result, from which the output is allocated in shared memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from multiprocessing import connection
from typing import Any, NoReturn

import torch

from .._output import flatten
from ..errors import WorkerCrashed
from . import _worker
from ._base import Job, first_error, iter_chunks
from ._chunks import ChunkMerge
from ._handles import Worker
from ._isolation import Isolation
from ._transport import check_shm


class Dispatch:
    """``replace(worker)`` starts a worker in a dead one's place (its slot in
    ``workers``), the function loaded: under ``on_error='fill'``/``'skip'`` a worker
    that dies does not fail the batch (:mod:`._isolation`)."""

    def __init__(
        self, workers: list[Worker], job: Job, replace: Callable[[Worker], Worker] | None = None
    ) -> None:
        self.workers = workers
        self.job = job
        self.replace = replace
        self.pending: deque[tuple[int, int]] = deque()
        self.isolation = Isolation(job)
        self.chunks = ChunkMerge(job)
        # rows that may differ in size or fail on their own come back as chunks, each
        # in shared memory of its worker's (the parent merges them); others are
        # written in place, into the one output every worker maps
        self.chunked = not job.policy.plain

    def run(self, shell: Any, keys: list[int], columns: dict[int, torch.Tensor]) -> None:
        """The batch's rows, every one written into ``job.sink.output``, or the lowest row's
        error once the ranges in flight are back; raises on a crash or the deadline."""
        job, n = self.job, len(self.job.rows)
        self.batch = (shell, keys, columns)
        for w in self.workers:
            self._send_batch(w)
        pending = self.pending
        if job.sink.output is None and not self.chunked:  # row 0's result fixes the output
            self._send(self.workers[0], 0, 1, probe=True)
            self._collect(stop_on_error=True)
            for w in self.workers:
                w.conn.send(("output", job.sink.output))
            pending.extend(iter_chunks(n, len(self.workers), first=1))
        else:
            pending.extend(iter_chunks(n, len(self.workers), first=job.start))
        errors: list[BaseException] = []
        while True:
            for w in self.workers:
                if pending and w.held is None and not errors:
                    self._send(w, *pending.popleft())
            if not any(w.held for w in self.workers):
                break  # all done, or stopped after an error with nothing left in flight
            errors.extend(self._collect())
        if errors:
            raise first_error(errors)

    def _send_batch(self, w: Worker) -> None:
        shell, keys, columns = self.batch
        w.held = None
        new = {k: columns[k] for k in keys if k not in w.keys}
        w.conn.send(("batch", shell, keys, new, None if self.chunked else self.job.sink.output))
        w.keys = set(keys)

    def _send(self, w: Worker, start: int, stop: int, probe: bool = False) -> None:
        w.held = (start, stop)
        payload = self.job.rows.chunk(start, stop)
        if self.chunked:
            w.conn.send(("chunk", start, stop, payload, self.job.policy))
        else:
            w.conn.send(("run", start, stop, payload, probe))

    def _collect(self, stop_on_error: bool = False) -> list[BaseException]:
        """Wait for the next replies; returns row errors, raises on crash or timeout."""
        job = self.job
        busy = [w for w in self.workers if w.held]
        by_conn = {w.conn: w for w in busy}
        by_sentinel = {w.proc.sentinel: w for w in self.workers}
        left = job.remaining()
        ready = connection.wait(
            [*by_conn, *by_sentinel], timeout=None if left is None else max(left, 0)
        )
        if not ready:
            held = ", ".join(
                f"{w.held[0]}-{w.held[1] - 1} (pid {w.proc.pid})" for w in busy if w.held
            )
            raise job.timed_out(
                f"workers still busy with rows {held} were terminated and will be replaced"
            )
        errors = []
        dead: dict[int, Worker] = {}
        for r in ready:
            w = by_conn.get(r)
            if w is None:
                continue
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                dead[id(w)] = w
                continue
            errors.extend(self._handle(w, msg))
        for r in ready:
            if r in by_sentinel:
                dead[id(by_sentinel[r])] = by_sentinel[r]
        for w in dead.values():
            self._lost(w)
        if errors and stop_on_error:
            raise errors[0]
        return errors

    def _handle(self, w: Worker, msg: tuple[Any, ...]) -> list[BaseException]:
        job, tag = self.job, msg[0]
        if tag == "done":
            job.sink.advance(msg[2] - msg[1])
            w.held = None
            return []
        if tag == "chunk":
            w.held = None
            self.chunks.merge(msg)
            job.sink.advance(msg[2] - msg[1])
            return []
        if tag == "probe":
            w.held = None
            job.sink.advance(1)
            leaves = flatten(msg[2])[1]
            check_shm(len(job.rows) * sum(t.nbytes for t in leaves), "the output")
            job.sink.store(msg[1], msg[2], shared=True)
            return []
        row = msg[1]
        if w.held is not None and not (w.held[0] <= row < w.held[1]):
            return []
        w.held = None
        return [_worker.error_from_reply(msg)]

    def _lost(self, w: Worker) -> None:
        """A worker died: the batch fails, or (fill/skip) its rows are isolated."""
        if self.replace is None or not self.job.policy.per_row_errors:
            self._crashed(w)
        held, how, pid = w.held, w.how_it_died(), w.proc.pid
        fresh = self.replace(w)
        self._send_batch(fresh)
        if held is not None:  # its rows next, each alone
            again = self.isolation.lost(held, f"worker pid {pid}", how)
            self.pending.extendleft(reversed(again))

    def _crashed(self, w: Worker) -> NoReturn:
        how = w.how_it_died()
        rows = f"while it held rows {w.held[0]}-{w.held[1] - 1}" if w.held else "while idle"
        raise WorkerCrashed(
            f"worker pid {w.proc.pid} died with {how} {rows}; likely causes: a segfault or "
            f"abort in the row function (or a library it calls), or the OS killed the worker "
            f"for memory (see dmesg). The pool starts new workers on the next call",
            pid=w.proc.pid,
            exitcode=w.proc.exitcode,
            rows=w.held,
        )
