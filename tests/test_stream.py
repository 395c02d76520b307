"""Streams of batches (prep.stream.stream.Stream, behind ``Pool.imap``): order, overlap, bounds,
errors and stopping, checked by events and counters, never by how fast this machine is.

Every test runs real pools; ``call`` is what ``Pool.imap`` passes, ``pool.map_rows``
of one batch. No test may leave a ``prep-imap`` thread behind.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import traceback
import weakref
from collections.abc import Iterator

import pytest
import torch

import prep
from prep.stream.delivery import Delivery
from prep.stream.stream import THREAD_NAME, Stream, close_open
from tests import refs, rowfns
from tests.conftest import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


class Source:
    """Batches 0..n-1 (batch k is full of k), counting how many were pulled and how far
    the pulls ran ahead of the consumer's ``asked`` (which the consumer counts)."""

    def __init__(self, n: int, *, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.pulled = self.asked = self.most_ahead = 0

    def __iter__(self) -> Source:
        return self

    def __next__(self) -> torch.Tensor:
        if self.pulled == self.n:
            raise StopIteration
        k = self.pulled
        self.pulled += 1
        self.most_ahead = max(self.most_ahead, self.pulled - self.asked)
        if k == self.fail_at:
            raise LookupError(f"batch {k} cannot be read")
        return torch.full((4, 3), float(k))


def index(batch: torch.Tensor) -> int:
    return int(batch[0, 0])


# The stream's own machinery (its thread, prefetch, the source's errors, stopping) does
# not depend on the executor; it must stay two in-process executors: these tests' row
# functions and sources are local (closures, events) and cannot travel to processes.
# The executors themselves are run through streams in test_stream_whole.py (every way
# the registry gives) and test_stream_parts.py.
@pytest.fixture(params=["serial", "threads"])
def pool(request: pytest.FixtureRequest) -> Iterator[prep.Pool]:
    with prep.Pool(request.param, workers=2) as p:
        yield p


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert wait_until(lambda: not producers()), f"threads left: {producers()}"


# ------------------------------------------------------------------ results


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [0, 1, 2, 5])
def test_results_come_in_order_and_equal_a_loop(pool, prefetch):
    call = lambda b: pool.map_rows(rowfns.affine, b)
    outs = list(Stream(call, Source(7), prefetch))
    expected = [torch.stack([rowfns.affine(row) for row in b]) for b in Source(7)]  # a loop's
    assert len(outs) == 7
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@pytest.mark.timeout(60)
def test_options_pass_through_the_call(pool):
    samples = [[torch.tensor(3), torch.tensor(1)], [torch.tensor(2)], [torch.tensor(4)]]
    call = lambda s: pool.map_samples(torch.arange, s, pad=-1, return_lengths=True)
    for (out, lengths), s in zip(Stream(call, samples, prefetch=2), samples):
        want, want_lengths = refs.loop(torch.arange, s, pad=-1, return_lengths=True)
        assert torch.equal(out, want) and torch.equal(lengths, want_lengths)


@pytest.mark.timeout(60)
def test_processes_pool(no_leaks):
    with prep.Pool("processes", workers=2) as pool:
        call = lambda b: pool.map_rows(rowfns.affine, b)
        outs = list(Stream(call, Source(4), prefetch=2))
    assert [o.tolist() for o in outs] == [(b * 2 + 1).tolist() for b in Source(4)]


@pytest.mark.timeout(60)
def test_the_producer_runs_under_the_consumers_grad_and_inference_mode(pool):
    seen: list[tuple[bool, bool]] = []

    def call(batch: torch.Tensor) -> torch.Tensor:
        seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return pool.map_rows(rowfns.affine, batch)

    with torch.no_grad():
        stream = Stream(call, Source(2), prefetch=1)
    list(stream)
    with torch.inference_mode():
        stream = Stream(call, Source(2), prefetch=1)
    list(stream)
    assert seen == [(False, False)] * 2 + [(False, True)] * 2


@pytest.mark.timeout(60)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_results_follow_the_consumers_device_and_stream():
    device = torch.cuda.device_count() - 1
    torch.cuda.set_device(device)
    side = torch.cuda.Stream()
    seen = []
    with prep.Pool("threads", workers=2, device="cuda") as pool:

        def call(batch: torch.Tensor) -> torch.Tensor:
            seen.append((torch.cuda.current_device(), torch.cuda.current_stream()))
            return pool.map_rows(rowfns.affine, batch)

        with torch.cuda.stream(side):
            outs = [o.cpu() for o in Stream(call, Source(3), prefetch=2)]
    assert seen == [(device, side)] * 3
    assert [o.tolist() for o in outs] == [(b * 2 + 1).tolist() for b in Source(3)]


