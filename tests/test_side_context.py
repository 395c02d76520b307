"""prep.ops.side_context: the batched op, its row twin and the loop agree bit for bit."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prep
import prep.ops
from benchmarks.baselines import side_context_loop
from prep.errors import VmapUnsupported
from prep.ops import side_context, side_context_row
from tests import registry
from tests.registry import READS_VALUES

DTYPES = [torch.float32, torch.float16, torch.int64, torch.bool]
SLOW_EXECUTORS = set(registry.executors(registry.PROCESSES))


def make_inputs(
    B: int, L: int, feat: tuple[int, ...], dtype: torch.dtype, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-50, 50, (B, L, *feat), generator=g)
    return values > 0 if dtype == torch.bool else values.to(dtype)


# ------------------------------------------------------------------ properties


@st.composite
def cases(draw: st.DrawFn) -> dict:
    B = draw(st.integers(0, 8))
    L = draw(st.integers(0, 12))
    feat = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    kinds = st.sampled_from(["empty", "full", "first", "last", "scattered", "span"])
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        kind = draw(kinds)  # per row: an empty first row next to full ones, ...
        if L == 0 or kind == "empty":
            continue
        if kind == "full":
            mask[b] = True
        elif kind in ("first", "last"):
            mask[b, 0 if kind == "first" else L - 1] = True
        elif kind == "span":
            i = draw(st.integers(0, L - 1))
            mask[b, i : draw(st.integers(i + 1, L))] = True
        else:
            mask[b] = torch.tensor(draw(st.lists(st.booleans(), min_size=L, max_size=L)))
    if draw(st.booleans()):
        mask = mask.to(draw(st.sampled_from([torch.int64, torch.uint8, torch.int32])))
    lengths = None
    if draw(st.booleans()):
        lengths = torch.tensor(
            draw(st.lists(st.integers(0, L), min_size=B, max_size=B)), dtype=torch.int64
        ).view(B)
    return dict(
        inputs=make_inputs(B, L, feat, draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 9))),
        mask=mask,
        lengths=lengths,
        side=draw(st.sampled_from(["left", "right"])),
        max_len=draw(st.integers(0, 15)),
        pad_value=draw(st.sampled_from([0, 1])),
    )


@settings(max_examples=60, deadline=None)
@given(cases())
def test_vectorized_equals_loop(case: dict) -> None:
    expected = side_context_loop(**case)
    got, valid = side_context(**case, return_mask=True)
    assert got.dtype == case["inputs"].dtype
    assert torch.equal(got, expected)
    assert valid.dtype == torch.bool and valid.shape == got.shape[:2]
    assert torch.equal(got[~valid], torch.full_like(got[~valid], case["pad_value"]))
    # valid marks exactly the copied tokens: a pad value that never occurs shows them
    if case["inputs"].dtype != torch.bool:
        copied = side_context(**{**case, "pad_value": 99}) != 99
        assert torch.equal(valid, copied.flatten(2).all(2) if copied.dim() > 2 else copied)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_out_and_row_equal_loop(case: dict) -> None:
    expected = side_context_loop(**case)
    out = torch.full_like(expected, 7)
    assert side_context(**case, out=out) is out
    assert torch.equal(out, expected)
    lengths = case.pop("lengths")
    inputs, mask = case.pop("inputs"), case.pop("mask")
    for b in range(inputs.shape[0]):
        length = None if lengths is None else lengths[b]
        row = side_context_row(inputs[b], mask[b], length=length, **case)
        assert torch.equal(row, expected[b])


# ------------------------------------------------------------------ executors


def executor_params() -> list:
    marks = {
        name: [pytest.mark.timeout(60)] if name in SLOW_EXECUTORS else [] for name in prep.EXECUTORS
    }
    # the row function reads the mask's values: vmap refuses it (tests/registry.py; below)
    return [pytest.param(name, marks=marks[name]) for name in registry.executors(READS_VALUES)]


def test_vmap_refuses_the_data_dependent_row_function() -> None:
    inputs, mask = make_inputs(3, 5, (), torch.int64), torch.eye(3, 5, dtype=torch.bool)
    fn = functools.partial(side_context_row, max_len=2)
    with pytest.raises(VmapUnsupported, match="executor='vmap' cannot run .*dynamic shape"):
        prep.map_rows(fn, (inputs, mask), executor="vmap")


@pytest.mark.parametrize("executor", executor_params())
@pytest.mark.parametrize("side", ["left", "right"])
def test_map_rows_equals_batched(executor: str, side: str) -> None:
    B, L = (6, 10) if executor in SLOW_EXECUTORS else (40, 24)
    inputs = make_inputs(B, L, (3,), torch.float32)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        mask[b, (b * 7) % L : (b * 7) % L + b % 3] = True  # includes empty rows
    lengths = torch.arange(B) % (L + 1)
    fn = functools.partial(side_context_row, side=side, max_len=5, pad_value=-1)
    kw = dict(side=side, max_len=5, pad_value=-1)
    got = prep.map_rows(fn, (inputs, mask), executor=executor, workers=2)
    assert torch.equal(got, side_context(inputs, mask, **kw))
    got = prep.map_rows(
        fn, {"x": inputs, "mask": mask, "length": lengths}, executor=executor, workers=2
    )
    assert torch.equal(got, side_context(inputs, mask, lengths=lengths, **kw))


def test_vectorized_executor_calls_the_batched_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, mask = make_inputs(3, 5, (), torch.int64), torch.eye(3, 5, dtype=torch.bool)
    fn = functools.partial(side_context_row, side="right", max_len=2)
    module = importlib.import_module("prep.ops.side_context")  # the attribute is the function
    monkeypatch.setattr(module, "check_length", None)  # any row call fails
    got = prep.map_rows(
        fn, {"x": inputs, "mask": mask, "length": torch.tensor([5, 1, 4])}, executor="vectorized"
    )
    assert torch.equal(got, torch.tensor([[inputs[0, 1], inputs[0, 2]], [0, 0], [inputs[2, 3], 0]]))


# ------------------------------------------------------------------ the seed's bugs


IDS = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]])


def test_token_next_to_the_span_is_kept() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 0]])
    assert side_context(IDS, mask, side="left", max_len=4).tolist() == [[0, 10, 11, 12]]
    assert side_context(IDS, mask, side="right", max_len=2).tolist() == [[15, 16]]


def test_span_at_position_zero_gives_all_padding_on_the_left() -> None:
    mask = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0]])
    assert side_context(IDS, mask, side="left", max_len=3).tolist() == [[0, 0, 0]]


def test_right_context_is_bounded_by_the_sequence_not_the_features() -> None:
    inputs = torch.arange(4 * 6, dtype=torch.float32).view(1, 4, 6)  # F > L
    mask = torch.tensor([[1, 0, 0, 0]])
    got = side_context(inputs, mask, side="right", max_len=5)
    assert torch.equal(got[0, :3], inputs[0, 1:4]) and not got[0, 3:].any()
    got = side_context(inputs, mask, side="right", max_len=5, lengths=torch.tensor([2]))
    assert torch.equal(got[0, :1], inputs[0, 1:2]) and not got[0, 1:].any()


def test_context_longer_than_max_len_is_cut_to_the_nearest_tokens() -> None:
    mask = torch.tensor([[0, 0, 0, 0, 1, 0, 0, 0]])
    assert side_context(IDS, mask, side="left", max_len=2).tolist() == [[12, 13]]
    assert side_context(IDS, mask, side="right", max_len=2).tolist() == [[15, 16]]


def test_empty_mask_on_the_first_row() -> None:
    inputs = make_inputs(2, 5, (3,), torch.float32)
    mask = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 1, 0, 0]])
    for fn in (side_context, side_context_loop):
        got = fn(inputs, mask, side="left", max_len=3)
        assert not got[0].any() and torch.equal(got[1, 1:], inputs[1, :2])


def test_integer_ids_stay_integer_with_their_pad_value() -> None:
    mask = torch.tensor([[0, 1, 0, 0, 0, 0, 0, 0]])
    for fn in (side_context, side_context_loop):
        got = fn(IDS, mask, side="left", max_len=3, pad_value=-100)
        assert got.dtype == torch.int64 and got.tolist() == [[-100, -100, 10]]


def test_edges_max_len_zero_and_longer_than_rows() -> None:
    mask = torch.tensor([[0, 0, 1, 0, 0, 0, 0, 1]])
    assert side_context(IDS, mask, side="right", max_len=3).tolist() == [[0, 0, 0]]
    assert side_context(IDS, mask, side="left", max_len=0).shape == (1, 0)
    assert side_context(IDS, mask, side="left", max_len=11).tolist() == [[0] * 9 + [10, 11]]
    # a span beyond lengths: left context is the valid tokens, right is empty
    got = side_context(IDS, mask, side="left", max_len=3, lengths=torch.tensor([1]))
    assert got.tolist() == [[0, 0, 10]]


# ------------------------------------------------------------------ autograd, devices


def test_gradcheck() -> None:
    inputs = torch.randn(3, 6, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0] * 6])
    for side in ("left", "right"):
        fn = functools.partial(side_context, mask=mask, side=side, max_len=4, pad_value=0.5)
        assert torch.autograd.gradcheck(fn, (inputs,))


def test_gradients_match_the_loop() -> None:
    base = torch.randn(4, 7, 3)
    mask = torch.tensor([[0, 1, 0, 0, 0, 0, 0]] * 4)
    lengths = torch.tensor([7, 3, 1, 0])
    grads = []
    for fn in (side_context, side_context_loop):
        x = base.clone().requires_grad_()
        (
            fn(x, mask, side="right", max_len=4, lengths=lengths) * torch.arange(4.0)[:, None]
        ).sum().backward()
        grads.append(x.grad)
    assert torch.equal(*grads)


def test_out_refuses_inputs_that_require_grad() -> None:
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="out= cannot record autograd history"):
        side_context(x, torch.ones(2, 4, dtype=torch.bool), max_len=2, out=torch.empty(2, 2))
    with torch.no_grad():
        side_context(x, torch.ones(2, 4, dtype=torch.bool), max_len=2, out=torch.empty(2, 2))


def test_non_contiguous_inputs_and_out() -> None:
    inputs = make_inputs(5, 9, (4,), torch.float32).transpose(0, 1).contiguous().transpose(0, 1)
    mask = torch.zeros(5, 9, dtype=torch.bool)
    mask[:, 4] = True
    expected = side_context_loop(inputs, mask, side="left", max_len=3)
    out = torch.empty(3, 5, 4).transpose(0, 1)  # B and max_len cannot be merged
    assert torch.equal(side_context(inputs, mask, side="left", max_len=3, out=out), expected)
    assert torch.equal(out, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype: torch.dtype) -> None:
    inputs = make_inputs(64, 50, (8,), dtype)
    mask = torch.zeros(64, 50, dtype=torch.bool)
    for b in range(64):
        mask[b, b % 50 : (b % 50) + b % 4] = True
    lengths = torch.arange(64) % 51
    for side in ("left", "right"):
        kw = dict(side=side, max_len=12, lengths=lengths)
        expected = side_context(inputs, mask, **kw)
        got = side_context(inputs.cuda(), mask.cuda(), **{**kw, "lengths": lengths.cuda()})
        assert got.device.type == "cuda" and torch.equal(got.cpu(), expected)
        out = torch.empty_like(got)
        side_context(inputs.cuda(), mask.cuda(), **{**kw, "lengths": lengths.cuda()}, out=out)
        assert torch.equal(out.cpu(), expected)


# ------------------------------------------------------------------ bad input


X, M = torch.zeros(2, 5, 3), torch.zeros(2, 5, dtype=torch.bool)
BAD = [
    (dict(inputs=torch.zeros(5)), ValueError, r"inputs has shape \(5,\).*\[B, L, \*F\]"),
    (dict(inputs=[1, 2]), TypeError, "inputs must be a Tensor, got list"),
    (dict(mask=torch.zeros(2, 5)), TypeError, "mask has dtype torch.float32"),
    (
        dict(mask=torch.zeros(2, 4, dtype=torch.bool)),
        ValueError,
        r"mask has shape \(2, 4\), expected \[B, L\] = \[2, 5\]",
    ),
    (dict(mask=torch.zeros(5, dtype=torch.bool)), ValueError, r"mask has shape \(5,\)"),
    (dict(side="middle"), ValueError, "side='middle' is not 'left' or 'right'"),
    (dict(max_len=-1), ValueError, "max_len=-1 is negative"),
    (dict(max_len=2.5), TypeError, "max_len=2.5 is a float"),
    (
        dict(lengths=torch.tensor([1, 6])),
        ValueError,
        r"lengths has values in \[1, 6\], outside \[0, L\] = \[0, 5\]",
    ),
    (dict(lengths=torch.tensor([-1, 2])), ValueError, r"outside \[0, L\]"),
    (
        dict(lengths=torch.tensor([1, 2, 3])),
        ValueError,
        r"lengths has shape \(3,\), expected \[B\] = \[2\]",
    ),
    (dict(lengths=torch.tensor([1.0, 2.0])), TypeError, "lengths has dtype torch.float32"),
    (
        dict(out=torch.zeros(2, 3, 3)),
        ValueError,
        r"out has shape \(2, 3, 3\), expected \[B, max_len, \*F\] = \[2, 4, 3\]",
    ),
    (
        dict(out=torch.zeros(2, 4, 3, dtype=torch.float64)),
        ValueError,
        "out is torch.float64 on cpu, expected torch.float32",
    ),
    (
        dict(pad_value=0.5, inputs=torch.zeros(2, 5, dtype=torch.int64)),
        ValueError,
        "pad_value=0.5 cannot be stored in torch.int64",
    ),
    (
        dict(pad_value=2, inputs=torch.zeros(2, 5, dtype=torch.bool)),
        ValueError,
        "pad_value=2 cannot be stored in torch.bool inputs; pass False or True",
    ),
    (dict(pad_value="0"), TypeError, "pad_value='0' is a str, expected a Python number"),
    (dict(lengths=[1, 2]), TypeError, r"lengths must be a Tensor of shape \[B\] = \[2\]"),
    (dict(out=torch.zeros(2, 4, 3).numpy()), TypeError, "out must be a Tensor or None"),
]


@pytest.mark.parametrize(("changes", "error", "match"), BAD)
def test_bad_input_names_the_argument(changes: dict, error: type, match: str) -> None:
    kw = {"inputs": X, "mask": M, "side": "left", "max_len": 4, **changes}
    with pytest.raises(error, match=match):
        side_context(**kw)
    if "out" not in changes:
        with pytest.raises(error, match=match):
            side_context_loop(**kw)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(x=torch.zeros(())), ValueError, r"x has shape \(\).*\[L, \*F\]"),
        (
            dict(mask=torch.zeros(4, dtype=torch.bool)),
            ValueError,
            r"mask has shape \(4,\), expected \[L\] = \[5\]",
        ),
        (dict(length=7), ValueError, r"length=7 is outside \[0, L\] = \[0, 5\]"),
        (dict(length=torch.tensor([2])), ValueError, "expected a 0-d integer tensor"),
        (dict(side="up"), ValueError, "side='up'"),
    ],
)
def test_bad_row_input(kw: dict, error: type, match: str) -> None:
    args = {"x": torch.zeros(5, 2), "mask": torch.zeros(5, dtype=torch.bool), "max_len": 2, **kw}
    with pytest.raises(error, match=match):
        side_context_row(**args)


# ------------------------------------------------------------------ the benchmark script


@pytest.mark.timeout(120)
def test_benchmark_script_runs_quick(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(__file__).parent.parent / "scripts" / "bench_side_context.py"
    spec = importlib.util.spec_from_file_location("bench_side_context", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    bench.main(["--quick"])
    text = capsys.readouterr().out
    assert "| case |" in text and "largest allocation" in text
