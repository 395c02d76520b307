"""The parent's side of prep's worker processes: starting one, stopping it, and the
"fn" handshake that has every worker load the row function before a batch."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from ..errors import ExecutorUnavailable, FunctionLoadError, RemoteTraceback
from . import _worker
from ._transport import describe_fn

#: seconds a worker may take to load the row function (importing its modules)
LOAD_TIMEOUT = 120.0


class Worker:
    """The parent's end of one worker process: its pipe, and what it holds."""

    def __init__(self, ctx: Any, threads: int, target: Callable[..., None] = _worker.main) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=target, args=(child, os.getpid(), threads), daemon=True, name="prep-worker"
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
        self.fn_blob: bytes | None = None
        self.keys: set[int] = set()
        self.held: tuple[int, int] | None = None  # the row range it is working on

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

    def how_it_died(self) -> str:
        self.proc.join(1)
        code = self.proc.exitcode
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


def load_everywhere(
    workers: list[Worker], fn: Any, blob: bytes, timeout: float | None, stuck: Callable[[], None]
) -> None:
    """Every worker holds ``fn`` (sent to those that do not); all replies read. Raises
    :class:`~prep.errors.FunctionLoadError` if one cannot load it, after ``stuck()``
    when they did not answer in time."""
    waiting = {}
    for w in workers:
        if w.fn_blob != blob:
            w.fn_blob = None
            w.conn.send(("fn", blob))
            waiting[w.conn] = w
    limit = LOAD_TIMEOUT if timeout is None else max(0.0, timeout)
    end = time.monotonic() + limit
    failure: tuple[str, BaseException | None] | None = None
    while waiting:
        sentinels = {w.proc.sentinel: w for w in waiting.values()}
        ready = connection.wait([*waiting, *sentinels], max(0.0, end - time.monotonic()))
        if not ready:
            stuck()
            raise FunctionLoadError(
                f"executor='processes' workers did not load the row function "
                f"{describe_fn(fn)} within {limit:.1f} s (does importing what it needs "
                f"hang?); check that its modules import quickly in a fresh interpreter, "
                f"or use executor='threads'"
            )
        for r in ready:
            hit = sentinels.get(r) if isinstance(r, int) else waiting.get(r)
            if hit is None or waiting.pop(hit.conn, None) is None:
                continue  # its pipe and its sentinel were both ready: handled once
            why = _load_reply(hit, blob)  # read every reply, the first failure kept
            failure = failure or why
    if failure is not None:
        reason, cause = failure
        raise FunctionLoadError(
            f"executor='processes' could not load the row function {describe_fn(fn)} in "
            f"its worker processes ({reason}). Workers start from a fresh interpreter "
            f"and never run your main script, so what the function needs by name (its "
            f"module, the modules it imports) must be importable there: install it, or "
            f"keep it on sys.path; or use executor='threads'"
        ) from cause


def _load_reply(w: Worker, blob: bytes) -> tuple[str, BaseException | None] | None:
    """None if the worker loaded the function, else why not (and its traceback)."""
    try:
        msg = w.conn.recv() if w.conn.poll() else None
    except (EOFError, OSError):
        msg = None
    if msg is None:
        return f"the worker died with {w.how_it_died()} while loading it", None
    if msg[0] == "loaded":
        w.fn_blob = blob
        return None
    _, _, name, text, tb, _ = msg
    return f"{name}: {text}", RemoteTraceback(tb)
