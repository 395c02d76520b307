"""The driver of ``prep run``: shards in flight, results recorded by group commit.

    submit up to `slots` tasks, `per_call` at a time ──▶ backend ──▶ done queue ──▶
    land each result:
        an entry     held for the group (its output renamed into place, not yet durable)
        a failure    one line now; its manifest line held for the group
        0 rows       held back until a shard done shows the output's layout
        disk full    one line; no shard starts after it (queued ones are not started)
        Alone        its call's worker died: sent again, one a call
    commit what is held whenever no commit runs, in a thread of its own while shards
    stay in flight: folders fsynced, lines written, one fsync
    (:meth:`prep.run.manifest.Manifest.write`); what lands meanwhile is the next group.
    A shard counts as done, and its progress line is printed, once its group is.

So each shard pays its own output's fsync, in the worker that wrote it, and a share
of one manifest fsync, which no shard waits for: the slower the disk, the larger the
groups. A crash loses the shards in flight and the groups not yet committed, which
``--resume`` redoes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import queue
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

from ..errors import Cancelled, ClusterLost, ConfigError, RowError
from . import failures
from .manifest import Manifest
from .progress import ShardProgress, Summary
from .save import OutOfSpace
from .task import Layout, NoRows, ShardTask, halt_workers

__all__ = ["Backend", "Committer", "Driver"]

_POLL = 0.25  # seconds between checks of the done queue: a timeout lets signals in
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class Backend(Protocol):
    """Where tasks run: ``slots`` at a time, sent ``per_call`` at once; each finished one
    lands on the done queue as ``(task, outcome)``."""

    slots: int
    per_call: int

    def submit(self, tasks: list[ShardTask], done: queue.SimpleQueue[Any]) -> None: ...

    def abandon(self) -> None: ...

    def close(self) -> None: ...


class Alone(NamedTuple):
    """A task's outcome when the call it was sent in failed as a whole (its worker died
    on one of the call's shards): the driver sends it again, alone."""

    error: BaseException


