"""A stream's figures (``Stream.stats()``) and its verdict.

The rule is tested on injected figures, each threshold just below and just above.
On real streams, counts are exact; a side is made slow by moving the figures' clock
(``prep.stream.stats.clock``) on by 1,000 s inside that side's window, at a moment
the construction pins with events (the loop is waiting for batch k; the producer is
idle with the queue full), so no test depends on how fast this machine is.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import prep
from prep.stream import stats as stats_module
from prep.stream.stats import (
    BUSY_DATA,
    BUSY_SPARE,
    COMPETES,
    RESERVOIR,
    SATURATED,
    SOURCE_BOUND,
    WAIT_COMPUTE,
    Meter,
    StreamStats,
    rows_in,
    verdict,
)
from prep.stream.stream import Stream
from tests.conftest import wait_until

EPS = 1e-3
JUMP = 1000.0  # seconds a slow side takes on the figures' clock


def figures(wait: float = 0.5, busy: float = 0.9, source: float = 0.0, **kw: Any) -> StreamStats:
    """Figures whose wait, busy and source shares are the given ones (elapsed 1 s)."""
    base: dict[str, Any] = dict(
        batches=10,
        rows=640,
        wait_median=wait / 10,
        wait_p95=wait / 5,
        wait_total=wait,
        between_total=1.0 - wait,
        source_total=source,
        busy_total=busy,
        elapsed=1.0,
        fill=1.0,
        prefetch=2,
        workers=2,
    )
    return StreamStats(**{**base, **kw})


READY = "compute-bound: batches were ready 99% of the time; "
WAITED = "data-bound: the loop waited 41% of its time"

# (figures, the verdict's start): every branch, and each threshold from both sides
CASES = [
    (figures(wait=0.01, busy=0.1), READY + "the data side can spare a worker"),
    (figures(wait=0.01, busy=0.9), READY + "the workers were busy 90%: keep them"),
    (figures(wait=0.5, source=0.6), "source-bound: the workers waited on your iterator 60% of"),
    (figures(wait=0.41, busy=0.98), WAITED + "; the workers were busy 98%: more workers or a"),
    (figures(wait=0.41, busy=0.3), WAITED + " while the workers were busy 30%: the stream's own"),
    (figures(batches=0), "no batch delivered yet"),
    (figures(wait=WAIT_COMPUTE - EPS), "compute-bound"),
    (figures(wait=WAIT_COMPUTE + EPS), "data-bound"),
    (figures(wait=0.5, source=SOURCE_BOUND - EPS), "data-bound"),
    (figures(wait=0.5, source=SOURCE_BOUND + EPS), "source-bound"),
    (figures(wait=0.41, busy=BUSY_DATA - EPS), WAITED + " while"),
    (figures(wait=0.41, busy=BUSY_DATA + EPS), WAITED + "; the workers"),
    (figures(wait=0.01, busy=BUSY_SPARE - EPS), READY + "the data side"),
    (figures(wait=0.01, busy=BUSY_SPARE + EPS), READY + "the workers"),
    # a loop that rarely waits is compute-bound however slow the source
    (figures(wait=0.01, busy=0.1, source=0.9), "compute-bound"),
    # a saturated machine, the data side holding cores: it competes with the step (the
    # workers busy 40% of the time, each of 2: 0.8 cores), whatever the waits say
    (figures(wait=0.01, busy=0.4, machine_busy=0.97, cores=2),
     "compute-bound, but the machine's 2 cores were busy 97% and the data side kept 0.8"),
    (figures(wait=0.01, busy=0.4, machine_busy=SATURATED - EPS, cores=2), READY + "the data"),
    (figures(wait=0.01, busy=COMPETES / 2 - EPS, machine_busy=1.0, cores=2), READY + "the data"),
    (figures(wait=0.01, busy=COMPETES / 2 + EPS, machine_busy=1.0, cores=2), "compute-bound, but"),
    (figures(wait=0.5, busy=0.98, machine_busy=1.0, cores=2), "data-bound"),
]  # fmt: skip


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("given", "expected"), CASES)
def test_the_verdict_on_injected_figures(given: StreamStats, expected: str) -> None:
    said = verdict(given)
    assert said.startswith(expected), said
    assert "\n" not in said
    assert str(given).splitlines()[-1] == said  # printed under the numbers


@pytest.mark.timeout(10)
def test_a_meter_reads_how_busy_the_machine_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's busy share over the stream, from the cores' counters read at its
    start and when asked (here injected: 950 of 1,000 ticks busy on 4 cores)."""
    readings = iter([(1_000, 10_000, 4), (1_950, 11_000, 4)])
    monkeypatch.setattr(prep.stream.stats, "cpu_times", lambda: next(readings))
    meter = Meter(2, 2)
    s = meter.stats()
    assert s.machine_busy == pytest.approx(0.95) and s.cores == 4
    assert "the machine's 4 cores busy 95%" in str(s)
    monkeypatch.setattr(prep.stream.stats, "cpu_times", lambda: None)  # no /proc/stat
    s = Meter(2, 2).stats()
    assert s.machine_busy is None and "machine" not in str(s)