# ------------------------------------------------------------------ overlap and bounds


@pytest.mark.timeout(60)
def test_the_next_batches_are_prepared_while_the_consumer_holds_this_one(pool):
    n, prefetch = 6, 2
    started = [threading.Event() for _ in range(n + prefetch + 1)]

    def call(batch: torch.Tensor) -> torch.Tensor:
        started[index(batch)].set()
        return pool.map_rows(rowfns.affine, batch)

    with Stream(call, Source(n), prefetch) as stream:
        for k, out in enumerate(stream):
            assert index(out) == 2 * k + 1
            ahead = started[k + 1 : min(n, k + 1 + prefetch)]
            assert all(e.wait(10) for e in ahead), f"batches after {k} not started while held"
            assert not started[k + 1 + prefetch].is_set(), f"ran past prefetch at batch {k}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [1, 3])
def test_at_most_prefetch_results_wait_and_prefetch_plus_one_are_alive(prefetch):
    # serial, whose batch leaves no reference behind: an idle thread of the threads
    # pool still holds its last task, and so that batch's output, until the next one
    with prep.Pool("serial") as pool:
        _check_bounds(pool, prefetch)


def producer_waits_in(names: set[str]) -> bool:
    """Whether every stream producer thread is inside a function of ``names`` (or gone)."""
    frames = sys._current_frames()
    for t in threading.enumerate():
        frame = frames.get(t.ident) if t.name == THREAD_NAME else None
        while frame is not None and frame.f_code.co_name not in names:
            frame = frame.f_back
        if t.name == THREAD_NAME and t.is_alive() and frame is None:
            return False
    return True


def _check_bounds(pool: prep.Pool, prefetch: int) -> None:
    n = 8
    source = Source(n)
    lock = threading.Lock()
    live = [0, 0]  # outputs alive now, the most ever

    def freed() -> None:
        with lock:
            live[0] -= 1

    def call(batch: torch.Tensor) -> torch.Tensor:
        out = pool.map_rows(rowfns.affine, batch)
        weakref.finalize(out, freed)
        with lock:
            live[0] += 1
            live[1] = max(live)
        return out

    stream = Stream(call, source, prefetch)
    for k in range(n):
        source.asked += 1
        out = next(stream)
        assert index(out) == 2 * k + 1
        # while we hold batch k the producer fills every slot, and then waits
        target = min(n, k + 1 + prefetch)
        assert wait_until(lambda: source.pulled == target and live[0] == target - k)  # noqa: B023
        # once the producer waits for a slot (or to hand over the end), it cannot pull
        assert wait_until(lambda: producer_waits_in({"reserve", "put"}))
        assert source.pulled == target
        del out
        assert wait_until(lambda: live[0] == target - k - 1)  # noqa: B023
    with pytest.raises(StopIteration):
        next(stream)
    assert source.most_ahead <= prefetch
    assert live[1] <= prefetch + 1


# ------------------------------------------------------------------ errors

