"""The driver of ``prep run``: shards in flight, results recorded by group commit.

    submit up to `slots` tasks ──▶ backend ──▶ done queue ──▶ land each result:
        an entry     held for the group (its output renamed into place, not yet durable)
        a failure    one line now; its manifest line held for the group
        0 rows       held back until a shard done shows the output's layout
        disk full    one line; no shard starts after it (queued ones are not started)
    commit the group when GROUP entries are held, GROUP_SECONDS after its first landed,
    or when nothing is in flight: folders fsynced, lines written, one fsync
    (:meth:`prep.run.manifest.Manifest.commit`); a shard counts as done, and its
    progress line is printed, only then.

So each shard pays its own output's fsync, in the worker that wrote it, and a share
of one manifest fsync; a crash loses the shards in flight and the group not yet
committed, which ``--resume`` redoes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import queue
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import Cancelled, ClusterLost, ConfigError, RowError
from . import failures
from .manifest import Manifest
from .progress import ShardProgress, Summary
from .shards import OutOfSpace
from .task import Layout, NoRows, ShardTask, halt_workers

__all__ = ["GROUP", "GROUP_SECONDS", "Backend", "Driver"]

#: a group commit holds at most this many entries ...
GROUP = 64
#: ... or those that landed within this many seconds of its first
GROUP_SECONDS = 0.005
_POLL = 0.25  # seconds between checks of the done queue: a timeout lets signals in
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class Backend(Protocol):
    """Where tasks run: ``slots`` at a time; each finished one lands on the done queue."""

    slots: int

    def submit(self, task: ShardTask, done: queue.SimpleQueue[Any]) -> None: ...

    def abandon(self) -> None: ...

    def close(self) -> None: ...


class Driver:
    """Runs ``todo`` on ``backend`` and records each shard in ``manifest`` (see the module
    docstring); ``layouts``: the output layouts of shards already done, by input."""

    def __init__(
        self,
        backend: Backend,
        todo: deque[ShardTask],
        manifest: Manifest,
        on_error: str,
        progress: ShardProgress,
        summary: Summary,
        layouts: dict[str, Any],
    ) -> None:
        self.backend, self.todo, self.manifest = backend, todo, manifest
        self.on_error, self.progress, self.summary = on_error, progress, summary
        self.layouts = layouts
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.in_flight = 0
        self.stopping = False
        self.held: list[tuple[ShardTask, NoRows]] = []  # 0-row shards, waiting for a layout
        self.lost = 0  # not finished: the disk was full, or never started after that
        self.since = 0.0  # when the group's first entry landed

    def run(self) -> None:
        """Keep ``backend.slots`` tasks in flight; record each result as it lands."""
        while True:
            while self.todo and self.in_flight < self.backend.slots and not self.stopping:
                self.backend.submit(self.todo.popleft(), self.done)
                self.in_flight += 1
                self.summary.abandoned = self.in_flight
            if self.in_flight == 0:
                self.commit()
                if self._release_held():
                    continue
                break
            try:
                task, outcome = self.done.get(timeout=self._wait())
            except queue.Empty:
                self._commit_if_due()
                continue
            self.in_flight -= 1
            self.summary.abandoned = self.in_flight
            self._land(task, outcome)
            self._commit_if_due()
        self.summary.not_started = len(self.todo) + len(self.held) + self.lost

    def _wait(self) -> float:
        if not self.manifest.pending:
            return _POLL
        return min(_POLL, max(0.0, self.since + GROUP_SECONDS - time.monotonic()))

    def _land(self, task: ShardTask, outcome: Any) -> None:
        if isinstance(outcome, ClusterLost):  # no shard's fault: the run ends here
            self.summary.abandoned += 1  # this shard too: it never finished, --resume redoes it
            raise outcome
        if isinstance(outcome, OutOfSpace):  # the disk's fault, not the shard's
            self.lost += 1
            self._halt(str(outcome))
        elif isinstance(outcome, Cancelled) and self.stopping:  # queued, not started
            self.lost += 1
        elif isinstance(outcome, NoRows):
            layout = self._layout()
            if layout is None:
                self.held.append((task, outcome))
            else:
                self.todo.appendleft(dataclasses.replace(task, layout=layout))
        elif isinstance(outcome, BaseException):
            self._hold(self._failure(task, outcome))
            # a setting that cannot work (the function cannot be called on these
            # columns) fails every shard alike: stop whatever --on-error says
            self.stopping |= self.on_error == "stop" or isinstance(outcome, ConfigError)
        else:
            self._hold(outcome)
            if "layout" in outcome:
                self.layouts[task.source.rel] = outcome["layout"]

    def _hold(self, entry: Mapping[str, Any]) -> None:
        if not self.manifest.pending:
            self.since = time.monotonic()
        self.manifest.add(entry)

    def _commit_if_due(self) -> None:
        pending = self.manifest.pending
        if pending and (
            len(pending) >= GROUP
            or self.in_flight == 0
            or time.monotonic() - self.since >= GROUP_SECONDS
        ):
            self.commit()

    def commit(self) -> None:
        """Commit the group held; count and show its shards as done only then."""
        try:
            group = self.manifest.commit()
        except OSError as exc:
            if exc.errno not in _FULL:
                raise
            unrecorded = sum(not e.get("failed") for e in self.manifest.pending)
            self.lost += unrecorded
            self.manifest.pending = []
            self._halt(
                f"{self.manifest.path}: cannot be written: {exc.strerror} ({unrecorded} "
                f"shard(s) done but not recorded); free space, then rerun with --resume"
            )
            return
        s = self.summary
        for entry in group:
            if entry.get("failed"):
                continue
            s.done += 1
            s.rows += entry["rows"]
            s.bytes_read += entry["input_size"]
            if entry.get("failed_rows"):
                s.rows_failed += len(entry["failed_rows"])
                s.shards_with_failed_rows += 1
            self.progress.done(dict(entry))

    def commit_held(self) -> None:
        """On the way out of an interrupted run: commit what landed, if the disk lets it."""
        with contextlib.suppress(OSError):
            self.commit()

    def _halt(self, line: str) -> None:
        """The disk is full: say it once, and start no other shard (nor any queued)."""
        self.stopping = True
        halt_workers()
        if self.summary.halted is None:
            self.summary.halted = line
            self.progress.halt(line)

    def _layout(self) -> Layout | None:
        """The layout of the first shard done, by name (so that reruns agree), if any."""
        if not self.layouts:
            return None
        found = self.layouts[min(self.layouts)]
        return {k: (dtype, tuple(shape)) for k, (dtype, shape) in found.items()}

    def _release_held(self) -> bool:
        """Once nothing is in flight: the 0-row shards again with a layout (True), or each
        failed with its one line where no shard was done to show one."""
        held, self.held = self.held, []
        if not held or self.stopping:
            self.held = held
            return False
        layout = self._layout()
        if layout is not None:
            self.todo.extend(dataclasses.replace(t, layout=layout) for t, _ in held)
            return True
        for task, exc in held:
            self._hold(self._failure(task, exc))
            self.stopping |= self.on_error == "stop"
        self.commit()
        return False

    def _failure(self, task: ShardTask, exc: BaseException) -> dict[str, Any]:
        """One line for the terminal; the whole traceback in the summary, and the
        manifest line returned (a bug, in prep or the function, must leave a trace of
        where it happened)."""
        s = self.summary
        error = failures.line(exc)
        s.failed.append((task.source.rel, error))
        s.tracebacks[task.source.rel] = failures.full(exc)
        first = not s.traceback or task.source.rel < s.traceback_of
        if first and failures.wants_traceback(exc):
            # the terminal shows one: the failed shard first by name (a folder's order),
            # whichever finished first, so that a rerun shows the same one
            s.traceback = failures.short(exc)
            s.traceback_of = task.source.rel
        s.row_failures += isinstance(exc, RowError)
        with contextlib.suppress(OSError):  # it was read before it failed, or tried
            s.bytes_read += task.source.path.stat().st_size
        self.progress.failed(task.source.rel, error)
        return failures.entry(task, exc)
