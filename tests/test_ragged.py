"""Ragged rows (``pad=``, ``pad_to=``, ``return_lengths=``) and bad rows (``on_error=``,
``fill=``, ``return_valid=``), for every per-row executor."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep
from tests import registry, rowfns
from tests.registry import CRASH, NO_TWIN, PAD, PER_ROW_ERRORS, READS_VALUES, SAMPLES

pytestmark = pytest.mark.timeout(180)

#: the row functions here read values (rowfns.variable) and have no twin; the
#: executors that refuse these cases are tested in test_vmap_and_a_twin_..._refuse_padding
#: and test_a_batched_executor_refuses_a_per_row_policy
PADS = registry.executors(NO_TWIN, READS_VALUES, SAMPLES, PAD)
FILLS = registry.executors(NO_TWIN, READS_VALUES, SAMPLES, PER_ROW_ERRORS)
PADS_AND_FILLS = registry.executors(NO_TWIN, READS_VALUES, SAMPLES, PAD, PER_ROW_ERRORS)


def reference(rows: list[torch.Tensor], pad: float, size: tuple[int, ...] | None = None):
    """What padding means, built the plain way: a tensor full of ``pad`` and each row
    copied into its corner (as ``pad_sequence`` does for 1-D rows)."""
    dims = rows[0].dim()
    size = size or tuple(max(r.shape[d] for r in rows) for d in range(dims))
    out = torch.full((len(rows), *size), pad, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[(i, *(slice(0, s) for s in r.shape))] = r
    return out


def samples(lengths: list[int], fails: set[int] = frozenset()) -> list[torch.Tensor]:
    return [torch.tensor([n, int(i in fails), i + 1]) for i, n in enumerate(lengths)]


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return call(*args, **kwargs)


# ------------------------------------------------------------------ padding


@pytest.mark.parametrize("executor", PADS)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=70), pad=st.sampled_from([0, -1, 2.5])
)
def test_padded_rows_match_the_reference(executor, lengths, pad):
    got, lengths_out = prep.map_samples(
        rowfns.variable, samples(lengths), executor=executor, workers=2, pad=pad,
        return_lengths=True,
    )  # fmt: skip
    rows = [rowfns.variable(s) for s in samples(lengths)]
    assert torch.equal(got, reference(rows, pad))
    assert lengths_out.dtype == torch.int64 and lengths_out.tolist() == lengths


@pytest.mark.parametrize("executor", PADS)
@settings(max_examples=10, deadline=None)
@given(
    dims=st.integers(1, 3),
    dtype=st.integers(0, 3),
    shapes=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=40
    ),
)
def test_padded_rows_of_any_dims_and_dtype_match_the_reference(executor, dims, dtype, shapes):
    batch = [torch.tensor([dims, *s, dtype, i % 7 + 1]) for i, s in enumerate(shapes)]
    got = prep.map_samples(rowfns.shaped, batch, executor=executor, workers=2, pad=0)
    assert torch.equal(got, reference([rowfns.shaped(b) for b in batch], 0))


@pytest.mark.parametrize("executor", PADS)
def test_rows_sorted_by_length_and_per_leaf_pads(executor):
    """Longest last (the output grows at every row) and a dict result: ids padded with
    7 in both dims, the mask with False; lengths are ``[B, 2]`` for 2-D rows."""
    shapes = [(h, w) for h, w in zip(range(1, 41), range(2, 42))]
    batch = [torch.tensor([h, w, i]) for i, (h, w) in enumerate(shapes)]
    got, lengths = prep.map_samples(
        rowfns.ragged_2d, batch, executor=executor, workers=2,
        pad={"ids": 7, "mask": False}, return_lengths=True,
    )  # fmt: skip
    rows = [rowfns.ragged_2d(s) for s in batch]
    assert torch.equal(got["ids"], reference([r["ids"] for r in rows], 7))
    assert torch.equal(got["mask"], reference([r["mask"] for r in rows], False))
    assert lengths["ids"].tolist() == [list(s) for s in shapes]
    assert lengths["mask"].tolist() == [w for _, w in shapes]


@pytest.mark.parametrize("executor", PADS)
def test_pad_to_fixes_the_size_and_refuses_a_larger_row(executor):
    got = prep.map_samples(
        rowfns.variable, samples([3, 1, 5]), executor=executor, pad=0, pad_to=(8,)
    )
    assert got.shape == (3, 8)
    assert torch.equal(got, reference([rowfns.variable(s) for s in samples([3, 1, 5])], 0, (8,)))
    with pytest.raises(prep.StackError, match=r"row 2 returned shape \(5,\).*\(4,\)"):
        prep.map_samples(rowfns.variable, samples([3, 1, 5]), executor=executor, pad=0, pad_to=(4,))


def test_out_with_pad_is_filled_at_its_own_size():
    out = torch.empty(3, 6)
    got = prep.map_samples(rowfns.variable, samples([3, 1, 5]), executor="serial", pad=0, out=out)
    assert got is out
    assert torch.equal(out, reference([rowfns.variable(s) for s in samples([3, 1, 5])], 0, (6,)))


def test_ragged_rows_without_pad_still_fail_and_say_pad():
    with pytest.raises(prep.StackError, match="pass pad="):
        prep.map_samples(rowfns.variable, samples([3, 1]), executor="serial")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pad": "zero"}, TypeError, "pad='zero' is not a number"),
        ({"pad": 0, "pad_to": (3, -1)}, TypeError, "pad_to=.* is not a shape"),
        ({"pad": 0, "pad_to": (3, 4)}, ValueError, "pad_to=.* has 2 dims"),
        ({"on_error": "ignore"}, ValueError, "on_error='ignore' is not one of"),
        ({"fill": 1}, ValueError, "pass on_error='fill'"),
        ({"on_error": "fill", "fill": "x"}, TypeError, "fill='x' is not a number"),
        ({"return_lengths": 1}, TypeError, "return_lengths=1 is not True or False"),
    ],
)
def test_bad_options_name_the_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        prep.map_samples(rowfns.variable, samples([2, 3]), executor="serial", **kwargs)


def test_dims_and_dtypes_must_still_agree():
    def bad(sample):
        return torch.zeros(int(sample[0])) if int(sample[2]) == 1 else torch.zeros(2, 2)

    with pytest.raises(prep.StackError, match="number of dims"):
        prep.map_samples(bad, samples([2, 3]), executor="serial", pad=0)


def test_vmap_and_a_twin_without_pad_refuse_padding():
    x = torch.ones(4, 3)
    with pytest.raises(prep.ConfigError, match="vmap' cannot return ragged rows"):
        prep.map_rows(torch.neg, x, executor="vmap", pad=0)
    twin = prep.rowwise(batched=lambda b: -b)(lambda r: -r)
    with pytest.raises(prep.ConfigError, match="takes no pad argument"):
        prep.map_rows(twin, x, executor="vectorized", pad=0)
    padded = prep.rowwise(batched=lambda b, pad: -b + pad)(lambda r: -r)
    with pytest.warns(RuntimeWarning, match="gives row 0 other values"):  # -r + pad != -r
        assert torch.equal(prep.map_rows(padded, x, executor="vectorized", pad=1), -x + 1)


def test_auto_with_pad_leaves_the_batched_forms_out_and_says_why():
    with prep.Pool("auto", workers=2) as pool:
        got = pool.map_rows(rowfns.variable, torch.stack(samples([3, 1, 5, 2] * 16)), pad=0)
        assert got.shape == (64, 5)
        assert "with pad=, rows are padded one by one" in pool.explain()


# ------------------------------------------------------------------ bad rows


@pytest.mark.parametrize("executor", FILLS)
@pytest.mark.parametrize("where", ["first", "scattered", "last"])
def test_fill_and_skip(executor, where):
    n = 40
    fails = {"first": {0, 1}, "scattered": {3, 17, 18, 33}, "last": {n - 1}}[where]
    batch = samples([4] * n, fails)
    with pytest.warns(RuntimeWarning, match=rf"{len(fails)} of {n} rows failed.*row {min(fails)}"):
        out, valid = prep.map_samples(
            rowfns.variable, batch, executor=executor, workers=2, on_error="fill", fill=-5,
            return_valid=True,
        )  # fmt: skip
    assert valid.tolist() == [i not in fails for i in range(n)]
    for i in range(n):
        assert torch.equal(out[i], torch.full((4,), -5.0 if i in fails else i + 1.0)), i
    skipped, valid2 = quiet(
        prep.map_samples, rowfns.variable, batch, executor=executor, workers=2,
        on_error="skip", return_valid=True,
    )  # fmt: skip
    assert torch.equal(valid2, valid)
    assert torch.equal(skipped, out[valid])


@pytest.mark.parametrize("executor", PADS_AND_FILLS)
def test_fill_with_padding_pads_failed_rows_and_gives_them_length_0(executor):
    batch = samples([2, 5, 3, 1], fails={1})
    out, lengths, valid = quiet(
        prep.map_samples, rowfns.variable, batch, executor=executor, workers=2, pad=-1,
        on_error="fill", return_lengths=True, return_valid=True,
    )  # fmt: skip
    assert out.shape == (4, 3)  # the failed row's 5 never counted
    assert out[1].tolist() == [-1, -1, -1]
    assert lengths.tolist() == [2, 0, 3, 1] and valid.tolist() == [True, False, True, True]


@pytest.mark.parametrize("executor", FILLS)
def test_every_row_failing_says_so(executor):
    with pytest.raises(prep.RowError, match="every one of the 6 rows failed"):
        quiet(
            prep.map_samples, rowfns.variable, samples([2] * 6, set(range(6))),
            executor=executor, workers=2, on_error="skip",
        )  # fmt: skip


def test_every_row_failing_with_out_fills_out():
    out = torch.zeros(3, 2)
    got = quiet(
        prep.map_samples, rowfns.variable, samples([2] * 3, {0, 1, 2}), executor="serial",
        on_error="fill", fill=9, out=out,
    )  # fmt: skip
    assert got is out and torch.equal(out, torch.full((3, 2), 9.0))


def test_raise_stays_the_default_and_timeouts_are_not_row_errors():
    with pytest.raises(prep.RowError, match="row 1: ValueError: bad sample 2"):
        prep.map_samples(rowfns.variable, samples([2, 2], {1}), executor="threads")
    with pytest.raises(prep.BatchTimeout):
        prep.map_rows(
            rowfns.hang, torch.arange(4.0).view(4, 1), executor="threads", timeout=0.5,
            on_error="fill",
        )  # fmt: skip


def test_a_batched_executor_refuses_a_per_row_policy():
    with pytest.raises(prep.ConfigError, match="needs a per-row executor"):
        prep.map_rows(torch.neg, torch.ones(3, 2), executor="vmap", on_error="fill")


def test_auto_keeps_a_vmap_choice_and_runs_a_bad_batch_row_by_row():
    def halve(row: torch.Tensor) -> torch.Tensor:
        return torch.where(row > 0, row / 2, row)

    def halve_or_fail(row: torch.Tensor) -> torch.Tensor:
        if row.dim() and bool((row < 0).any()):  # under vmap: never (a tracer raises)
            raise ValueError("negative")
        return halve(row)

    x = torch.rand(256, 8) + 0.1
    bad = x.clone()
    bad[5] = -1.0
    with prep.Pool("auto", workers=2) as pool:
        good = pool.map_rows(halve_or_fail, x, on_error="fill")
        assert torch.equal(good, x / 2)
        out, valid = quiet(pool.map_rows, halve_or_fail, bad, on_error="fill", return_valid=True)
    assert not valid[5] and valid.sum() == 255
    assert torch.equal(out[valid], bad[valid] / 2) and torch.equal(out[5], torch.zeros(8))


# ------------------------------------------------------------------ Collate


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_pads_variable_length_samples_in_a_dataloader(num_workers):
    data = samples([3, 7, 1, 4, 6, 2, 5, 8])
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, num_workers=num_workers,
        collate_fn=prep.Collate(rowfns.variable, executor="threads", workers=1, pad=0,
                                return_lengths=True),
    )  # fmt: skip
    got = list(loader)
    for k, (out, lengths) in enumerate(got):
        part = data[4 * k : 4 * k + 4]
        assert torch.equal(out, reference([rowfns.variable(s) for s in part], 0))
        assert lengths.tolist() == [int(s[0]) for s in part]


# ------------------------------------------------------------------ rows that kill


@pytest.mark.parametrize("executor", registry.executors(CRASH, READS_VALUES, PER_ROW_ERRORS))
@pytest.mark.parametrize(
    "fn", [rowfns.segfault, rowfns.suicide, rowfns.exits], ids=["segfault", "sigkill", "os._exit"]
)
def test_a_row_that_kills_its_worker_is_the_only_failed_row(no_leaks, executor, fn):
    x = torch.arange(24.0).view(24, 1)
    with prep.Pool(executor, workers=2) as pool:
        with pytest.warns(RuntimeWarning, match=r"1 of 24 rows failed.*row 1: .*died"):
            out, valid = pool.map_rows(fn, x, on_error="fill", fill=-1, return_valid=True)
        assert valid.tolist() == [i != 1 for i in range(24)]
        assert out[1].item() == -1 and torch.equal(out[valid], x[valid])
        assert torch.equal(pool.map_rows(rowfns.affine, x), x * 2 + 1)  # the pool recovered
        with pytest.raises(prep.WorkerCrashed):  # under "raise" it stays a crash
            pool.map_rows(fn, x)


@pytest.mark.parametrize("executor", PADS_AND_FILLS)
def test_a_failed_row_is_filled_whole_even_when_a_longer_row_comes_after(executor):
    """fill differs from pad: the failed rows must hold fill across the final width,
    whatever order the rows finished in (no bytes that depend on the executor)."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 60, (200,), generator=g).tolist()
    fails = set(range(0, 200, 7))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = prep.map_samples(
            rowfns.variable, samples(lengths, fails), executor=executor, workers=2,
            pad=0, on_error="fill", fill=-1,
        )  # fmt: skip
    assert [w.filename for w in seen] == [__file__]  # one warning, pointing at the caller
    rows = [
        torch.full((max(lengths),), -1.0) if i in fails else rowfns.variable(s)
        for i, s in enumerate(samples(lengths, fails))
    ]
    assert torch.equal(
        out, reference(rows, 0.0, (max(n for i, n in enumerate(lengths) if i not in fails),))
    )


