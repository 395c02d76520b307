"""The parent's side of one of prep's worker processes: starting it, stopping it, and
the shared-memory names a killed one left behind."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import select
import signal
from typing import Any

import torch

from ..errors import ExecutorUnavailable
from . import _batch_worker

#: the number of each worker this process starts, in order: a worker's seed is made from it
_numbers = itertools.count()


def worker_seed(number: int) -> int:
    """The seed of this process's worker number ``number``: a digest of torch's default
    generator's state (read, not drawn from, so the caller's next draws stay as they
    were) and the number. Two workers never share one; a caller that seeds torch the
    same way starts its workers from the same seeds again. (A forked worker would
    otherwise keep its parent's generators, and every worker from prep's forkserver
    the server's: the same draws in every worker.)"""
    digest = hashlib.blake2b(torch.random.get_rng_state().numpy().tobytes(), digest_size=8)
    digest.update(number.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") >> 1  # under 2**63: torch's limit


class Worker:
    """The parent's end of one worker process: its pipe, and what it holds."""

    def __init__(self, ctx: Any, threads: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_batch_worker.main,
            args=(child, os.getpid(), threads, worker_seed(next(_numbers))),
            daemon=True,
            name="prep-worker",
        )
        try:
            self.proc.start()
        except (OSError, EOFError, RuntimeError) as exc:
            raise ExecutorUnavailable(
                f"executor='processes' could not start a worker process "
                f"({type(exc).__name__}: {exc}); use executor='threads' or 'joblib'"
            ) from exc
        finally:
            child.close()
        # its pipe and its end, watched by one poll object made once: a selector made
        # for every wait costs more than the reply it waits for
        self._poller = select.poll()
        for fd in (self.conn.fileno(), self.proc.sentinel):
            self._poller.register(fd, select.POLLIN)

    def wait(self, timeout: float | None) -> str | None:
        """Wait up to ``timeout`` seconds (None: for ever) for a reply ("reply", first
        when both are there: a worker that answered and then died has its answer
        read) or the process's end ("ended"); None when neither came."""
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        ready = {fd for fd, _ in self._poller.poll(ms)}
        if self.conn.fileno() in ready:
            return "reply"
        return "ended" if ready else None

    def alive(self) -> bool:
        """``proc.is_alive()``, asked only when its end may have come (its sentinel is
        ready): a live worker costs one poll, not a selector."""
        ended = any(fd == self.proc.sentinel for fd, _ in self._poller.poll(0))
        return not ended or self.proc.is_alive()

    def stop(self, grace: float = 1.0) -> None:
        """Terminate (SIGTERM, then SIGKILL) and reap; no orphans, no zombies, and no
        shared-memory name it left behind."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(grace)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc.join(5)
        self.conn.close()
        if self.proc.exitcode is not None and self.proc.pid is not None:
            unlink_leftovers(self.proc.pid)


def how_it_ended(code: int | None) -> str:
    """A process's exit code in words: "signal SIGKILL", "exit code 1"."""
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def unlink_leftovers(pid: int, shm: str = "/dev/shm") -> list[str]:
    """Remove the shared-memory names the dead process ``pid`` left behind (and say
    which). torch shares a tensor's memory by creating a named segment and
    unlinking the name at once; a worker killed between the two (a timeout, a
    crash, a kill at close) leaves the name, and its memory, there for good. The
    name holds nothing anyone maps: every mapping travels as a descriptor."""
    prefix = f"torch_{pid}_"
    try:
        names = [n for n in os.listdir(shm) if n.startswith(prefix)]
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(shm, name))
    return names