FAULTS = [
    # (where it fails, expected error, message, a function its traceback passes through)
    ("row", prep.RowError, r"row 0: ValueError: cannot handle 5", "fail_on_5"),
    ("call", ValueError, r"batch 5 failed", "call"),
    ("batches", LookupError, r"batch 5 cannot be read", "__next__"),
    ("stop", RuntimeError, r"raised StopIteration", "call"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize(("where", "error", "match", "origin"), FAULTS)
def test_an_error_comes_in_its_place_and_nothing_after_it_starts(
    pool, prefetch, where, error, match, origin
):
    source = Source(10, fail_at=5 if where == "batches" else None)

    def call(batch: torch.Tensor) -> torch.Tensor:
        if index(batch) == 5 and where == "call":
            raise ValueError("batch 5 failed")
        if index(batch) == 5 and where == "stop":
            raise StopIteration
        return pool.map_rows(rowfns.fail_on_5, batch)  # batch 5 is full of 5s

    got = []
    stream = Stream(call, source, prefetch)
    with pytest.raises(error, match=match) as info:
        for out in stream:
            got.append(index(out))
    assert got == [0, 1, 2, 3, 4]
    raised = [info.value, info.value.__cause__]
    names = {f.name for e in raised if e is not None for f in traceback.extract_tb(e.__traceback__)}
    assert origin in names
    assert wait_until(lambda: not producers())
    assert source.pulled == 6  # batch 6 was never pulled
    with pytest.raises(StopIteration):
        next(stream)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [True, -1, 1.5, "2", None])
def test_prefetch_must_be_a_whole_number(bad):
    with pytest.raises(prep.ConfigError, match=re.escape(f"prefetch={bad!r}") + ".*prefetch >= 1"):
        Stream(lambda b: b, [], bad)


@pytest.mark.timeout(60)
def test_prefetch_0_runs_each_batch_in_the_callers_thread(pool):
    source, threads = Source(4), []

    def call(batch: torch.Tensor) -> torch.Tensor:
        threads.append(threading.current_thread())
        return pool.map_rows(rowfns.affine, batch)

    stream = Stream(call, source, prefetch=0)
    assert source.pulled == 0 and not producers()
    assert index(next(stream)) == 1 and source.pulled == 1
    assert [index(o) for o in stream] == [3, 5, 7]
    assert threads == [threading.current_thread()] * 4


# ------------------------------------------------------------------ stopping


def _take_two_then_stop(how: str, call, source: Source, prefetch: int) -> None:
    if how == "break":
        for k, _ in enumerate(Stream(call, source, prefetch)):
            if k == 1:
                break
    elif how == "with":
        with Stream(call, source, prefetch) as stream:
            next(stream), next(stream)
    else:
        stream = Stream(call, source, prefetch)
        next(stream), next(stream)
        if how == "close":
            stream.close()
        else:
            del stream
            gc.collect()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["break", "with", "close", "del"])
def test_stopping_early_ends_the_thread_and_pulls_no_more(pool, how):
    source, prefetch = Source(50), 2
    _take_two_then_stop(how, lambda b: pool.map_rows(rowfns.affine, b), source, prefetch)
    assert wait_until(lambda: not producers())
    assert source.pulled <= 2 + prefetch


@pytest.mark.timeout(60)
def test_close_lets_the_running_batch_finish_and_starts_no_other(pool):
    running, release, finished = threading.Event(), threading.Event(), threading.Event()

    def call(batch: torch.Tensor) -> torch.Tensor:
        if index(batch) == 1:
            running.set()
            release.wait(30)
            finished.set()
        return pool.map_rows(rowfns.affine, batch)

    source = Source(10)
    stream = Stream(call, source, prefetch=3)  # room for batches 1-3 while we hold 0
    assert index(next(stream)) == 1
    assert running.wait(10)
    with pytest.warns(RuntimeWarning, match="did not finish within 0.1 s"):
        stream.close(timeout=0.1)  # batch 1 is held up: close gives up waiting, and says so
    assert producers()
    release.set()
    assert wait_until(lambda: not producers())
    assert finished.is_set() and source.pulled == 2  # batch 1 finished; 2 never pulled
    stream.close()  # again: nothing to do


@pytest.mark.timeout(60)
def test_close_waits_for_the_running_batch(pool):
    running, release = threading.Event(), threading.Event()

    def call(batch: torch.Tensor) -> torch.Tensor:
        if index(batch) == 1:
            running.set()
            release.wait(30)
        return pool.map_rows(rowfns.affine, batch)

    stream = Stream(call, Source(10), prefetch=2)
    next(stream)
    assert running.wait(10)
    closer = threading.Thread(target=stream.close)
    closer.start()
    release.set()
    closer.join(30)
    assert not closer.is_alive() and not producers()  # close returned after the thread ended
    assert "closed" in repr(stream)


@pytest.mark.timeout(60)
def test_close_open_closes_every_open_stream_within_one_timeout(pool):
    """What prep runs at exit, before the interpreter finalizes (test_exit.py): every
    open stream stops, and its thread is joined; ``timeout`` bounds the wait for all."""
    running, release = threading.Event(), threading.Event()

    def held(batch: torch.Tensor) -> torch.Tensor:
        if index(batch) == 1:
            running.set()
            release.wait(30)
        return pool.map_rows(rowfns.affine, batch)

    idle = Stream(lambda b: pool.map_rows(rowfns.affine, b), Source(50), prefetch=2)
    busy = Stream(held, Source(50), prefetch=2)
    next(idle), next(busy)
    assert running.wait(10)
    with pytest.warns(RuntimeWarning, match="did not finish within"):
        close_open(timeout=0.1)  # busy's batch is held up: the wait ends, and says so
    assert "closed" in repr(idle) and "closed" in repr(busy)
    release.set()
    assert wait_until(lambda: not producers())

    again = Stream(lambda b: pool.map_rows(rowfns.affine, b), Source(50), prefetch=2)
    next(again)
    close_open()
    assert not producers() and "closed" in repr(again)  # joined before close_open returned


