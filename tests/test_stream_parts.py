"""A stream of ``processes`` or ``threads`` splits each batch into parts on the
stream's workers, several batches in flight (``prep.executors.Parts``): what that
adds to the mechanics
``test_stream_whole`` checks for every way with batches in flight (order, values
against serial, bounds, errors, crashes, timeouts, stopping, Ctrl-C).

Mechanics only, never speed; each test that could hang has a timeout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import torch

import prep
from prep.core.output import Output
from prep.core.policy import RAISE
from prep.core.rows import rows_of
from prep.executors import Part, Parts
from prep.executors._batches import ProcessBatches
from prep.executors._messages import Chunk, Done
from prep.stream.strategy import StrategyPlan
from tests import registry, rowfns

#: rows wide enough that a batch's output is shared, not copied into the message
WIDE = 300


#: the executors whose streams split each batch into parts on the stream's workers, with
#: several batches in flight (tests/registry.py says why the others cannot)
PARTS = registry.executors(registry.PARTS)


def wide_batch(k: int, rows: int = 64) -> torch.Tensor:
    """Batch k: ``rows`` rows of WIDE values, row i full of its stream-wide number."""
    first = k * rows
    return torch.arange(first, first + rows, dtype=torch.float32)[:, None].repeat(1, WIDE)


def wider_from_batch_3(row: torch.Tensor) -> torch.Tensor:
    """Rows of batches 0-2 return WIDE values, later ones WIDE + 5: the shape changes."""
    extra = 5 if int(row[0]) >= 3 * 64 else 0
    return torch.cat([row * 2, torch.ones(extra)])


def wider_row_70(row: torch.Tensor) -> torch.Tensor:
    """Row 70 (batch 1) returns one value more than the others: a StackError naming it."""
    return torch.zeros(WIDE + (1 if int(row[0]) == 70 else 0))


def fail_rows_3_and_6(row: torch.Tensor) -> torch.Tensor:
    if int(row[0]) % 8 in (3, 6):
        raise ValueError(f"row value {int(row[0])}")
    return row


@pytest.fixture
def spied() -> Iterator[list[bool]]:
    """Whether each split batch's output was made for the workers to write in place."""
    made: list[bool] = []
    real = Parts._into

    def into(self):  # type: ignore[no-untyped-def]
        out = real(self)
        made.append(out is not None)
        return out

    Parts._into = into  # type: ignore[method-assign]
    try:
        yield made
    finally:
        Parts._into = real  # type: ignore[method-assign]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", PARTS)
def test_the_output_is_written_in_place_once_its_shape_is_known(executor, spied, no_leaks):
    batches = [wide_batch(k) for k in range(6)]
    with prep.Pool(executor, workers=2) as pool:
        outs = list(pool.imap(rowfns.affine, batches, strategy="split", prefetch=1))
    assert all(torch.equal(o, b * 2 + 1) for o, b in zip(outs, batches))
    # the first batch comes back in chunks and fixes the shape; the others are in place
    assert spied == [False] + [True] * 5


@pytest.mark.timeout(120)
def test_a_shape_that_changes_mid_stream_is_learnt_again(spied, monkeypatch, no_leaks):
    sent: list[int] = []
    real = ProcessBatches.submit

    def submit(self, units):  # type: ignore[no-untyped-def]
        if isinstance(units, list) and isinstance(units[0], Part):
            sent.append(len(units[0].rows))  # a batch's parts, submitted together
        return real(self, units)

    monkeypatch.setattr(ProcessBatches, "submit", submit)
    batches = [wide_batch(k) for k in range(6)]
    with prep.Pool("processes", workers=2) as pool:
        outs = list(pool.imap(wider_from_batch_3, batches, strategy="split", prefetch=1))
    want = [torch.stack([wider_from_batch_3(row) for row in b]) for b in batches]  # a loop's
    assert [o.shape for o in outs] == [w.shape for w in want]
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    # batch 3 was guessed wrong and sent again to come back in chunks; batch 4 on (sent
    # after it, prefetch=1) is written in place in the new shape
    assert len(sent) == 7 and spied == [False] + [True] * 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", PARTS)
