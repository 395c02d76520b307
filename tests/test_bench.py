"""``prep bench``: your function on every executor and the two peers, each checked
against serial; the table it prints; its command line.

Timings on a shared 2-core machine are noise, so nothing here asserts a figure: the
races check which cells ran, failed or were skipped, and the table is tested on
timings the test gives it. The batch and serial run once per rows; no worker
outlives a race (``no_leaks``).
"""

from __future__ import annotations

import pytest
import torch

import prep
from prep.bench import Cell, Race, Timing, broken, report
from prep.bench.peers import PEERS, PeerRows
from prep.cli import main
from prep.errors import ConfigError

from . import bench_user

pytestmark = pytest.mark.timeout(180)


def run(fn, factory, **settings):
    """``Race(**settings).run(fn, factory)``, one repeat on 2 workers unless told."""
    return Race(**{"workers": 2, "repeat": 1, **settings}).run(fn, factory)


def by_variant(cells: list[Cell]) -> dict[str, Cell]:
    assert len({c.rows for c in cells}) == 1
    return {c.variant: c for c in cells}


# ---------------------------------------------------------------- the race


def test_every_executor_and_peer_is_timed_on_every_rows(no_leaks: None) -> None:
    cells = run(bench_user.scale_row, bench_user.make_batch, rows=(4, 8), repeat=2, peers=True)
    variants = [*prep.EXECUTORS, "mp_pool", "dataloader"]
    assert [(c.rows, c.variant) for c in cells] == [(r, v) for r in (4, 8) for v in variants]
    for c in cells:
        if c.variant == "vectorized":  # scale_row has no batched twin: prep says so
            assert c.status == "skipped" and c.timing is None
            assert "needs a batched twin" in c.note and "@prep.rowwise(batched=...)" in c.note
            continue
        assert c.status == "ok", (c.variant, c.note)
        assert c.timing is not None and len(c.timing.samples) == 2
        assert 0 < c.timing.low <= c.timing.median <= c.timing.high
    assert broken(cells) == []


def test_a_result_that_differs_from_serial_fails_its_cell(no_leaks: None) -> None:
    """in_this_process adds the pid it runs in: every variant that runs rows in
    another process gives other values than serial's, and is told apart."""
    # prep's own check of another interpreter's rows says so too, with the likely causes
    with pytest.warns(RuntimeWarning, match="computed row 0 of in_this_process differently"):
        cells = run(
            bench_user.in_this_process,
            bench_user.make_rows,
            rows=(6,),
            executors=("threads", "processes"),
            peers=True,
        )
    by = by_variant(cells)
    assert by["serial"].status == by["threads"].status == "ok"
    for name in ("processes", "mp_pool", "dataloader"):
        assert (by[name].status, by[name].note) == (
            "failed",
            "its result differs from the serial executor's",
        )
        assert by[name].timing is None


def test_what_prep_refuses_is_skipped_with_its_reason() -> None:
    """vmap cannot trace a row that reads its values, and vectorized needs a twin: both
    refusals prep explains, so neither is a finding."""
    by = by_variant(run(bench_user.scaled_by_first, bench_user.make_rows, rows=(4,),
                        executors=("vmap", "vectorized")))  # fmt: skip
    assert by["serial"].status == "ok"
    assert by["vmap"].status == "skipped" and by["vmap"].note.startswith("VmapUnsupported:")
    assert by["vectorized"].status == "skipped" and "needs a batched twin" in by["vectorized"].note


def test_a_peer_that_cannot_run_the_function_fails_and_the_race_goes_on(no_leaks: None) -> None:
    with pytest.warns(UserWarning, match="pickle error when attempting to start a worker"):
        by = by_variant(run(lambda row: row * 2, bench_user.make_rows, rows=(4,),
                            executors=("threads",), peers=True))  # fmt: skip
    assert by["serial"].status == by["threads"].status == "ok"
    for name in ("mp_pool", "dataloader"):  # neither pickles a lambda to its workers
        assert by[name].status == "failed" and "pickle" in by[name].note.lower(), by[name]


def test_a_broken_factory_or_serial_marks_its_rows_broken() -> None:
    cells = run(bench_user.scale_row, bench_user.broken_factory, rows=(4, 8),
                executors=("threads",))  # fmt: skip
    assert [c.status for c in cells] == ["failed"] * 4
    assert "the batch factory failed: OSError: cannot read the data for 8 rows" in cells[-1].note
    assert broken(cells) == [4, 8]
    cells = run(bench_user.failing_row, bench_user.make_batch, rows=(4,), executors=("threads",))
    assert all(c.status == "failed" and "always fails" in c.note for c in cells)
    assert broken(cells) == [4]