CTRL_C = """
    import os, signal, sys, threading, time
    sys.path.insert(0, {root!r})
    import torch, prep
    from prep.stream.stream import THREAD_NAME, Stream

    def producers():
        return [t for t in threading.enumerate() if t.name == THREAD_NAME]

    def batches():
        for k in range(10_000):
            yield torch.full((8, 2), float(k))

    def main_in(name):  # whether the main thread is inside a function of that name
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None and frame.f_code.co_name != name:
            frame = frame.f_back
        return frame is not None

    def wait_main_in(name):
        end = time.monotonic() + 20
        while not main_in(name) and time.monotonic() < end:
            time.sleep(0.01)

    def loop():  # a plain for loop, no with block, as `for out in pool.imap(...)`
        for seen, out in enumerate(Stream(call, batches(), prefetch=2)):
            if seen == 1:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)

    with prep.Pool("threads", workers=2) as pool:
        call = lambda b: pool.map_rows(torch.neg, b)
        try:  # Ctrl-C in the loop body, the stream in a with block
            with Stream(call, batches(), prefetch=2) as stream:
                for seen, out in enumerate(stream):
                    if seen == 1:
                        os.kill(os.getpid(), signal.SIGINT)
                        time.sleep(30)
        except KeyboardInterrupt:
            print("body", "OK" if not producers() else producers(), flush=True)

        try:  # Ctrl-C in the body of a loop in a function: the dropped stream stops
            loop()
        except KeyboardInterrupt:
            print("function", "OK" if not producers() else producers(), flush=True)

        release = threading.Event()

        def held(b):
            if b[0, 0] == 2:
                release.wait(30)
            return pool.map_rows(torch.neg, b)

        def interrupt():  # Ctrl-C while the consumer waits for batch 2 in next()
            wait_main_in("take")
            os.kill(os.getpid(), signal.SIGINT)
            wait_main_in("close")  # the stream is stopping: let batch 2 finish
            release.set()

        stream = Stream(held, batches(), prefetch=2)
        next(stream), next(stream)
        threading.Thread(target=interrupt).start()
        try:
            next(stream)
        except KeyboardInterrupt:
            ok = not producers() and "closed" in repr(stream)
            print("waiting", "OK" if ok else producers(), flush=True)
"""