def test_a_row_unlike_the_others_raises_what_serial_raises(executor, no_leaks):
    batches = [wide_batch(k) for k in range(3)]
    with prep.Pool(executor, workers=2) as pool, prep.Pool("serial") as ref:
        with pytest.raises(prep.StackError) as got:
            list(pool.imap(wider_row_70, batches, strategy="split", prefetch=1))
        with pytest.raises(prep.StackError) as want:
            ref.map_rows(wider_row_70, batches[1])
    assert str(got.value) == str(want.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executor", PARTS)
@pytest.mark.parametrize("wide", [False, True], ids=["in the message", "in place"])
def test_the_lowest_failing_row_of_all_parts_is_raised(executor, wide):
    b = wide_batch(0, rows=16) if wide else torch.arange(16.0)[:, None]
    with prep.Pool(executor, workers=2) as pool, prep.Pool("serial") as ref:
        list(pool.imap(rowfns.affine, [b], strategy="split"))  # the shape, where in place
        with pytest.raises(prep.RowError) as got:
            list(pool.imap(fail_rows_3_and_6, [b, b], strategy="split"))
        with pytest.raises(prep.RowError) as want:
            ref.map_rows(fail_rows_3_and_6, b)
    assert got.value.row == want.value.row == 3
    assert str(got.value) == str(want.value)


@pytest.mark.timeout(120)
def test_each_worker_gets_one_part_of_a_batch_and_the_loan_comes_back(no_leaks):
    workers = ProcessBatches(2)
    try:
        key = workers.prepare(rowfns.affine).key
        rows = rows_of(wide_batch(0, rows=512))  # its column is lent from the ring
        halves = [(0, 256), (256, 512)]
        tickets = workers.submit([Part(key, rows, RAISE, None, b) for b in halves])
        assert [t.bounds() for t in tickets] == halves
        assert tickets[0].lane is not tickets[1].lane
        assert not workers._ring._idle  # lent, until every part is settled
        tickets[0].result()
        assert not workers._ring._idle  # one part is not the batch
        tickets[1].result()
        assert len(workers._ring._idle) == 1  # the one buffer, back once
        for t in tickets:
            start, stop = t.bounds()
            out = t.reply.output  # each part is a chunk of the batch, in batch row numbers
            assert out.first_row == start
            assert torch.equal(out.buffers[0], wide_batch(0, rows=512)[start:stop] * 2 + 1)
    finally:
        workers.close()


@pytest.mark.timeout(120)
def test_a_part_in_place_writes_the_batchs_own_output(no_leaks):
    workers = ProcessBatches(2)
    try:
        key, b = workers.prepare(rowfns.affine).key, wide_batch(0, rows=64)
        into = Output.allocate(b[0], 64, shared=True)
        part = functools.partial(Part, key, rows_of(b), RAISE, None)
        tickets = workers.submit([part((0, 32), into), part((32, 64), into)])
        for t in tickets:
            assert t.result() == (None, {}) and isinstance(t.reply, Done)
        assert torch.equal(into.buffers[0], b * 2 + 1)
    finally:
        workers.close()


def test_split_in_parts_is_rated_by_what_the_workers_built_together():
    plan = StrategyPlan("auto", workers=2)
    # the first batch pays the start and is not counted; then two parts a batch, each
    # worker 100 rows in 10 ms, side by side: 20,000 rows/s, taken in at 100,000
    for k in range(3):
        plan.next()
        t = 10.0 + 0.01 * k
        plan.split_taken(200, 0.002, [(t, t + 0.01, 100), (t, t + 0.01, 100)])
    assert plan.split_rate() == pytest.approx(20_000)
    # taken in slower than built: the taking caps it
    slow = StrategyPlan("auto", workers=2)
    for k in range(3):
        t = 10.0 + 0.01 * k
        slow.split_taken(200, 0.04, [(t, t + 0.01, 100), (t, t + 0.01, 100)])
    assert slow.split_rate() == pytest.approx(5_000)


def test_split_parts_never_seen_together_count_one_worker_times_the_workers():
    plan = StrategyPlan("auto", workers=2)
    for k in range(3):  # one part at a time: 100 rows in 10 ms, 10,000 rows/s a worker
        t = 10.0 + 0.02 * k
        plan.split_taken(200, 0.001, [(t, t + 0.01, 100), (t + 0.01, t + 0.02, 100)])
    assert plan.split_rate() == pytest.approx(20_000)


def test_thread_parts_never_seen_together_count_as_one_core():
    # as whole batches on threads: whether their rows share the GIL was not seen
    plan = StrategyPlan("auto", workers=2, flavours=("threads",))
    for k in range(3):
        t = 10.0 + 0.02 * k
        plan.split_taken(200, 0.001, [(t, t + 0.01, 100), (t + 0.01, t + 0.02, 100)])
    assert plan.split_rate() == pytest.approx(10_000)


@pytest.mark.timeout(120)
def test_threads_take_parts_from_one_queue_and_build_them_as_processes_do():
    from prep.executors._batch_threads import ThreadBatches

    workers = ThreadBatches(2)
    try:
        b = wide_batch(0, rows=64)
        halves = [(0, 32), (32, 64)]
        key = workers.prepare(rowfns.affine).key
        tickets = workers.submit([Part(key, rows_of(b), RAISE, None, h) for h in halves])
        for t in tickets:
            out, errors = t.result()
            start, stop = t.bounds()
            assert isinstance(t.reply, Chunk) and not errors and out.first_row == start
            assert torch.equal(out.buffers[0], b[start:stop] * 2 + 1)
            assert t.span is not None and t.span[0] <= t.span[1]  # rated as processes' parts
    finally:
        workers.close()


@pytest.mark.timeout(120)
def test_the_ring_lends_again_buffers_of_several_sizes(no_leaks):
    # batches of two sizes in turn: the ring holds buffers of both, and takes the one of
    # the size asked for (never comparing tensors of other sizes)
    small, large = torch.randn(64, 512), torch.randn(256, 512)  # both travel in the ring
    with prep.Pool("processes", workers=2) as pool:
        for x in (small, large, small, large, large, small):
            assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)
        assert len(pool._get("processes").engine._ring._idle) >= 2