@pytest.mark.timeout(10)
def test_the_printed_figures_carry_the_numbers() -> None:
    text = str(figures(wait=0.41, busy=0.98, source=0.05))
    for part in ("10 batches, 640 rows", "410.00 ms (41% of its", "busy 98%", "(5%)", "prefetch=2"):
        assert part in text, text


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("result", "rows"),
    [
        (torch.zeros(5, 3), 5),
        (torch.tensor(1.0), 1),
        ((torch.zeros(4, 2), torch.zeros(4)), 4),  # several outputs, or return_lengths=
        ({"a": torch.zeros(3, 1), "b": torch.zeros(3)}, 3),
        (((torch.zeros(2, 9), torch.zeros(2)), torch.tensor([9, 9])), 2),
        (["x", "y", "z"], 3),
        (object(), 0),
    ],
)
def test_rows_in_a_result(result: Any, rows: int) -> None:
    assert rows_in(result) == rows


@pytest.mark.timeout(10)
def test_the_waits_kept_are_bounded_and_the_process_random_untouched() -> None:
    state = random.getstate()
    meter = Meter(prefetch=2, workers=1)
    figures_one = stats_module.BatchFigures(rows=1, source=0.0, busy=0.0)
    for _ in range(RESERVOIR * 4):
        meter.took(meter.asked(), 0, figures_one)
    assert len(meter.waits) == RESERVOIR
    assert meter.stats().batches == RESERVOIR * 4
    assert random.getstate() == state


def batches(n: int, rows: int = 4) -> Iterator[torch.Tensor]:
    """Batch k: ``rows`` rows of (k, row number)."""
    for k in range(n):
        yield torch.stack([torch.full((rows,), float(k)), torch.arange(rows, dtype=torch.float)], 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("executor", "strategy", "prefetch"),
    [
        ("serial", "split", 2),
        ("serial", "split", 0),
        ("threads", "split", 2),
        ("threads", "whole", 4),
        ("threads", "auto", None),
        ("processes", "whole", 4),
    ],
)
def test_counts_are_exact(executor: str, strategy: str, prefetch: int | None) -> None:
    with prep.Pool(executor, workers=2) as pool:
        stream = pool.imap(torch.neg, batches(23, rows=5), prefetch=prefetch, strategy=strategy)
        assert stream.stats().batches == 0
        assert verdict(stream.stats()).startswith("no batch")
        for taken, _ in enumerate(stream, 1):
            assert stream.stats().batches == taken
        s = stream.stats()
    assert (s.batches, s.rows) == (23, 23 * 5)
    assert s.workers == 2
    assert 0 <= s.wait_median <= s.wait_p95 <= s.wait_total
    assert min(s.between_total, s.source_total, s.busy_total, s.fill) >= 0
    assert s.elapsed >= s.wait_total


@pytest.mark.timeout(60)
def test_rows_of_samples_and_of_skipped_rows() -> None:
    def fail_odd(x: torch.Tensor) -> torch.Tensor:
        if int(x[1]) % 2:
            raise ValueError("odd")
        return x

    with prep.Pool("threads", workers=2) as pool:
        samples = [[torch.tensor([float(i)]) for i in range(6)]] * 3
        stream = pool.imap_samples(torch.neg, samples)
        list(stream)
        assert (stream.stats().batches, stream.stats().rows) == (3, 18)
        with pytest.warns(RuntimeWarning, match="left out"):
            stream = pool.imap(fail_odd, batches(3, rows=4), on_error="skip", strategy="split")
            list(stream)
        assert (stream.stats().batches, stream.stats().rows) == (3, 6)  # the rows delivered


