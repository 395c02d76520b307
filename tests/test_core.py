"""The executor contract: every executor matches ``serial`` bit for bit."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep
from prep.executors import available_cores
from tests import registry, rowfns
from tests.conftest import pool_children, wait_until
from tests.registry import NO_TWIN, PROCESSES, READS_VALUES, SAMPLES

EXECUTORS = list(registry.EVERY)
#: the functions of the error cases read values and have no twin: vectorized and vmap
#: refuse them (tests/registry.py, checked in tests/test_refusals_registry.py)
PER_ROW = registry.executors(NO_TWIN, READS_VALUES)
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]

pytestmark = pytest.mark.timeout(60)


def make(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def run(fn, batch, executor, **kw):
    return prep.map_rows(fn, batch, executor=executor, workers=2, **kw)


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_batch_matches_a_loop(executor, dtype):
    x = make((37, 5, 3), dtype)
    assert_same(run(rowfns.reverse, x, executor), torch.stack([row.flip(-1) for row in x]))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_tuple_and_dict_batches_and_results(executor):
    a, b = make((23, 4), torch.float32, 1), make((23, 4), torch.float32, 2)
    got = run(rowfns.pair, (a, b), executor)
    assert isinstance(got, tuple)
    rows = [rowfns.pair(ra, rb) for ra, rb in zip(a, b)]  # a loop's
    assert_same(got, (torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])))
    got = run(rowfns.named, {"x": a, "y": b}, executor)
    assert list(got) == ["sum", "flip"]
    assert_same(got, {"sum": a + b, "flip": a.flip(-1)})


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("rows", [1, 1000])
def test_row_counts(executor, rows):
    x = make((rows, 6), torch.float32)
    assert_same(run(rowfns.affine, x, executor), x * 2 + 1)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_non_contiguous_input(executor):
    x = make((8, 30), torch.float32).t()[::2]  # [15, 8], strided both ways
    assert not x.is_contiguous()
    assert_same(run(rowfns.affine, x, executor), x * 2 + 1)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_out_is_filled_and_returned(executor):
    x = make((19, 4), torch.float32)
    out = torch.full((19, 4), -7.0)
    got = run(rowfns.affine, x, executor, out=out)
    assert got is out
    assert_same(out, x * 2 + 1)
    outs = (torch.empty(19, 4), torch.empty(19))
    got = run(rowfns.pair, (x, x), executor, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    assert_same(outs, (2 * x, x.sum(1)))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_zero_rows(executor):
    x = torch.empty(0, 4)
    out = torch.empty(0, 4)
    assert run(rowfns.affine, x, executor, out=out) is out
    if not prep.EXECUTORS[executor].traits.per_row:
        assert run(rowfns.affine, x, executor).shape == (0, 4)
    else:
        with pytest.raises(ValueError, match="0 rows.*out="):
            run(rowfns.identity, x, executor)


def test_partial_keeps_its_twin():
    import functools

    def scale_batch(x, *, k):
        return x * k

    @prep.rowwise(batched=scale_batch)
    def scale(row, *, k):
        return row * k

    x = make((5, 3), torch.float32)
    fn = functools.partial(scale, k=3.0)
    assert_same(prep.map_rows(fn, x, executor="vectorized"), x * 3)
    assert_same(prep.map_rows(fn, x, executor="serial"), x * 3)


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN, SAMPLES))
def test_map_samples(executor):
    samples = [{"tokens": list(range(n))} for n in (3, 9, 0, 5, 8)]
    got = prep.map_samples(rowfns.sample_len, samples, executor=executor, workers=2)
    want = torch.stack([rowfns.sample_len(s) for s in samples])
    assert_same(got, want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 40),
    feat=st.lists(st.integers(0, 4), max_size=3),
    executor=st.sampled_from(EXECUTORS),
    dtype=st.sampled_from(DTYPES[:4]),
)
def test_property_shapes(rows, feat, executor, dtype):
    x = make((rows, *feat), dtype)
    assert_same(run(rowfns.affine, x, executor), torch.stack([row * 2 + 1 for row in x]))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("executor", PER_ROW)
def test_row_error_names_the_row_and_keeps_the_cause(executor):
    x = torch.arange(10.0).view(10, 1)
    with pytest.raises(prep.RowError, match=r"row 5: ValueError: cannot handle 5") as info:
        run(rowfns.fail_on_5, x, executor)
    assert info.value.row == 5
    cause = info.value.__cause__
    assert isinstance(cause, ValueError)
    text = str(cause.__cause__) if cause.__cause__ is not None else ""
    if executor in registry.executors(PROCESSES):  # the worker's traceback travels along
        assert "fail_on_5" in text and "Traceback" in text
    # the pool still works afterwards
    assert_same(run(rowfns.affine, x, executor), x * 2 + 1)


@pytest.mark.parametrize("executor", PER_ROW)
def test_stack_error_names_two_rows(executor):
    x = torch.arange(10.0).view(10, 1).expand(10, 4).contiguous()
    with pytest.raises(
        prep.StackError, match=r"row \d+ returned shape .* row \d+ returned shape"
    ) as info:
        run(rowfns.ragged, x, executor)
    assert "row 3 returned shape (2,)" in str(info.value) and "shape (4,)" in str(info.value)
    with pytest.raises(prep.StackError, match=r"row 2 .*float64"):
        run(rowfns.wrong_dtype, x, executor)


@pytest.mark.parametrize("executor", PER_ROW)
def test_non_tensor_result_is_a_type_error(executor):
    with pytest.raises(TypeError, match=r"returned a list .*must return a Tensor"):
        run(rowfns.not_a_tensor, torch.ones(4, 2), executor)


def test_bad_batches_and_settings():
    with pytest.raises(ValueError, match=r"different numbers of rows \(0: 3, 1: 4\)"):
        prep.map_rows(rowfns.pair, (torch.ones(3, 2), torch.ones(4, 2)))
    with pytest.raises(prep.ConfigError, match=r"workers=0 .*workers >= 1"):
        prep.map_rows(rowfns.identity, torch.ones(3), executor="threads", workers=0)
    with pytest.raises(prep.ConfigError, match=r"executor='gpu' is not one of 'serial'"):
        prep.map_rows(rowfns.identity, torch.ones(3), executor="gpu")
    with pytest.raises(TypeError, match=r"column 0 is a list, expected a Tensor.*map_samples"):
        prep.map_rows(rowfns.identity, [[1, 2]])
    with pytest.raises(prep.ConfigError, match=r"has none.*@prep.rowwise"):
        prep.map_rows(rowfns.identity, torch.ones(3), executor="vectorized")
    with pytest.raises(ValueError, match=r"out= has a tensor of shape \(2, 2\).*3 rows"):
        prep.map_rows(rowfns.identity, torch.ones(3, 2), out=torch.empty(2, 2))


def test_lambdas_closures_and_local_functions_run_under_processes():
    k, shift = 3, torch.tensor([0.5, -0.5])

    def local(row: torch.Tensor) -> torch.Tensor:
        return row * k + shift  # a closure over an int and a tensor

    x = torch.arange(6.0).view(3, 2)
    for fn in (lambda r: r * k, local, functools.partial(local)):
        got = prep.map_rows(fn, x, executor="processes", workers=2)
        assert torch.equal(got, torch.stack([fn(r) for r in x]))


def test_unpicklable_function_under_processes():
    lock = threading.Lock()
    with pytest.raises(prep.ConfigError, match=r"cannot be pickled.*picklable.*'threads'"):
        prep.map_rows(lambda r: r if lock else r, torch.ones(3, 2), executor="processes")


def _threads() -> set[str]:
    # multiprocessing's resource sharer (it hands file descriptors to workers) is one
    # server thread per interpreter by design, not something a pool owns
    return {
        t.name
        for t in threading.enumerate()
        if getattr(t, "_target", None).__class__.__name__ != "method"
        or "resource_sharer" not in getattr(t._target, "__module__", "")
    }


def test_pool_repr_and_close_leave_nothing(no_leaks):
    prep.shutdown()  # the warm pools of earlier tests are not this test's business
    assert wait_until(lambda: not pool_children())
    threads_before = _threads()
    for name in PER_ROW:
        with prep.Pool(name, workers=2) as pool:
            assert f"executor={name!r} workers=2" in repr(pool) and "open" in repr(pool)
            assert_same(pool.map_rows(rowfns.affine, torch.ones(6, 2)), torch.full((6, 2), 3.0))
        assert "closed" in repr(pool)
        with pytest.raises(prep.ConfigError, match="closed"):
            pool.map_rows(rowfns.affine, torch.ones(6, 2))
    assert wait_until(lambda: _threads() <= threads_before), _threads() - threads_before
    assert wait_until(lambda: not pool_children())


def test_warm_pool_is_reused_and_shutdown_closes_it(no_leaks):
    prep.shutdown()
    x = torch.ones(8, 2)
    prep.map_rows(rowfns.affine, x, executor="processes", workers=2)
    pids = set(pool_children())
    assert len(pids) == 2
    prep.map_rows(rowfns.affine, x, executor="processes", workers=2)
    assert set(pool_children()) == pids
    prep.shutdown()
    assert wait_until(lambda: not pool_children())


def test_a_shared_input_is_never_overwritten_by_the_next_batch():
    x = torch.arange(12.0).view(6, 2).share_memory_()
    before = x.clone()
    prep.map_rows(rowfns.affine, x, executor="processes", workers=2)
    prep.map_rows(rowfns.affine, torch.full((6, 2), -1.0), executor="processes", workers=2)
    assert torch.equal(x, before)


@pytest.mark.parametrize("executor", registry.without(PROCESSES))  # autograd is live here
def test_results_that_require_grad_are_stored_detached(executor):
    w = torch.ones(3, requires_grad=True)
    fn = prep.rowwise(batched=lambda b: b * w)(lambda r: r * w)  # a twin, for vectorized
    got = prep.map_rows(fn, torch.ones(5, 3), executor=executor, workers=2)
    assert not got.requires_grad and torch.equal(got, torch.ones(5, 3))


@pytest.mark.parametrize("executor", registry.executors(PROCESSES, NO_TWIN, SAMPLES))
def test_samples_with_conjugate_and_negative_views_travel_exactly(executor):
    samples = [torch.tensor([1 + 2j, 3 - 1j]).conj() for _ in range(4)]
    samples += [torch.tensor([1 + 2j, 3 - 1j])._neg_view() for _ in range(4)]
    got = prep.map_samples(rowfns.identity, samples, executor=executor, workers=2)
    assert torch.equal(got, torch.stack([s.resolve_conj().resolve_neg() for s in samples]))


def test_a_forked_child_starts_its_own_pools():
    import os

    prep.map_rows(rowfns.affine, torch.ones(4, 1), executor="processes", workers=2)
    assert prep.pool.SHARED._pools
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's warm pools must be gone
        os.write(w, b"1" if not prep.pool.SHARED._pools else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_explain_refuses_an_empty_batch():
    with pytest.raises(ValueError, match="0 rows"):
        prep.explain(rowfns.affine, torch.empty(0, 3))


def test_threads_never_change_the_callers_torch_threads_nor_new_threads_default():
    def new_thread_sees() -> int:
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        return seen[0]

    before, default = torch.get_num_threads(), new_thread_sees()
    with prep.Pool("threads", workers=4) as pool:
        got = pool.map_rows(rowfns.thread_settings, torch.zeros(8, 1))
        assert set(got[:, 0].tolist()) == {max(1, available_cores() // 4)}  # each worker's own
        assert torch.get_num_threads() == before
        assert new_thread_sees() == default


def test_two_threads_first_calls_build_one_executor(no_leaks):
    x = torch.arange(8.0).view(8, 1)
    with prep.Pool("processes", workers=2) as pool:
        got = {}
        start = threading.Barrier(2)

        def call(k: int) -> None:
            start.wait()
            got[k] = pool.map_rows(rowfns.affine, x)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(pool._warm.made()) == 1 and len(pool._get("processes").engine.pids) == 2
        assert all(torch.equal(v, x * 2 + 1) for v in got.values()) and len(got) == 2


def test_a_forked_childs_close_leaves_the_parents_workers_alone():
    import os

    x = torch.arange(8.0).view(8, 1)
    with prep.Pool("processes", workers=2) as pool:
        pool.map_rows(rowfns.affine, x)
        workers = pool._get("processes").engine.pids
        pid = os.fork()
        if pid == 0:  # the child: its copy of the pool is closed (and garbage-collected)
            pool.close()
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.3)  # a "close" sent down the parent's pipes would have been obeyed
        assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)
        assert pool._get("processes").engine.pids == workers  # the same workers, never stopped


def test_an_output_made_like_a_chunk_stays_on_the_chunks_device():
    # a thread's chunk of a GPU batch made the batch's output on the CPU (found on a GPU
    # machine: threads on a CUDA batch); meta tensors show the device without one
    from prep.core.output import Output

    chunk = Output(("leaf",), [torch.empty(2, 3, device="meta")])  # type: ignore[arg-type]
    assert chunk.like(5).buffers[0].device.type == "meta"
    assert chunk.like(5, device="cpu").buffers[0].device.type == "cpu"
    assert chunk.like(5).buffers[0].shape == (5, 3)
