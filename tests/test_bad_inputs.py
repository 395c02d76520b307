"""Wrong inputs get one clear error, on every executor where they apply.

One table per kind of mistake, loky crash-table style: each row is ``(call, error
type, message fragment)``, the call taking the executor's name, fed to
``pytest.mark.parametrize`` once per executor the row applies to. A fragment is
the part of the message a user acts on: the argument it names, or the fix.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

import prep
import prep.run
from prep.errors import VmapUnsupported
from tests import registry, rowfns
from tests.conftest import pool_children, shm_entries, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_after_the_tables():
    """The pools stay warm from row to row of the tables (a fresh process pool per row
    would cost seconds each); once they are done, nothing may be left behind."""
    before = shm_entries()
    yield
    prep.shutdown()
    assert wait_until(lambda: not pool_children()), f"processes left: {pool_children()}"
    assert wait_until(lambda: shm_entries() <= before), f"shm left: {shm_entries() - before}"


EVERY = list(registry.EVERY)
# what each case needs, in tests/registry.py's words: the executors that run it come
# from there (the refusals are tested in tests/test_refusals_registry.py)
NO_TWIN, READS_VALUES, SAMPLES = registry.NO_TWIN, registry.READS_VALUES, registry.SAMPLES
PAD, PER_ROW_ERRORS = registry.PAD, registry.PER_ROW_ERRORS

x = torch.arange(12.0).view(4, 3)
Call = Callable[[str], Any]


# ------------------------------------------------------------------ row functions
# at module level, so that worker processes can import them


def double(row: torch.Tensor) -> torch.Tensor:
    return row * 2


def make_state() -> int:
    return 1


def reads_value(row: torch.Tensor) -> torch.Tensor:
    """A Python branch on a value: vmap cannot trace it."""
    return row * 2 if int(row[0]) >= 0 else row


def data_dependent_shape(row: torch.Tensor) -> torch.Tensor:
    return row[row > 1]


def own_error(row: torch.Tensor) -> torch.Tensor:
    raise KeyError("the function's own error")


def longer(sample: torch.Tensor) -> torch.Tensor:
    return torch.cat([sample, sample])


def bad_row_1(kind: str) -> Callable[[torch.Tensor], Any]:
    return {"none": returns_none, "list": returns_list, "dtype": returns_double,
            "rank": returns_2d}[kind]  # fmt: skip


def returns_none(row: torch.Tensor) -> Any:
    return None if int(row[0]) == 3 else row * 2


def returns_list(row: torch.Tensor) -> Any:
    return [1, 2] if int(row[0]) == 3 else row * 2


def returns_double(row: torch.Tensor) -> Any:
    return row.double() if int(row[0]) == 3 else row * 2


def returns_2d(row: torch.Tensor) -> Any:
    return row[None] if int(row[0]) == 3 else row * 2


# ------------------------------------------------------------------ calls


def rows(fn: Any, batch: Any = x, **kw: Any) -> Call:
    return lambda ex: prep.map_rows(fn, batch, executor=ex, workers=2, **kw)


def samples(fn: Any, given: Any, **kw: Any) -> Call:
    return lambda ex: prep.map_samples(fn, given, executor=ex, workers=2, **kw)


def pool_samples(fn: Any, given: Any) -> Call:
    def call(ex: str) -> Any:
        with prep.Pool(ex, workers=2) as pool:
            return pool.map_samples(fn, given)

    return call


def pool_rows(fn: Any, batch: Any) -> Call:
    def call(ex: str) -> Any:
        with prep.Pool(ex, workers=2) as pool:
            return pool.map_rows(fn, batch)

    return call


META = torch.ones(4, 3, device="meta")
NAN = math.nan

# (id, call, expected error, message fragment): checked before any row, so every
# executor, batched ones and auto included, says the same
EVERY_EXECUTOR = [
    ("samples-int", samples(double, 5), TypeError, "samples=5 is not a sequence of samples"),
    ("samples-None", samples(double, None), TypeError, "samples=None is not a sequence"),
    ("samples-0d", samples(double, torch.tensor(3.0)), TypeError, "samples is a 0-d tensor"),
    ("pool-samples-int", pool_samples(double, 7), TypeError, "samples=7 is not a sequence"),
    ("pool-fn-not-callable", pool_samples(None, [x[0]]), TypeError,
     "fn=None is not a function but a NoneType; the row function comes first"),
    ("rows-swapped", lambda ex: prep.map_rows(x, double, executor=ex),  # type: ignore[arg-type]
     TypeError,
     "the arguments are swapped; call map_rows(fn, batch)"),
    ("samples-swapped",
     lambda ex: prep.map_samples(list(x), double, executor=ex),  # type: ignore[arg-type]
     TypeError,
     "the arguments are swapped; call map_samples(fn, samples)"),
    ("pool-rows-swapped", pool_rows(x, double), TypeError,
     "the arguments look swapped; call map_rows(fn, batch)"),
    ("pool-samples-swapped", pool_samples(list(x), double), TypeError,
     "the arguments look swapped; call map_samples(fn, samples)"),
    ("fn-not-callable", rows(3, x), TypeError, "fn=3 is not a function but an int"),
    ("setup-without-state", rows(double, setup=make_state), prep.ConfigError,
     "setup=make_state gives the row function its state as the keyword state=, but "
     "tests.test_bad_inputs.double has no state parameter"),
    ("meta-batch", rows(double, META), prep.ConfigError, "batch column 0 is on the meta device"),
    ("meta-batch-fill", rows(double, META, on_error="fill"), prep.ConfigError,
     "is on the meta device"),
    ("meta-dict-batch", rows(double, {"a": META}), prep.ConfigError,
     "batch column 'a' is on the meta device"),
    ("meta-samples", samples(double, [torch.ones(3, device="meta")] * 4), prep.ConfigError,
     "sample 0 is on the meta device"),
    ("meta-sample-tuple", samples(double, [(torch.ones(3, device="meta"),)] * 2),
     prep.ConfigError, "sample 0 is on the meta device"),
    ("timeout-negative-huge", rows(double, timeout=-(10**400)), ValueError,
     "is not a positive number of seconds"),
    ("timeout-str", rows(double, timeout="5"), TypeError, "timeout='5' is a str"),
]  # fmt: skip

# wrong values only a row's result shows: every executor that runs rows one by one
PER_ROW_EXECUTOR = [
    ("pad-overflows-float32", samples(longer, list(x), pad=1e40), ValueError,
     "pad=1e+40 does not fit the output's dtype float32"),
    ("pad-nan-int64", samples(longer, list(x.long()), pad=NAN), ValueError,
     "pad=nan does not fit the output's dtype int64"),
    ("pad-300-uint8", samples(longer, list(x.to(torch.uint8)), pad=300), ValueError,
     "pad=300 does not fit the output's dtype uint8"),
    ("fill-nan-int64", rows(rowfns.fail_on_5, torch.arange(8).view(8, 1), on_error="fill",
                            fill=NAN), ValueError, "fill=nan does not fit the output's dtype"),
    ("out-smaller-than-rows-with-pad", rows(double, out=torch.zeros(4, 2), pad=0),
     prep.StackError, "returned shape (3,), larger than the fixed (2,) (pad_to= or out=)"),
    ("bad-return-under-raise", rows(returns_none), TypeError,
     "on row 1, returned a NoneType (None)"),  # x's row 1 starts with 3
]  # fmt: skip

# what vmap cannot run says so (auto tries vmap itself, and falls back)
VMAP_ONLY = [
    ("reads-a-value", rows(reads_value), VmapUnsupported,
     "executor='{executor}' cannot run reads_value: {maker} raised RuntimeError"),
    ("dynamic-shape", rows(data_dependent_shape), VmapUnsupported,
     "cannot read values (.item(), int(row[0]), a Python if on data) nor make shapes"),
    ("the-function-fails-by-itself", rows(own_error), KeyError, "the function's own error"),
]  # fmt: skip


def _table(
    cases: Sequence[tuple[str, Call, type[BaseException], str]], executors: list[str]
) -> Any:
    return pytest.mark.parametrize(
        ("executor", "call", "error", "fragment"),
        [
            pytest.param(ex, call, error, fragment, id=f"{name}-{ex}")
            for name, call, error, fragment in cases
            for ex in executors
        ],
    )


@_table(EVERY_EXECUTOR, EVERY)
def test_every_executor_refuses_it_before_any_row(executor, call, error, fragment):
    with pytest.raises(error) as raised:
        call(executor)
    assert fragment in str(raised.value)


@_table(PER_ROW_EXECUTOR, registry.executors(NO_TWIN, READS_VALUES, SAMPLES, PAD, PER_ROW_ERRORS))
def test_every_per_row_executor_names_the_argument(executor, call, error, fragment):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the failed rows' one warning
        with pytest.raises(error) as raised:
            call(executor)
    assert fragment in str(raised.value)


@_table(VMAP_ONLY, registry.without(READS_VALUES))
def test_vmap_says_why_it_cannot_run_a_function(executor, call, error, fragment):
    with pytest.raises(error) as raised:
        call(executor)
    maker = prep.EXECUTORS[executor]._maker  # what raised: "torch.func.vmap", or its compile
    assert fragment.format(executor=executor, maker=maker) in str(raised.value)
    if error is VmapUnsupported:
        assert "Use executor='auto'" in str(raised.value)
        assert raised.value.__cause__ is not None  # torch's own error rides along


# ------------------------------------------------------------------ bad return values


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN, READS_VALUES, PER_ROW_ERRORS))
@pytest.mark.parametrize("kind", ["none", "list", "dtype", "rank"])
def test_a_bad_return_value_is_a_failed_row_with_its_index(executor, kind):
    batch = torch.arange(8.0)[:, None].repeat(1, 3)  # row i holds i
    with pytest.warns(RuntimeWarning, match=r"1 of 8 rows failed and were filled"):
        out, valid, errors = prep.map_rows(
            bad_row_1(kind), batch, executor=executor, workers=2, on_error="fill", fill=-1,
            return_valid=True, return_errors=True,
        )  # fmt: skip
    assert valid.tolist() == [i != 3 for i in range(8)]
    assert list(errors) == [3] and errors[3].row == 3
    assert str(errors[3]).startswith("row 3: ")
    want = batch * 2
    want[3] = -1
    assert torch.equal(out, want)


@pytest.mark.parametrize(
    "executor", registry.executors(NO_TWIN, READS_VALUES, SAMPLES, PER_ROW_ERRORS)
)
def test_skip_leaves_a_bad_return_value_out(executor):
    with pytest.warns(RuntimeWarning, match=r"1 of 6 rows failed and were left out"):
        out = prep.map_samples(
            returns_none, list(torch.arange(6.0)[:, None]), executor=executor, workers=2,
            on_error="skip",
        )  # fmt: skip
    assert out.flatten().tolist() == [0.0, 2.0, 4.0, 8.0, 10.0]


# ------------------------------------------------------------------ autograd


@pytest.mark.parametrize("executor", EVERY)
def test_a_batch_that_requires_grad_runs_and_returns_no_history(executor):
    batch = torch.arange(12.0).reshape(3, 4).requires_grad_()
    fn = rowfns.affine  # has a twin, for vectorized
    got = prep.map_rows(fn, batch * 1, executor=executor, workers=2)  # a non-leaf batch
    assert not got.requires_grad and torch.equal(got, batch.detach() * 2 + 1)


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN, SAMPLES))
def test_results_and_samples_that_require_grad_run_everywhere(executor):
    w = torch.ones(4, requires_grad=True)
    got = prep.map_rows(lambda r: r * w, torch.ones(3, 4), executor=executor, workers=2)
    assert not got.requires_grad and torch.equal(got, torch.ones(3, 4))
    given = list(torch.arange(8.0).view(2, 4).requires_grad_() * 1)  # non-leaf views
    got = prep.map_samples(double, given, executor=executor, workers=2)
    assert not got.requires_grad and torch.equal(got, torch.arange(8.0).view(2, 4) * 2)


# ------------------------------------------------------------------ what is no error


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN))
def test_an_astronomical_timeout_is_no_limit(executor):
    got = prep.map_rows(double, x, executor=executor, workers=2, timeout=10**400)
    assert torch.equal(got, x * 2)
    assert prep.Pool(executor, timeout=1e300).timeout is None


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN, PAD))
def test_out_with_pad_is_honoured_where_rows_fit(executor):
    out = torch.full((4, 5), 7.0)
    got = prep.map_rows(double, x, executor=executor, workers=2, out=out, pad=-1)
    assert got is out
    assert torch.equal(out, torch.cat([x * 2, torch.full((4, 2), -1.0)], 1))


# ------------------------------------------------------------------ Collate and prep run


def test_collate_with_collate_says_how_fn_is_called():
    def aug(sample: dict) -> torch.Tensor:
        return sample["x"] * 2

    batch = [{"x": torch.ones(2)}, {"x": torch.zeros(2)}]
    plain = prep.Collate(aug, executor="serial")
    assert torch.equal(plain(batch), torch.tensor([[2.0, 2.0], [0.0, 0.0]]))
    plain.close()
    collate = prep.Collate(aug, executor="serial", collate=default_collate)
    with pytest.raises(TypeError, match=r"a dict \['x'\], so the function runs on each of its "
                       r"rows as map_rows does, fn\(x=\.\.\.\)"):  # fmt: skip
        collate(batch)
    collate.close()


def _prep(*args: object) -> int:
    from prep.cli import main

    return main([str(a) for a in args])


def test_prep_run_without_a_required_arg_names_each_shard_and_the_flag(tmp_path: Path, capsys):
    """A parameter no shard has a column for is a ShardError of each shard (issue 30: the
    file lacks the column, or the command an --arg): one line each, naming the file,
    the column and both fixes; exit code 1, no traceback."""
    data = tmp_path / "data"
    prep.run.make_shards(data, shards=3, rows=4, seq=6, dim=2)
    # --on-error skip: every shard runs (under stop, how many were in flight decides)
    code = _prep("run", data, "--out", tmp_path / "out", "--fn", "prep.ops:side_context_row",
                 "--on-error", "skip")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    failed = [line for line in err.splitlines() if "FAILED" in line]
    named = sorted(next(w for w in line.split() if w.startswith("shard-")) for line in failed)
    assert named == [f"shard-0000{k}.pt" for k in range(3)]  # in the order they finished
    for line in failed:
        assert "has no column 'max_len'" in line and "--arg max_len=VALUE" in line


def test_prep_run_with_an_argument_the_function_lacks(tmp_path: Path, capsys):
    data = tmp_path / "data"
    prep.run.make_shards(data, shards=1, rows=4, seq=6, dim=2)
    code = _prep("run", data, "--out", tmp_path / "out", "--fn", "prep.ops:side_context_row",
                 "--arg", "max_len=3", "--arg", "maxlen=3")  # fmt: skip
    assert code == 2
    assert "unexpected keyword argument 'maxlen'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"not a tensor file", "neither a zip archive nor a pickle"),
        (b"", "it is empty"),
        (b"\x80\x02garbage", "its pickle cannot be read"),
    ],
    ids=["text", "empty", "damaged-pickle"],
)
@pytest.mark.parametrize("trust", [False, True], ids=["safe", "trust-pickle"])
def test_a_foreign_or_damaged_pt_file_is_not_called_unsafe(tmp_path, content, fragment, trust):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    if trust and content.startswith(b"\x80"):
        pytest.skip("trusted, torch's own unpickler reads it: its error is what it is")
    with pytest.raises(prep.ShardError) as raised:
        prep.run.load_shard(path, trust_pickle=trust)
    assert fragment in str(raised.value) and "holds objects" not in str(raised.value)


def test_cluster_local_leaves_no_dask_scratch_space(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from prep.run.dask import DaskBackend

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    backend = DaskBackend("local", 1)
    try:
        assert any(scratch.iterdir())  # the workers' folder lives there while they run
    finally:
        backend.close()
    assert list(scratch.iterdir()) == []


def test_chunks_back_out_of_order_keep_the_lowest_good_rows_reference():
    """Under processes a worker checks its rows against its own first good one; the
    parent then keeps serial's reference, the lowest good row, whatever chunk comes
    back first: here rows 4-7 return float64 and come back before rows 0-3."""
    from prep.core.output import Output
    from prep.core.policy import Policy, ResultCheck
    from prep.core.rows import rows_of
    from prep.executors import Chunk, Job
    from prep.executors._chunks import ChunkMerge

    rows = rows_of(torch.zeros(8, 2)).checking(ResultCheck(padded=False))
    job = Job.new(double, rows, policy=Policy.of(on_error="fill", fill=-1))
    late = Output.allocate(torch.ones(2, dtype=torch.float64), 4, row=4, offset=4)
    late.buffers[0].fill_(4.0)
    early = Output.allocate(torch.ones(2), 4, row=0, offset=0)
    early.buffers[0].fill_(1.0)
    chunks = ChunkMerge(job)
    chunks.merge(Chunk(4, 8, late, []))
    chunks.merge(Chunk(0, 4, early, []))
    assert job.sink.failures.rows() == [4, 5, 6, 7]
    assert "row 4 returned a Tensor of shape (2,) float64, but row 0 returned" in str(
        job.sink.failures.errors[4]
    )
    assert job.sink.output is not None and job.sink.output.buffers[0].dtype == torch.float32
    assert job.sink.output.buffers[0].tolist() == [[1.0, 1.0]] * 4 + [[-1.0, -1.0]] * 4


def test_prep_run_with_setup_for_a_function_without_state(tmp_path: Path, capsys):
    data = tmp_path / "data"
    prep.run.make_shards(data, shards=1, rows=4, seq=6, dim=2)
    code = _prep("run", data, "--out", tmp_path / "out", "--fn", "prep.ops:side_context_row",
                 "--arg", "max_len=3", "--setup", "tests.test_bad_inputs:make_state")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "--setup tests.test_bad_inputs:make_state gives --fn" in err
    assert "has no state parameter" in err


def test_prep_run_explain_without_a_required_arg_says_so(tmp_path: Path, capsys):
    data = tmp_path / "data"
    prep.run.make_shards(data, shards=1, rows=4, seq=6, dim=2)
    code = _prep("run", data, "--out", tmp_path / "out", "--fn", "prep.ops:side_context_row",
                 "--explain")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err  # the first shard's ShardError, as its run's
    assert "shard-00000.pt: has no column 'max_len'" in err and "--arg max_len=VALUE" in err


def pair_only(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


# a call every row would fail alike: said once, before any row, on every executor
CALLS = [
    ("dict-names-unknown-to-fn", rows(double, {"a": x}), TypeError,
     "cannot take this batch's rows, each called as fn(a=...): missing a required argument"),
    ("one-column-for-two-params", rows(pair_only, x), TypeError,
     "each called as fn(row): missing a required argument: 'b'"),
    ("sample-fn-without-params", samples(make_state, list(x)), TypeError,
     "each called as fn(row): too many positional arguments"),
    ("pool-dict-names-unknown-to-fn", pool_rows(double, {"a": x}), TypeError,
     "each called as fn(a=...): missing a required argument: 'row'"),
]  # fmt: skip


@_table(CALLS, EVERY)
def test_a_function_that_cannot_take_the_rows_is_refused_once(executor, call, error, fragment):
    with pytest.raises(error) as raised:
        call(executor)
    assert fragment in str(raised.value)


def double_at_8_and_24(row: torch.Tensor) -> Any:
    """Rows 8 and 24 start a worker's chunk of a 64-row batch: there a worker's first
    good row is the bad one, and only the batch's reference can say so."""
    i = int(row[0])
    if i == 0:
        return None
    return row.double() if i in (8, 24) else row * 2