def test_return_errors_gives_each_failed_rows_error():
    out, valid, errors = quiet(
        prep.map_samples, rowfns.variable, samples([2, 2, 2, 2], {1, 3}), executor="threads",
        on_error="fill", return_valid=True, return_errors=True,
    )  # fmt: skip
    assert sorted(errors) == [1, 3] and not valid[1] and not valid[3]
    assert isinstance(errors[1], prep.RowError) and isinstance(errors[1].__cause__, ValueError)
    assert str(errors[3].__cause__) == "bad sample 4"


def test_out_elsewhere_keeps_pad_and_lengths():
    """out= on another device than the batch is filled through a CPU staging output:
    that staging must pad as out= would, and the lengths are the rows' own (the meta
    device stands in for a GPU: copies into it are checked for shape, not data)."""
    out = torch.empty(3, 6, dtype=torch.int64, device="meta")
    got, lengths = prep.map_samples(
        torch.arange, [2, 4, 1], executor="serial", pad=0, out=out, return_lengths=True
    )
    assert got is out and lengths.tolist() == [2, 4, 1]


# ------------------------------------------------------------------ held rows


def _held_output(rows: list[torch.Tensor], *, shared: bool = False):
    from prep.core.padding import Padding, allocate

    return allocate(rows[0], len(rows), padding=Padding(pad=-1), shared=shared)