class Committer:
    """One group commit at a time, in a thread of its own (``prep-commit``), so that the
    driver keeps shards in flight while the disk syncs; ``landed`` is put on the done
    queue when a commit ends, to wake the driver."""

    LANDED = "committed"

    def __init__(self, manifest: Manifest, done: queue.SimpleQueue[Any]) -> None:
        self.manifest, self.done = manifest, done
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="prep-commit")
        self._running: Future[None] | None = None
        self._group: list[Mapping[str, Any]] = []

    def busy(self) -> bool:
        return self._running is not None

    def landed(self) -> bool:
        """Whether the commit started last has ended (a wake left by one that
        :meth:`finish` already waited for is not this one's)."""
        return self._running is not None and self._running.done()

    def start(self) -> None:
        """The entries held, as a group, to the commit thread."""
        self._group, self.manifest.pending = self.manifest.pending, []
        self._running = self._thread.submit(self.manifest.write, self._group)
        self._running.add_done_callback(lambda _: self.done.put(self.LANDED))

    def finish(self) -> list[Mapping[str, Any]]:
        """The group of the commit started last, once it is durable (waiting for it); its
        OSError raised, the group then unrecorded (:attr:`unrecorded`)."""
        running, self._running = self._running, None
        if running is None:
            return []
        running.result()
        return self._group

    def requeue(self) -> None:
        """The group of a commit that failed held again, before what landed since."""
        self.manifest.pending, self._group = self._group + self.manifest.pending, []

    def unrecorded(self) -> int:
        """Shards done but not recorded, of a group that failed and of those held."""
        lost = [e for e in self._group + self.manifest.pending if not e.get("failed")]
        self._group, self.manifest.pending = [], []
        return len(lost)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


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
        # the manifest found the disk full while shards were in flight: no shard starts and
        # nothing is committed until they land (their temporary files gone), then retried
        self.paused = False
        self.held: list[tuple[ShardTask, NoRows]] = []  # 0-row shards, waiting for a layout
        self.alone: deque[ShardTask] = deque()  # to send again, each in a call of its own
        self.lost = 0  # not finished: the disk was full, or never started after that
        self.committer = Committer(manifest, self.done)

    def run(self) -> None:
        """Keep ``backend.slots`` tasks in flight; record each result as it lands."""
        while True:
            while not (self.stopping or self.paused) and (tasks := self._next()):
                self.backend.submit(tasks, self.done)
                self.in_flight += len(tasks)
                self.summary.abandoned = self.in_flight
            if self.in_flight == 0:
                retry, self.paused = self.paused, False
                self.commit()
                if (
                    retry and (self.todo or self.alone) and not self.stopping
                ) or self._release_held():
                    continue
                break
            try:
                item = self.done.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item == Committer.LANDED:
                if self.committer.landed():  # not the wake of one already waited for
                    self._committed()
            else:
                self.in_flight -= 1
                self.summary.abandoned = self.in_flight
                self._land(*item)
            if self.manifest.pending and not self.committer.busy() and not self.paused:
                self.committer.start()
        self.summary.not_started = len(self.todo) + len(self.alone) + len(self.held) + self.lost

    def _next(self) -> list[ShardTask]:
        """The tasks of the next call, if there is room for them: one sent again alone,
        or ``per_call`` (fewer at the end), once that many slots are free."""
        free = self.backend.slots - self.in_flight
        if self.alone and free >= 1:
            return [self.alone.popleft()]
        n = min(self.backend.per_call, len(self.todo))
        if not n or free < n:
            return []
        return [self.todo.popleft() for _ in range(n)]

    def _land(self, task: ShardTask, outcome: Any) -> None:
        if isinstance(outcome, ClusterLost):  # no shard's fault: the run ends here
            self.summary.abandoned += 1  # this shard too: it never finished, --resume redoes it
            raise outcome
        if isinstance(outcome, Alone):
            self.alone.append(task)
        elif isinstance(outcome, OutOfSpace):  # the disk's fault, not the shard's
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
            self.manifest.add(self._failure(task, outcome))
            # a setting that cannot work (the function cannot be called on these
            # columns) fails every shard alike: stop whatever --on-error says
            self.stopping |= self.on_error == "stop" or isinstance(outcome, ConfigError)
        else:
            self.manifest.add(outcome)
            if "layout" in outcome:
                self.layouts[task.source.rel] = outcome["layout"]

    def commit(self) -> None:
        """Commit what is held, after the commit running (if any), and wait for both."""
        if self._committed() and self.manifest.pending:
            self.committer.start()
            self._committed()

    def _committed(self) -> bool:
        """The running commit's shards counted and shown as done, once it is durable;
        False if the disk refused it (said once, the run stops)."""
        try:
            group = self.committer.finish()
        except OSError as exc:
            if exc.errno not in _FULL:
                raise
            if self.in_flight and not self.paused:  # a shard's temporary file may hold the
                self.committer.requeue()  # last free pages: again once they have landed
                self.paused = True
                return False
            unrecorded = self.committer.unrecorded()
            self.lost += unrecorded
            self._halt(
                f"{self.manifest.path}: cannot be written: {exc.strerror} ({unrecorded} "
                f"shard(s) done but not recorded); free space, then rerun with --resume"
            )
            return False
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
        return True

    def commit_held(self) -> None:
        """On the way out of an interrupted run: commit what landed, if the disk lets it."""
        with contextlib.suppress(OSError):
            self.commit()

    def close(self) -> None:
        """End the commit thread, after the commit it runs (if any); close the manifest."""
        self.committer.close()
        self.manifest.close()

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
        if not self.held or self.stopping:
            return False
        held, self.held = self.held, []
        layout = self._layout()
        if layout is not None:
            self.todo.extend(dataclasses.replace(t, layout=layout) for t, _ in held)
            return True
        for task, exc in held:
            self.manifest.add(self._failure(task, exc))
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