@pytest.mark.parametrize("executor", registry.executors(NO_TWIN, READS_VALUES, PER_ROW_ERRORS))
def test_a_bad_row_first_in_its_chunk_fails_alone(executor):
    batch = torch.arange(64.0)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out, valid = prep.map_rows(
            double_at_8_and_24, batch, executor=executor, workers=2, on_error="fill",
            fill=-1, return_valid=True,
        )  # fmt: skip
    assert (~valid).nonzero().flatten().tolist() == [0, 8, 24]
    want = batch * 2
    want[[0, 8, 24]] = -1
    assert torch.equal(out, want)


def test_rows_failed_against_a_reference_a_chunk_set_travel_back_with_their_results():
    # the first chunk back sets the batch's reference (here row 8's float64), but a
    # chunk of lower rows may yet replace it: a worker that fails rows against it must
    # send their results back, so that they are written once the reference changes
    import pickle

    from prep.core.output import Output
    from prep.core.policy import ResultCheck

    check = ResultCheck(padded=False)
    chunk = Output.allocate(torch.zeros(1, dtype=torch.float64), 8, row=8, offset=8)
    assert check.admit(chunk, 8, 16) == (None, [])
    in_worker = pickle.loads(pickle.dumps(check)).fresh()
    with pytest.raises(prep.StackError) as failed:
        in_worker(torch.zeros(1))  # float32 against float64
    assert torch.equal(failed.value.result, torch.zeros(1))
    # a reference the batch's own first row set is final: nothing travels back
    seeded = ResultCheck(padded=False)
    seeded.seed(Output.allocate(torch.zeros(1), 8, row=1))
    with pytest.raises(prep.StackError) as final:
        pickle.loads(pickle.dumps(seeded)).fresh()(torch.zeros(1, dtype=torch.float64))
    assert getattr(final.value, "result", None) is None