class Clock:
    """``stats.clock`` moved on by :meth:`jump` (never back)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return time.perf_counter() + self.offset

    def jump(self) -> None:
        with self._lock:
            self.offset += JUMP


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(stats_module, "clock", c)
    return c


class Loop:
    """The stream a test runs, for a slow side to see where the loop is."""

    stream: Stream | None = None

    def asking_for(self, k: int) -> bool:
        """Whether the loop is in next() for batch k (it cannot return before batch k is made)."""
        meter = self.stream._meter if self.stream is not None else None
        return meter is not None and meter.waiting and meter.batches == k

    def when_asked(self, k: int) -> None:
        assert wait_until(lambda: self.asking_for(k), timeout=30, every=0.001)


@pytest.mark.timeout(60)
def test_a_slow_source_is_named(clock: Clock) -> None:
    """Pulling batch k takes 1,000 s, all of them while the loop waits for it (one batch
    ahead: batch k is pulled once the loop has taken k - 1, with nothing in flight)."""
    loop = Loop()

    def source() -> Iterator[torch.Tensor]:
        for k, batch in enumerate(batches(5)):
            loop.when_asked(k)
            clock.jump()
            yield batch

    with prep.Pool("threads", workers=2) as pool:
        loop.stream = stream = pool.imap(torch.neg, source(), prefetch=1, strategy="whole")
        assert len(list(stream)) == 5
    s = stream.stats()
    assert s.source_share > 0.99 and s.wait_share > 0.99, s
    assert verdict(s).startswith("source-bound"), s


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("executor", "strategy"), [("serial", "split"), ("threads", "whole")])
def test_slow_rows_are_named(clock: Clock, executor: str, strategy: str) -> None:
    """Each batch's first row takes 1,000 s, while the loop waits for that batch and the
    producer waits for it too (one batch ahead: no pull while it runs); run in the
    producer's thread (serial), that is the workers' busy time too."""
    loop = Loop()

    def slow(row: torch.Tensor) -> torch.Tensor:
        if int(row[1]) == 0:
            loop.when_asked(int(row[0]))
            clock.jump()
        return -row

    with prep.Pool(executor, workers=2) as pool:
        loop.stream = stream = pool.imap(slow, batches(5), prefetch=1, strategy=strategy)
        assert len(list(stream)) == 5
    s = stream.stats()
    assert s.wait_share > 0.99 and s.source_share < 0.01, s
    assert verdict(s).startswith("data-bound"), s
    if executor == "serial":  # the thread's run time is the pool's busy time
        assert s.busy_share > 0.99, s
        assert "more workers or a cheaper row function" in verdict(s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executor", ["serial", "threads"])
def test_a_slow_step_is_named(clock: Clock, executor: str) -> None:
    """The loop's step takes 1,000 s, taken once the producer is idle with the queue
    full (or done), so none of it falls in a pull or a batch being made."""
    with prep.Pool(executor, workers=2) as pool:
        stream = pool.imap(torch.neg, batches(6), prefetch=2, strategy="split")
        producer = stream._thread
        assert producer is not None
        link = stream._link

        def idle() -> bool:
            return link.results.full() or not producer.is_alive()

        for _ in stream:
            assert wait_until(idle, timeout=30, every=0.001)
            clock.jump()
    s = stream.stats()
    assert s.wait_share < 0.01 and s.busy_share < 0.01 and s.source_share < 0.01, s
    assert verdict(s).startswith("compute-bound"), s
    assert "can spare a worker" in verdict(s)


@pytest.mark.timeout(60)
def test_stats_keep_no_batch_alive_and_change_no_setting() -> None:
    settings = (torch.get_num_threads(), torch.is_grad_enabled(), random.getstate())
    with prep.Pool("threads", workers=2) as pool:
        stream = pool.imap(torch.neg, batches(4), prefetch=2, strategy="split")
        gone = [weakref.ref(out) for out in stream]
        s = stream.stats()
        assert s.batches == 4
        assert all(ref() is None for ref in gone)  # the stream and its figures hold none
    assert (torch.get_num_threads(), torch.is_grad_enabled(), random.getstate()) == settings


@pytest.mark.timeout(30)
def test_measure_false_keeps_no_figures() -> None:
    stream = Stream(torch.neg, batches(3), prefetch=2, measure=False)
    assert len(list(stream)) == 3
    assert stream.stats().batches == 0


@pytest.mark.timeout(60)
def test_pool_explain_says_what_the_latest_stream_achieved():
    with prep.Pool("threads", workers=2) as pool:
        stream = pool.imap(torch.neg, [torch.ones(64, 8)] * 20)
        for _ in stream:
            pass
        text = str(pool.explain())
    (line,) = [x for x in text.splitlines() if "latest stream" in x]
    assert "20 batches, 1,280 rows at" in line and "rows/s; " in line
    assert any(side in line for side in ("data-bound", "compute-bound", "source-bound"))
