"""executor 'compiled' (``torch.compile`` of vmap of the row function) and how auto weighs
it: a batched form whose compile is a start, rented or bought, held to serial's rows.

The suites over the registry run it on torch.compile's eager backend (tests/conftest.py);
here a counting or lying backend stands in for inductor where a test needs to see what
was compiled, and the tests marked ``inductor`` compile for real (seconds each)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import prep
from prep.auto import Decisions
from prep.auto._forms import CompiledModel
from prep.core.rows import rows_of
from prep.core.rowwise import atol_of
from prep.executors import CompiledExecutor, Job
from prep.executors import compiled as compiled_module
from tests.refs import loop

pytestmark = pytest.mark.timeout(120)


def chain(row: torch.Tensor) -> torch.Tensor:
    y = row * 1.5 - 0.25
    y = y.abs().sqrt()
    y = y * row + 1.0
    return torch.where(y > 1.0, y, 0.5 * y).clamp(-2.0, 2.0) / 3.0


class Counting:
    """A backend that counts the graphs it is given and runs them as they are; ``shift``
    adds to every float output (a compiled form that lies)."""

    def __init__(self, shift: float = 0.0, fails: bool = False) -> None:
        self.graphs, self.shift, self.fails = 0, shift, fails

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        if self.fails:
            raise RuntimeError("no C++ compiler here")

        def run(*args: Any) -> Any:
            out = gm(*args)
            shifted = [o + self.shift if o.is_floating_point() else o for o in out]
            return type(out)(shifted) if isinstance(out, (tuple, list)) else shifted[0]

        return run


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Counting:
    counting = Counting()
    monkeypatch.setattr(compiled_module, "BACKEND", counting)
    return counting


# ------------------------------------------------------------ the executor


def test_it_gives_serials_rows_and_compiles_a_function_once_for_every_batch_size(backend):
    with prep.Pool("compiled") as pool:
        for n in (8, 32, 5, 64):  # the batch dimension is compiled dynamic
            x = torch.randn(n, 16)
            got = pool.map_rows(chain, x)
            assert torch.equal(got, loop(chain, x)), n
    assert backend.graphs == 1


def test_named_columns_and_a_partial_run_as_under_vmap(backend):
    import functools

    def add(a: torch.Tensor, b: torch.Tensor, k: float) -> torch.Tensor:
        return a * k + b.sum()

    batch = {"a": torch.randn(6, 3), "b": torch.randn(6, 2)}
    fn = functools.partial(add, k=2.0)
    got = prep.map_rows(fn, batch, executor="compiled")
    want = torch.stack([fn(a, b) for a, b in zip(batch["a"], batch["b"])])  # a plain loop
    assert torch.equal(got, want)


def _scale(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda row: row * k + 1


def test_each_function_compiles_apart_past_dynamos_limit_and_the_table_is_bounded(backend):
    """dynamo keeps at most 8 compiled entries per code object before it runs the code
    eagerly: each function's form has a code object of its own, so the 9th compiles too."""
    ex = CompiledExecutor()
    x = torch.randn(4, 3)
    fns = [_scale(float(k)) for k in range(compiled_module.FORMS + 2)]
    for fn in fns:
        out = ex.run(Job.new(fn, rows_of(x)))
        assert out is not None and torch.equal(out.buffers[0], torch.func.vmap(fn)(x))
    assert backend.graphs == len(fns)
    assert len(ex._forms) == compiled_module.FORMS  # the oldest forgotten first
    ex.close()
    assert not ex._forms


def test_what_vmap_refuses_it_refuses_for_vmaps_reasons(backend):
    x = torch.randn(4, 3)
    with pytest.raises(prep.VmapUnsupported, match="executor='compiled' cannot run") as info:
        prep.map_rows(lambda row: row * int(row[0] > 0), x, executor="compiled")
    assert ".item()" in str(info.value) or "vmap" in str(info.value)
    assert backend.graphs == 0  # refused on one row, eagerly, before any compile


def test_rowwise_atol_alone_declares_the_compiled_forms_tolerance():
    @prep.rowwise(atol=1e-6)
    def fn(row: torch.Tensor) -> torch.Tensor:
        return row

    import functools

    assert atol_of(fn) == 1e-6 and atol_of(functools.partial(fn)) == 1e-6
    assert atol_of(chain) == 0.0
    assert prep.core.rowwise.twin_of(fn) is None  # no twin: executor 'vectorized' refuses it
    with pytest.raises(TypeError, match="give the twin too"):
        prep.rowwise(rename={"x": "y"})
    with pytest.raises(TypeError, match="atol"):
        prep.rowwise(atol=-1.0)