def test_one_dim_rows_are_held_then_padded_once_without_growing():
    rows = [torch.arange(n) for n in (3, 7, 1, 9, 4)]
    out = _held_output(rows)
    out.write_block(2, rows[2:])  # blocks may come in any order (threads)
    out.write_block(0, rows[:2])
    assert out.holding and len(out.held) == 2  # nothing written yet
    out.finish()
    assert out.growths == [0] and not out.held
    assert torch.equal(out.buffers[0], reference(rows, -1))
    assert out.lengths().tolist() == [3, 7, 1, 9, 4]


def test_held_rows_settle_the_growing_way_when_a_row_fails():
    rows = [torch.arange(n) for n in (3, 7, 1, 9)]
    out = _held_output(rows)
    out.write_block(0, rows[:2])
    out.fail(2, 5)  # a failed row: the held rows are written first
    assert not out.held and not out.holding
    out.write_block(3, rows[3:])
    out.finish()
    want = reference(rows, -1)
    want[2] = 5
    assert torch.equal(out.buffers[0], want)
    assert out.lengths().tolist() == [3, 7, 0, 9]


def test_held_rows_travel_when_the_output_is_pickled():
    import pickle

    rows = [torch.arange(n) for n in (2, 5, 3)]
    out = _held_output(rows)
    out.write_block(0, rows)
    back = pickle.loads(pickle.dumps(out))
    back.finish()
    assert torch.equal(back.buffers[0], reference(rows, -1))


def test_a_shared_output_is_never_held():
    # another process reads shared memory without a word: every row must be in it
    rows = [torch.arange(n) for n in (2, 5)]
    out = _held_output(rows, shared=True)
    out.write_block(0, rows)
    assert not out.holding and not out.held
    assert torch.equal(out.buffers[0], reference(rows, -1))


def test_a_row_of_another_dtype_after_held_rows_names_it():
    rows = [torch.arange(n) for n in (2, 5)]
    out = _held_output(rows)
    out.write_block(0, rows[:1])
    with pytest.raises(prep.StackError, match="row 1 returned shape"):
        out.write_block(1, [torch.ones(3)])