@pytest.mark.parametrize("name", list(PEERS))
def test_each_peer_computes_what_a_loop_does_warm_too(name: str, no_leaks: None) -> None:
    pool = PEERS[name].pool(
        PeerRows(bench_user.scale_row, samples=False, keywords=False), workers=2
    )
    try:
        for _ in range(2):  # the first call starts the pool; the second finds it warm
            x, w = torch.randn(10, 4), torch.rand(10, 3)
            want = torch.stack([bench_user.scale_row(a, b) for a, b in zip(x, w)])
            assert torch.equal(pool.run((x, w)), want)
        named = bench_user.make_named(10)
        keywords = PEERS[name].pool(
            PeerRows(bench_user.scale_row, samples=False, keywords=True), workers=2
        )
        try:
            got = keywords.run(named)
        finally:
            keywords.close()
        want = torch.stack([bench_user.scale_row(x=a, w=b) for a, b in zip(*named.values())])
        assert torch.equal(got, want)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"rows": (0, 8)}, r"rows \[0\] are not positive integers; e.g. rows=\(16, 64\)"),
        ({"rows": 16}, r"Race\(rows=16\) needs a list of row counts"),
        ({"workers": True}, "workers=True is not a positive integer; e.g. workers=2"),
        ({"repeat": 0}, "repeat=0 is not a positive integer"),
        ({"executors": "threads"}, r"Race\(executors='threads'\) needs a list of executor"),
        ({"executors": ("turbo",)}, "executors 'turbo' unknown; choose from serial, threads"),
        ({"timeout": 0}, "timeout=0 must be > 0 seconds, or None"),
    ],
)
def test_bad_settings_name_the_value_and_the_fix(settings: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Race(**settings)


def test_serial_is_always_raced_first_as_the_reference() -> None:
    assert Race(executors=("threads", "serial", "threads")).executors == ("serial", "threads")
    assert Race(executors=(), peers=True).variants() == ("serial", "mp_pool", "dataloader")


# ---------------------------------------------------------------- the table


def timed(ms: float) -> Timing:
    s = ms / 1e3
    return Timing(s, 0.9 * s, 1.2 * s, (0.9 * s, s, 1.2 * s))


def test_the_table_stars_the_fastest_but_auto_and_divides_serial_by_each() -> None:
    cells = [
        Cell(8, "serial", "ok", timed(4.0)),
        Cell(8, "threads", "ok", timed(2.0)),
        Cell(8, "auto", "ok", timed(1.0)),  # faster, but judged against the fastest
        Cell(8, "mp_pool", "ok", timed(8.0)),
        Cell(8, "vmap", "skipped", note="VmapUnsupported: reads\n   values"),
        Cell(16, "serial", "failed", note="RuntimeError: boom"),
    ]
    lines = report(cells).splitlines()
    assert lines[-1] == "* fastest for its rows (auto is judged against it)"
    rows = [[part.strip() for part in line.split("|")[1:-1]] for line in lines[2:-1]]
    assert rows == [
        ["8", "serial", "4", "30%", "2,000", "1.00x", ""],
        ["8", "* threads", "2", "30%", "4,000", "2.00x", ""],
        ["8", "auto", "1", "30%", "8,000", "4.00x", ""],
        ["8", "multiprocessing.Pool.starmap", "8", "30%", "1,000", "0.50x", ""],
        ["8", "vmap", "-", "-", "-", "-", "SKIPPED: VmapUnsupported: reads values"],
        ["16", "serial", "-", "-", "-", "-", "FAILED: RuntimeError: boom"],
    ]


# ---------------------------------------------------------------- the command line

USER = ["--fn", "tests.bench_user:scale_row", "--batch", "tests.bench_user:make_batch"]


def test_the_command_races_and_prints_the_table(
    capsys: pytest.CaptureFixture[str], no_leaks: None
) -> None:
    argv = ["bench", *USER, "--rows", "4", "8", "--workers", "2", "--repeat", "1"]
    assert main([*argv, "--executors", "serial", "threads", "--peers"]) == 0
    out, err = capsys.readouterr()
    variants = [line.split("|")[2].strip(" *") for line in out.splitlines()[2:-1]]
    labels = ["serial", "threads", *(peer.label for peer in PEERS.values())]
    assert variants == labels * 2
    assert "rows=4: fastest" in err and "rows=8: fastest" in err


def test_a_broken_workload_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--fn", "tests.bench_user:failing_row", "--batch", "tests.bench_user:make_batch"]
    assert main(["bench", *argv, "--rows", "4", "--executors", "serial", "--repeat", "1"]) == 1
    assert "FAILED: RowError" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--fn", "tests.bench_user:scale_row"], "the following arguments are required: --batch"),
        ([*USER, "--executors", "serial", "turbo"], "'turbo' unknown; choose from serial"),
        ([*USER, "--rows", "0"], "0 is not a positive integer"),
        ([*USER, "--timeout", "-1"], "timeout=-1.0 must be > 0 seconds"),
        (["--fn", "tests.bench_user:missing", "--batch", "x:y"], "has no 'missing'"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], match: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", *argv]) == 2
    assert match in capsys.readouterr().err