# ------------------------------------------------------------ auto, on injected figures


def _cal(**predicted: float) -> Decisions:
    d = Decisions(prep.auto.Calibration(rows=100, workers=1))
    d.cal.predicted = dict(predicted)
    d.cal.choice = d.best()
    return d


class _Measured:
    def __init__(self, **batched_rows: float) -> None:
        self.batched_rows, self.dropped = dict(batched_rows), {}


def test_it_is_weighed_only_where_vmap_ran_and_agreed():
    assert CompiledModel.estimate(_Measured(), 100, 1) is None  # type: ignore[arg-type]
    assert CompiledModel.estimate(_Measured(vectorized=1e-6), 100, 1) is None  # type: ignore[arg-type]
    ran = _Measured(vmap=1e-6)
    assert CompiledModel.estimate(ran, 100, 1) == 0.0  # type: ignore[arg-type]
    ran.dropped["vmap"] = "its results differ from serial"
    assert CompiledModel.estimate(ran, 100, 1) is None  # type: ignore[arg-type]


def test_auto_compiles_once_the_batches_took_as_long_as_the_compile_and_then_chooses_it():
    """Rent or buy: until it ran, a compiled form counts as saving a whole batch of the
    best, so it compiles once the batches so far took what the compile costs."""
    d = _cal(serial=0.125, vmap=0.0625, compiled=0.0)  # figures exact in binary
    assert d.cal.choice == "vmap" and d.cal.to_start() == ["compiled"]
    assert d.cal.would_save("compiled", 100) == 0.0625
    starts = [d.plan_start("compiled", 8.0, 100) for _ in range(300)]  # an 8 s compile
    assert starts.index(True) == math.ceil(8.0 / 0.0625) - 1  # after 128 batches, not before
    d.started("compiled", 9.0)
    assert d.cal.choice == "compiled" and "compiled started in 9,000 ms" in str(d.cal)
    d.observe("compiled", 0.5, 100)  # its first batch is not its figure
    d.observe("compiled", 0.004, 100)
    assert d.cal.choice == "compiled" and d.cal.figure("compiled") == pytest.approx(0.004)
    for _ in range(3):  # slower than vmap after all: its batches say so
        d.observe("compiled", 0.080, 100)
    assert d.cal.choice == "vmap"


def test_explain_says_it_is_not_compiled_yet_and_when_it_will_be():
    d = _cal(serial=0.100, vmap=0.040, compiled=0.0)
    d.observe("vmap", 0.040, 100)
    d.cal.start["compiled"] = 10.0
    d.plan_start("compiled", 10.0, 100)
    text = str(d.cal)
    assert text.startswith("vmap: measured 40.0 ms a batch, against serial 100.0 ms; compiled")
    assert "compiled not measured" in text and "compiled not compiled yet (+10,000 ms" in text
    assert "compiled would save 40.0 ms a batch once started" in text, text


# ------------------------------------------------------------ auto, end to end


def _batches(monkeypatch, fn) -> tuple[prep.auto.Calibration, list[Any]]:
    """Batches of ``fn`` through auto on one worker (no pool to measure), its compile
    counted at a microsecond, until the batch that starts (or drops) its compiled form:
    from then on, the batches' own times decide, which are the machine's."""
    monkeypatch.setattr(prep.auto._forms, "COMPILE_PRIOR", 1e-6)
    monkeypatch.setattr(prep.auto._forms, "MIN_VMAP_WORK", 0.0)
    outs = []
    with prep.auto.AutoExecutor(workers=1) as auto:
        for i in range(4):  # the first batch (or two) calibrate: no start planned there
            x = torch.randn(64, 256, generator=torch.Generator().manual_seed(i))
            out = auto.run(Job.new(fn, rows_of(x)))
            assert out is not None
            outs.append((out.buffers[0], loop(fn, x)))
            (cal,) = auto.choices().values()
            if "compiled" in cal.started or "compiled" in cal.dropped:
                break
    return cal, outs


def test_auto_starts_the_compiled_form_and_chooses_it_on_injected_figures(monkeypatch, backend):
    cal, outs = _batches(monkeypatch, chain)
    assert "compiled" in cal.started and cal.choice == "compiled", str(cal)
    assert "compiled started in" in str(cal)
    assert backend.graphs == 1
    for got, want in outs:
        assert torch.equal(got, want)


