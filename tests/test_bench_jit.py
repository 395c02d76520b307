"""scripts/bench_jit.py runs, and its forms compute what serial computes.

With the ``eager`` backend: dynamo traces and breaks graphs as it would for
inductor, without inductor's C++ compile (about 10 s a graph on 2 cores), so the
figures are not JIT's; they are the script's plumbing and its value checks.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "scripts" / "bench_jit.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("bench_jit", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    torch._dynamo.reset()  # no compiled code left behind for later tests


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["chain", "side_context", "image", "branchy"])
def test_every_form_matches_serial_or_says_why_not(bench: ModuleType, name: str) -> None:
    results = bench.warm(name, 4, "eager", 1)
    refused = {f for f, r in results.items() if "error" in r}
    # vmap cannot batch nonzero (side context) or a Python `if` on a value (branchy)
    if name in ("side_context", "branchy"):
        assert refused == {"vmap(fn)", "compile(vmap(fn))"}
        assert all(results[f]["error"].count("vmap") for f in refused)
    else:
        assert not refused
    for form, r in results.items():
        if form not in refused:
            assert r["values"] == "bit for bit", (form, r)
            assert r["s"] > 0


@pytest.mark.timeout(60)
def test_the_script_prints_its_table_and_verdict(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    # the whole pipeline: a warm child, then a cold and a disk-cache child per compiled form
    argv = ["--backend", "eager", "--workloads", "chain", "--sizes", "4", "--repeat", "1"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "cores, torch" in out and "| workload | rows | form |" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("| chain | 4 |")]
    assert [ln.split(" | ")[2] for ln in lines] == [
        "serial",
        "vmap(fn)",
        "twin",
        "compile(vmap(fn))",
        "compile(twin)",
        "compile(fn), looped",
    ]
    assert not any("failed" in ln or "error" in ln.lower() for ln in lines), lines
    assert "- **chain: best warm speedup of a compiled form" in out


def test_a_refusal_is_one_line_naming_the_root_cause(bench: ModuleType) -> None:
    try:
        try:
            raise RuntimeError("vmap: no\nsecond line")
        except RuntimeError as inner:
            raise ValueError("wrapper") from inner
    except ValueError as e:
        assert bench.reason(e) == "ValueError from RuntimeError: vmap: no"