@pytest.mark.timeout(60)
def test_ctrl_c_stops_the_stream():
    code = textwrap.dedent(CTRL_C.format(root=ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=45, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["body OK", "function OK", "waiting OK"], (
        done.stdout + done.stderr
    )


@pytest.mark.timeout(60)
def test_pool_imap_samples_pads_each_list_of_samples():
    batches = [[1, 3], [2], [4, 1, 2]]
    with prep.Pool("threads", workers=2) as pool:
        got = list(pool.imap_samples(torch.arange, batches, pad=-1))
    for out, batch in zip(got, batches):
        assert torch.equal(out, refs.loop(torch.arange, batch, pad=-1))


# ------------------------------------------------------------------ batches in flight (tickets)


class FakeTicket:
    """A batch run elsewhere: done when the test says so, in any order."""

    def __init__(self, batch: torch.Tensor, log: list[tuple[str, int]]) -> None:
        self.k, self.log = index(batch), log
        self.value = batch * 2 + 1
        self.finished = threading.Event()
        self.error: BaseException | None = None
        log.append(("submit", self.k))

    def done(self) -> bool:
        return self.finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

    def result(self) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self) -> None:
        self.log.append(("cancel", self.k))


class Tickets:
    """``submit`` for a Stream: every ticket kept, so the test can finish them."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.made: dict[int, FakeTicket] = {}
        self.changed = threading.Condition()

    def __call__(self, batch: torch.Tensor) -> FakeTicket:
        t = FakeTicket(batch, self.log)
        with self.changed:
            self.made[t.k] = t
            self.changed.notify_all()
        return t

    def wait_for(self, k: int) -> FakeTicket:
        with self.changed:
            assert self.changed.wait_for(lambda: k in self.made, timeout=10), f"{k} not submitted"
            return self.made[k]


@pytest.mark.timeout(60)
def test_batches_in_flight_finish_in_any_order_and_come_in_order():
    tickets = Tickets()
    stream = Stream(lambda b: b, Source(4), prefetch=4, submit=tickets)
    for k in (3, 2, 1):  # all four are in flight at once: finish them backwards
        tickets.wait_for(k).finished.set()
    assert not tickets.made[0].done()
    tickets.made[0].finished.set()
    assert [index(o) for o in stream] == [1, 3, 5, 7]


@pytest.mark.timeout(60)
def test_an_error_in_flight_comes_in_its_place_and_the_rest_are_cancelled():
    tickets = Tickets()
    stream = Stream(lambda b: b, Source(6), prefetch=3, submit=tickets)
    first, second, third = (tickets.wait_for(k) for k in range(3))
    second.error = ValueError("batch 1 failed")
    third.finished.set()  # batch 2 done before the failing batch 1
    second.finished.set()
    first.finished.set()
    assert index(next(stream)) == 1
    with pytest.raises(ValueError, match="batch 1 failed"):
        next(stream)
    assert wait_until(lambda: not producers())
    assert ("cancel", 2) in tickets.log  # done but never delivered: its output dropped
    assert ("submit", 4) not in tickets.log


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["close", "del"])
def test_stopping_cancels_every_batch_in_flight(how):
    tickets = Tickets()
    stream = Stream(lambda b: b, Source(10), prefetch=3, submit=tickets)
    tickets.wait_for(0).finished.set()
    assert index(next(stream)) == 1
    for k in (1, 2, 3):
        tickets.wait_for(k)
    if how == "close":
        stream.close()
    else:
        del stream
        gc.collect()
    assert wait_until(lambda: not producers())
    assert {("cancel", k) for k in (1, 2, 3)} <= set(tickets.log)
    assert ("submit", 4) not in tickets.log


class _Gate:
    """A batch run elsewhere that is done when the test opens it. Its ``wait`` overstays
    any timeout but 0, so a producer that waits on it is stuck there, for all to see."""

    def __init__(self, value: object) -> None:
        self.value, self.opened = value, threading.Event()

    def done(self) -> bool:
        return self.opened.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout != 0:
            self.opened.wait()
        return self.done()

    def result(self) -> object:
        self.opened.wait()
        return self.value

    def cancel(self) -> None:
        self.opened.set()


@pytest.mark.timeout(60)
def test_while_results_wait_the_producer_waits_for_a_slot_not_for_the_oldest_batch():
    # batch 1 runs elsewhere and is slow; batch 0 was done at once and waits for the
    # consumer. When the consumer takes it, a slot frees: batch 2 must go to a worker
    # then, not once batch 1 is done (a worker would idle meanwhile)
    gate = _Gate(1)
    pulled: list[int] = []

    def submit(batch: int) -> object:
        pulled.append(batch)
        return gate if batch == 1 else Delivery.ran(lambda b: b, batch)

    stream = Stream(lambda b: b, iter(range(4)), prefetch=2, submit=submit)
    try:
        assert next(stream) == 0
        assert wait_until(lambda: pulled == [0, 1, 2]), pulled
        assert not gate.done()
    finally:
        gate.opened.set()
    assert list(stream) == [1, 2, 3]


@pytest.mark.timeout(60)
def test_a_row_warning_names_the_batch_and_the_row_in_the_stream(pool):
    """Row 5 of the third batch of 8 rows is row 21 of the stream."""
    batches = [torch.zeros(8, 2) + k * 8 + torch.arange(8.0)[:, None] for k in range(4)]

    def fail_on_21(row: torch.Tensor) -> torch.Tensor:
        if int(row[0]) == 21:
            raise ValueError("bad row")
        return row

    with pytest.warns(RuntimeWarning) as seen:
        outs = list(pool.imap(fail_on_21, batches, on_error="fill", prefetch=0))
    assert len(outs) == 4
    (warning,) = [w for w in seen if "rows failed" in str(w.message)]
    text = str(warning.message)
    assert "1 of 8 rows failed and were filled" in text
    assert (
        "the first: row 5: ValueError: bad row (batch 2 of the stream: row 21 of the stream)"
        in text
    )
