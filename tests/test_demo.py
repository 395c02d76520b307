"""examples/demo.py, section by section: what each prints and returns, at tiny sizes.

Timing is the demo's subject but never these tests': they check the mechanics
(every variant timed and equal to serial, a verdict only where the figures allow
one, the busy-machine line, the formatting) with figures given, not measured.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
#: a ratio printed as nothing ("0.0x"), not a figure that ends in it ("10.0x")
ZERO = re.compile(r"(?<![\d.,])0\.0+x")
SPEC = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
assert SPEC is not None and SPEC.loader is not None
demo = importlib.util.module_from_spec(SPEC)
sys.modules["demo"] = demo  # pickled row functions find it by name
SPEC.loader.exec_module(demo)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _no_wisdom(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREP_WISDOM", "off")  # nothing written to the user's cache


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # processes workers start with the parent's sys.path and import demo by name
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


def stat(median: float, spread: float = 0.05) -> demo.Stat:
    return demo.Stat(median, median * (1 - spread / 2), median * (1 + spread / 2))


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    "value, text",
    [(2.5, "2.5 s"), (0.0123, "12.3 ms"), (0.000_004_2, "4.2 us"), (1e-9, "0.001 us")],
)
def test_seconds_three_figures_in_a_fitting_unit(value: float, text: str) -> None:
    assert demo.seconds(value) == text


@pytest.mark.parametrize(
    "base, t, text",
    [
        (1.0, 0.5, "2.0x faster"),
        (1.0, 2.0, "2.0x slower"),
        (1.0, 1.02, "about the same"),
        (1.0, 0.001, "1,000x faster"),
        (0.001, 1.0, "1,000x slower"),
        (1.0, 1 / 19.4, "19x faster"),
    ],
)
def test_against_never_prints_zero_ratios(base: float, t: float, text: str) -> None:
    assert demo.against(base, t) == text
    assert not ZERO.search(text)


# ---------------------------------------------------------------- verdicts


def test_a_clear_gap_names_the_winner() -> None:
    v = demo.verdict({"serial": stat(1.0), "threads": stat(0.5), "processes": stat(0.7)})
    assert v.winner == "threads"
    assert "threads wins" in v.text and "processes" in v.text


def test_a_gap_smaller_than_the_threshold_is_too_close() -> None:
    v = demo.verdict({"serial": stat(1.0), "threads": stat(0.9)})
    assert v.winner is None and "too close to call" in v.text


def test_overlapping_repeats_are_too_close_even_with_a_gap() -> None:
    stats = {"serial": demo.Stat(1.0, 0.78, 1.02), "threads": demo.Stat(0.75, 0.7, 0.8)}
    assert max(s.spread for s in stats.values()) < demo.MAX_SPREAD  # narrow, yet overlapping
    v = demo.verdict(stats, busy=None)
    assert v.winner is None and "too close" in v.text


def test_wide_spread_is_too_busy() -> None:
    v = demo.verdict({"serial": stat(1.0, spread=0.6), "threads": stat(0.5)})
    assert v.winner is None and v.text.startswith("too busy to tell")
    assert "60%" in v.text and "fastest this time: threads" in v.text


def test_a_busy_machine_gives_no_verdict() -> None:
    busy = demo.busy_reason(3.4, 2)
    assert busy == "load average 3.4 on 2 cores"
    assert demo.busy_reason(1.5, 2) is None
    v = demo.verdict({"serial": stat(1.0), "threads": stat(0.3)}, busy)
    assert v.winner is None and "too busy to tell" in v.text and "threads" in v.text


def test_stat_is_the_median_and_quartiles() -> None:
    s = demo.Stat.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.q1, s.median, s.q3) == (2.0, 3.0, 4.0)
    assert s.spread == pytest.approx(2 / 3)
    assert demo.Stat.of([2.0]).spread == 0.0


# ---------------------------------------------------------------- sections


def test_cases_expect_three_different_winners() -> None:
    cases = demo.cases(scale=0.01)
    assert len({c.expected for c in cases}) == 3
    for case in cases:
        assert "serial" in case.executors and case.expected in case.executors
        assert case.why


def test_sorted_quantiles_reads_only_the_rows_own_length() -> None:
    values = torch.tensor([5.0, 1.0, 3.0, 100.0, -100.0])
    got = demo.sorted_quantiles(values, torch.tensor(3))  # of [1, 3, 5]: -100 and 100 unread
    assert got.tolist() == [1.0, 3.0, 3.0]  # sorted positions 5%, 50%, 95% of 2, rounded down


def test_who_wins_times_every_variant_and_explains_auto(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = demo.who_wins(scale=0.01, repeat=3)
    printed = capsys.readouterr().out
    assert [r.case.title for r in results] == [c.title for c in demo.cases(scale=0.01)]
    for r in results:
        assert set(r.stats) == {*r.case.executors, "auto"}
        assert all(s.median > 0 for s in r.stats.values())
        assert r.auto_ran in {*r.case.executors, "vmap"}
        assert r.explain.strip() and r.explain != "nothing yet"
        assert r.verdict.text in printed and r.case.title in printed
    assert not ZERO.search(printed) and "reference" in printed
    demo.auto_explained(results)
    printed = capsys.readouterr().out
    for r in results:
        assert f"auto on {r.case.title}:" in printed
        assert r.explain.splitlines()[0] in printed


def test_ragged_rows_are_padded_with_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    ids, lengths = demo.ragged_rows()
    assert ids.shape == (3, 14) and lengths.tolist() == [5, 14, 10]
    assert ids[0, 5:].eq(0).all()
    assert "pad=0" in capsys.readouterr().out


def test_a_bad_row_is_filled_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    out, valid = demo.bad_row()
    assert valid.tolist() == [True, False, True]
    assert out[1].eq(0).all() and out[0].tolist() == list(b"abc")
    printed = capsys.readouterr().out
    assert "warning:" in printed and "garbage" in printed


def test_stream_yields_every_batch(capsys: pytest.CaptureFixture[str]) -> None:
    seen, one_by_one, ahead = demo.stream(batches=3, step=0.001, rows=2, rounds=1)
    assert seen == 3 and one_by_one > 0 and ahead > 0
    assert "prefetch=2" in capsys.readouterr().out


def test_dataloader_collates_left_contexts() -> None:
    first = demo.dataloader(samples=32)
    assert first.shape == (16, 8) and first.dtype == torch.int64
    assert first[0].tolist() == list(range(2, 10))  # 8 tokens left of the span at 10


def test_shards_run_through_the_cli() -> None:
    written = demo.shards(rows=8)
    assert written == ["manifest.jsonl", *(f"shard-{i:05d}.pt" for i in range(4))]


def test_main_refuses_too_few_repeats() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--repeat", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "at least 3" in proc.stderr


def test_the_whole_demo_runs_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PREP_WISDOM": "off"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for heading in ("\n1. ", "\n2. ", "\n3. ", "\n4. ", "\n5. ", "\nWinners ("):
        assert heading in proc.stdout
    assert not ZERO.search(proc.stdout)
    assert "Traceback" not in proc.stderr