def test_a_compiled_form_that_differs_beyond_atol_is_dropped_as_a_lying_twin_is(monkeypatch):
    monkeypatch.setattr(compiled_module, "BACKEND", Counting(shift=1e-3))
    cal, outs = _batches(monkeypatch, chain)
    assert "compiled" not in cal.predicted and cal.choice != "compiled", str(cal)
    reason = cal.dropped["compiled"]
    assert reason.startswith("its compiled form is not used: its row 0 differs"), reason
    assert "@prep.rowwise(atol=...)" in reason and f"compiled ({reason})" in str(cal)
    for got, want in outs:  # serial is the reference: no compiled row reached the output
        assert torch.equal(got, want)


def test_within_the_declared_atol_it_is_kept(monkeypatch):
    monkeypatch.setattr(compiled_module, "BACKEND", Counting(shift=1e-3))
    tolerant = prep.rowwise(atol=1e-2)(lambda row: chain(row))
    cal, outs = _batches(monkeypatch, tolerant)
    assert cal.choice == "compiled" and "compiled" not in cal.dropped, str(cal)
    got, want = outs[-1]
    assert torch.allclose(got, want, rtol=0, atol=1e-2) and not torch.equal(got, want)


def test_a_form_that_does_not_compile_is_dropped_with_the_reason(monkeypatch):
    monkeypatch.setattr(compiled_module, "BACKEND", Counting(fails=True))
    cal, outs = _batches(monkeypatch, chain)
    assert cal.dropped["compiled"].startswith("its compiled form is not used: it did not compile")
    for got, want in outs:
        assert torch.equal(got, want)


def test_a_typical_program_never_pays_a_compile(backend):
    """At ``COMPILE_PRIOR`` (10 s), a few batches of milliseconds never start a compile."""
    with prep.Pool("auto", workers=1) as pool:
        for _ in range(5):
            x = torch.randn(64, 256)
            assert torch.equal(pool.map_rows(chain, x), loop(chain, x))
        (cal,) = pool._get("auto").choices().values()
    assert backend.graphs == 0 and "compiled" not in cal.started, str(cal)


# ------------------------------------------------------------ inductor, for real


@pytest.mark.timeout(600)
def test_inductor_compiles_the_chain_within_its_atol_and_once_for_every_size(monkeypatch):
    """A real compile (about 9 s cold on 2 cores, 1.5-2 s from inductor's disk cache):
    fused loops may reorder floating-point operations, so within an atol, not bit for bit."""
    counted = Counting()

    def inductor(gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        counted(gm, inputs)
        return torch._inductor.compile(gm, inputs)

    monkeypatch.setattr(compiled_module, "BACKEND", inductor)
    ex = CompiledExecutor()
    for n in (64, 17):
        x = torch.randn(n, 1024)
        out = ex.run(Job.new(chain, rows_of(x)))
        assert out is not None
        want = loop(chain, x)
        assert torch.allclose(out.buffers[0], want, rtol=0, atol=1e-6)
    assert len(ex._forms) == 1 and counted.graphs == 1  # 17 rows: no new compile


@pytest.mark.timeout(600)
def test_auto_holds_an_inductor_form_to_serial_within_the_declared_atol(monkeypatch):
    monkeypatch.setattr(compiled_module, "BACKEND", "inductor")
    tolerant = prep.rowwise(atol=1e-6)(lambda row: chain(row))
    cal, outs = _batches(monkeypatch, tolerant)
    assert cal.choice == "compiled" and "compiled" not in cal.dropped, str(cal)
    for got, want in outs:
        assert torch.allclose(got, want, rtol=0, atol=1e-6)


def test_prep_runs_plan_never_compiles_unasked(tmp_path, monkeypatch):
    """Under auto, ``prep run`` measures on its first shard only the forms that cost
    nothing to try: a compile is seconds of a core that no shard asked for."""
    import prep.run
    from prep.run import save as W

    compiles: list[Any] = []
    monkeypatch.setattr(CompiledExecutor, "run", lambda self, job: compiles.append(job))
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        W.save_shard({"x": torch.full((16, 4), float(k))}, data / f"s{k}.pt", "pt")
    config = prep.run.RunConfig("tests.rowfns:affine", columns=("x",))
    summary = prep.run.run_shards([data], tmp_path / "out", config)
    assert (summary.exit_code, summary.done) == (0, 3) and not compiles
    named = prep.run.RunConfig("tests.rowfns:affine", columns=("x",), executor="compiled")
    monkeypatch.undo()  # named, it runs (on the suite's eager backend)
    assert prep.run.run_shards([data], tmp_path / "named", named).exit_code == 0