@pytest.mark.parametrize(
    ("dtype", "examples"),
    [(torch.uint8, "pad=0 or pad=255"), (torch.int8, "pad=0 or pad=-1")],
)
def test_a_pad_that_does_not_fit_suggests_only_values_the_dtype_holds(dtype, examples):
    with pytest.raises(ValueError) as caught:
        prep.map_rows(lambda r: r * 2, torch.zeros(3, 1, dtype=dtype), executor="serial",
                      pad=1000)  # fmt: skip
    text = str(caught.value)
    assert f"(e.g. {examples})" in text
    for value in ("-1", "0", "255"):  # every suggestion must itself fit
        if f"pad={value}" in text.split("(e.g. ")[1]:
            assert prep.core.output.fits(int(value), dtype)


def test_a_twin_without_the_columns_names_says_how_to_map_them():
    """A dict batch's columns go to the twin by name, as to the row function: a twin
    named otherwise is a ConfigError pointing at rename=, not the twin's TypeError."""
    x = torch.arange(8.0).view(4, 2)
    with pytest.raises(
        prep.ConfigError, match=r"no parameter for the batch's column\(s\) 'row'.*rename=\{'row'"
    ):
        prep.map_rows(rowfns.affine, {"row": x}, executor="vectorized")

    def twice(x):
        return x * 2 + 1

    mapped = prep.rowwise(batched=twice, rename={"row": "x"})(lambda row: row * 2 + 1)
    assert torch.equal(prep.map_rows(mapped, {"row": x}, executor="vectorized"), x * 2 + 1)
