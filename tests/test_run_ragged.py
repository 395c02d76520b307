"""``prep run`` with rows that differ in size (``--pad``, ``--pad-to``) and rows that fail
(``--on-row-error fill|skip``, ``--fill``), beside the shard-level ``--on-error``."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from prep.cli import main
from prep.run import save as W
from prep.run import shards as S
from prep.run.manifest import Manifest
from prep.run.rows import MAX_ERRORS
from tests import rowfns

from .test_cli import outputs

pytestmark = pytest.mark.timeout(30)  # each takes under a second (processes: 2 s)

# tests.rowfns.variable: a sample [length, fails, value] -> `length` copies of `value`
VARIABLE = ["--fn", "tests.rowfns:variable", "--columns", "s"]
LENGTHS = {"a.pt": [3, 0, 5, 1], "b.pt": [2, 2], "sub/c.pt": [4, 1, 0, 6, 2]}
FAILS = {"a.pt": {1}, "b.pt": set(), "sub/c.pt": {0, 3}}


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def samples(lengths: list[int], fails: set[int] = frozenset()) -> torch.Tensor:
    return torch.tensor([[n, int(i in fails), i + 1] for i, n in enumerate(lengths)])


def make(folder: pathlib.Path, fails: bool = False) -> pathlib.Path:
    for name, lengths in LENGTHS.items():
        s = samples(lengths, FAILS[name] if fails else set())
        W.save_shard({"s": s}, folder / name, "pt")
    return folder


def padded(lengths: list[int], pad: float, fill: dict[int, float] | None = None) -> torch.Tensor:
    """What the padded output of tests.rowfns.variable is, built the plain way: as wide as
    the longest row that did not fail, the failed rows (``fill``: row -> value) filled whole."""
    fill = fill or {}
    width = max((n for i, n in enumerate(lengths) if i not in fill), default=0)
    out = torch.full((len(lengths), width), float(pad))
    for i, n in enumerate(lengths):
        out[i, :n] = fill.get(i, i + 1)
        out[i, n:] = fill.get(i, pad)
    return out


def entry(out: pathlib.Path, name: str) -> dict:
    return Manifest(out).entries()[name]


# ------------------------------------------------------------------ --pad


def test_pad_saves_padded_outputs_with_lengths_and_resumes_byte_identical(tmp_path, capsys):
    data = make(tmp_path / "data")
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *VARIABLE, "--pad", 0, "--executor", "threads"]
    assert cli(*args, "--workers", 2) == 0
    for name, lengths in LENGTHS.items():
        got = S.load_shard(out / name)
        assert list(got) == ["out", "out_lengths"]
        assert torch.equal(got["out"], padded(lengths, 0))
        assert got["out_lengths"].dtype == torch.int64
        assert got["out_lengths"].tolist() == lengths
        e = entry(out, name)
        assert e["pad"] == 0 and "failed_rows" not in e and "on_row_error" not in e
    clean = outputs(out)
    capsys.readouterr()
    assert cli(*args, "--resume") == 0
    assert "0 done, 3 skipped" in capsys.readouterr().err
    (out / "sub/c.pt").unlink()
    assert cli(*args, "--resume", "--executor", "serial") == 0
    assert "1 done, 2 skipped" in capsys.readouterr().err
    assert outputs(out) == clean
    # another pad value makes other bytes: the recipe says so, and everything is redone
    assert cli(*args, "--resume", "--pad", -1) == 0
    assert "3 done, 0 skipped" in capsys.readouterr().err
    assert torch.equal(S.load_shard(out / "a.pt")["out"], padded(LENGTHS["a.pt"], -1))


def test_dict_results_get_one_lengths_tensor_each(tmp_path):
    src = tmp_path / "in"
    shapes = [(1, 3, 5), (2, 1, 6), (3, 2, 7)]  # [h, w, value] -> ids [h, w], mask [w]
    W.save_shard({"s": torch.tensor(shapes)}, src / "s.safetensors", "safetensors")
    assert cli("run", src, "--out", tmp_path / "o", "--fn", "tests.rowfns:ragged_2d",
               "--columns", "s", "--pad", 0, "--executor", "serial", "--quiet") == 0  # fmt: skip
    got = S.load_shard(tmp_path / "o" / "s.safetensors")
    assert sorted(got) == ["ids", "ids_lengths", "mask", "mask_lengths"]  # any order
    assert got["ids"].shape == (3, 3, 3) and got["mask"].dtype == torch.bool
    assert got["ids_lengths"].tolist() == [[1, 3], [2, 1], [3, 2]]  # [B, 2] for 2-D rows
    assert got["mask_lengths"].tolist() == [3, 1, 2]
    assert got["mask"].tolist() == [[True] * 3, [True, False, False], [True, True, False]]


def test_pad_to_fixes_the_shape_and_a_larger_row_fails_its_shard(tmp_path, capsys):
    data = make(tmp_path / "data")
    out = tmp_path / "out"
    code = cli("run", data, "--out", out, *VARIABLE, "--pad-to", 5, "--executor", "serial",
               "--on-error", "skip")  # fmt: skip
    assert code == 1  # sub/c.pt has a row of 6
    err = capsys.readouterr().err
    assert "sub/c.pt FAILED: StackError:" in err and "larger than the fixed (5,)" in err
    got = S.load_shard(out / "b.pt")
    assert got["out"].shape == (2, 5) and got["out_lengths"].tolist() == [2, 2]
    assert entry(out, "a.pt")["pad_to"] == [5] and "pad" not in entry(out, "a.pt")


def test_a_lengths_name_taken_by_a_result_fails_with_the_fix(tmp_path, capsys):
    src = tmp_path / "in"
    W.save_shard({"s": torch.arange(6).view(3, 2)}, src / "s.pt", "pt")
    assert cli("run", src, "--out", tmp_path / "o", "--fn", "tests.rowfns:ids_and_ids_lengths",
               "--columns", "s", "--pad", 0, "--executor", "serial") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "returns both 'ids' and 'ids_lengths'" in err and "rename that result" in err


def test_nan_pad_is_recorded_as_text_and_resumes(tmp_path, capsys):
    data = make(tmp_path / "data")
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *VARIABLE, "--pad", "nan", "--executor", "serial"]
    assert cli(*args, "--quiet") == 0
    line = (out / "manifest.jsonl").read_text().splitlines()[0]
    assert json.loads(line)["pad"] == "nan" and "NaN" not in line  # plain JSON
    assert S.load_shard(out / "b.pt")["out"].isnan().sum() == 0
    assert S.load_shard(out / "a.pt")["out"][1].isnan().all()  # the row of length 0
    assert cli(*args, "--resume") == 0
    assert "0 done, 3 skipped" in capsys.readouterr().err


# ------------------------------------------------------------------ --on-row-error


def test_fill_keeps_the_shard_and_records_the_failed_rows(tmp_path, capsys):
    data = make(tmp_path / "data", fails=True)
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *VARIABLE, "--pad", 0, "--executor", "threads",
            "--on-row-error", "fill", "--fill", -1]  # fmt: skip
    assert cli(*args) == 0
    err = capsys.readouterr().err
    assert "3 done, 0 skipped, 0 failed" in err
    assert "a.pt: 4 rows in" in err and "; 1 row(s) failed, filled" in err
    assert "warning: 3 row(s) in 2 shard(s) failed and were filled (--on-row-error fill)" in err
    assert "RuntimeWarning" not in err  # the run's own line says it, once
    for name, lengths in LENGTHS.items():
        fails = FAILS[name]
        got = S.load_shard(out / name)
        assert torch.equal(got["out"], padded(lengths, 0, {i: -1 for i in fails}))
        want = [0 if i in fails else n for i, n in enumerate(lengths)]
        assert got["out_lengths"].tolist() == want
        e = entry(out, name)
        assert e["on_row_error"] == "fill" and e["fill"] == -1 and e["rows"] == len(lengths)
        assert e["failed_rows"] == sorted(fails)
        assert e["row_errors"] == [
            {"row": i, "error": f"ValueError: bad sample {i + 1}"} for i in sorted(fails)
        ]
    clean = outputs(out)
    assert cli(*args, "--resume") == 0  # a shard with failed rows is done
    assert "0 done, 3 skipped" in capsys.readouterr().err
    assert cli(*args[:3], tmp_path / "again", *args[4:], "--quiet") == 0
    assert outputs(tmp_path / "again") == clean


def test_skip_leaves_the_failed_rows_out(tmp_path, capsys):
    data = make(tmp_path / "data", fails=True)
    out = tmp_path / "out"
    args = ["run", data, "--out", out, *VARIABLE, "--pad", 0, "--executor", "serial",
            "--on-row-error", "skip", "--quiet"]  # fmt: skip
    assert cli(*args) == 0
    err = capsys.readouterr().err  # --quiet silences progress, not the failed rows
    assert err.count("\n") == 1 and "3 row(s) in 2 shard(s) failed and were left out" in err
    got = S.load_shard(out / "sub/c.pt")
    assert got["out_lengths"].tolist() == [1, 0, 2]  # rows 1, 2 and 4 of [4, 1, 0, 6, 2]
    assert got["out"].tolist() == [[2.0, 0.0], [0.0, 0.0], [5.0, 5.0]]  # padded to those kept
    e = entry(out, "sub/c.pt")
    assert e["failed_rows"] == [0, 3] and "fill" not in e
    assert (e["rows"], e["input_rows"]) == (3, 5)  # what the output holds, and the input
    errors = [r["error"] for r in e["row_errors"]]
    assert errors == ["ValueError: bad sample 1", "ValueError: bad sample 4"]
    assert entry(out, "b.pt")["failed_rows"] == [] and entry(out, "b.pt")["row_errors"] == []
    clean = outputs(out)
    (out / "a.pt").unlink()
    assert cli(*args, "--resume") == 0
    assert outputs(out) == clean


@pytest.mark.timeout(60)
def test_processes_fill_the_same_bytes_as_serial(tmp_path, no_leaks):
    """A fill unlike the pad: each failed row is filled whole, whenever it failed (a
    worker's chunk grows in another order than one thread's rows)."""
    data = make(tmp_path / "data", fails=True)
    lengths = torch.randint(0, 30, (200,), generator=torch.Generator().manual_seed(0))
    big = samples(lengths.tolist(), set(range(0, 200, 7)))
    W.save_shard({"s": big}, data / "big.pt", "pt")
    rows = ["--pad", 0, "--on-row-error", "fill", "--fill", -1, "--quiet"]
    assert cli("run", data, "--out", tmp_path / "s", *VARIABLE, *rows, "--executor", "serial") == 0
    assert cli("run", data, "--out", tmp_path / "p", *VARIABLE, *rows,
               "--executor", "processes", "--workers", 2) == 0  # fmt: skip
    assert outputs(tmp_path / "p") == outputs(tmp_path / "s")
    for name in [*LENGTHS, "big.pt"]:
        p, s = entry(tmp_path / "p", name), entry(tmp_path / "s", name)
        assert (p["failed_rows"], p["row_errors"]) == (s["failed_rows"], s["row_errors"])


def test_equal_rows_that_fail_need_no_pad(tmp_path):
    src = tmp_path / "in"
    W.save_shard({"x": torch.arange(8.0).view(8, 1)}, src / "s.pt", "pt")
    assert cli("run", src, "--out", tmp_path / "o", "--fn", "tests.rowfns:fail_on_5",
               "--columns", "x", "--executor", "serial", "--on-row-error", "fill",
               "--quiet") == 0  # fmt: skip
    got = S.load_shard(tmp_path / "o" / "s.pt")
    assert list(got) == ["out"]  # no lengths without --pad
    assert got["out"].flatten().tolist() == [0, 1, 2, 3, 4, 0, 6, 7]  # fill: 0 by default
    assert entry(tmp_path / "o", "s.pt")["row_errors"] == [
        {"row": 5, "error": "ValueError: cannot handle 5"}
    ]


def test_row_errors_are_recorded_for_the_first_hundred_only(tmp_path, capsys):
    src = tmp_path / "in"
    n = MAX_ERRORS + 20
    W.save_shard({"s": samples([1] * (n + 1), set(range(1, n + 1)))}, src / "s.pt", "pt")
    assert cli("run", src, "--out", tmp_path / "o", *VARIABLE, "--on-row-error", "skip",
               "--executor", "serial", "--quiet") == 0  # fmt: skip
    e = entry(tmp_path / "o", "s.pt")
    assert e["failed_rows"] == list(range(1, n + 1))
    assert [r["row"] for r in e["row_errors"]] == list(range(1, MAX_ERRORS + 1))
    assert S.load_shard(tmp_path / "o" / "s.pt")["out"].tolist() == [[1.0]]


def test_a_shard_whose_rows_all_fail_is_a_failed_shard(tmp_path, capsys):
    src = tmp_path / "in"
    W.save_shard({"s": samples([1, 2, 3], {0, 1, 2})}, src / "s.pt", "pt")
    assert cli("run", src, "--out", tmp_path / "o", *VARIABLE, "--on-row-error", "fill",
               "--pad", 0, "--executor", "serial") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "s.pt: all 3 rows failed (--on-row-error fill), so there is no output to save" in err
    assert "ValueError: bad sample 1" in err
    assert Manifest(tmp_path / "o").entries() == {}


def test_shard_level_skip_still_skips_a_broken_shard_beside_row_level_fill(tmp_path, capsys):
    data = make(tmp_path / "data", fails=True)
    (data / "b.pt").write_bytes((data / "b.pt").read_bytes()[:100])
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, *VARIABLE, "--pad", 0, "--executor", "serial",
               "--on-error", "skip", "--on-row-error", "fill") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "2 done, 0 skipped, 1 failed" in err and "b.pt FAILED: " in err
    assert "3 row(s) in 2 shard(s) failed and were filled" in err
    assert sorted(Manifest(out).entries()) == ["a.pt", "sub/c.pt"]
    # and without row-level errors a failing row fails its shard, as before
    assert cli("run", data, "--out", tmp_path / "raise", *VARIABLE, "--pad", 0,
               "--executor", "serial", "--on-error", "skip", "--quiet") == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "a.pt: row 1: ValueError: bad sample 2; --on-row-error skip" in err
    assert sorted(Manifest(tmp_path / "raise").entries()) == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--fill", "-1"], "--fill -1 is for --on-row-error fill"),
        (["--on-row-error", "skip", "--fill", "0"], "is for --on-row-error fill"),
        (["--on-row-error", "drop"], "invalid choice: 'drop'"),
        (["--pad", "zero"], "'zero' is not a number"),
        (["--pad-to", "3,x"], "'3,x' is not a shape"),
        (["--pad-to", "-1"], "'-1' is not a shape"),
    ],
)
def test_bad_row_options_exit_2(tmp_path, capsys, args, match):
    data = make(tmp_path / "data")
    assert cli("run", data, "--out", tmp_path / "o", *VARIABLE, *args) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_library_checks_the_row_options_too(tmp_path):
    import prep.run

    make(tmp_path / "data")
    config = prep.run.RunConfig("tests.rowfns:variable", columns=("s",), fill=1)
    with pytest.raises(prep.errors.ConfigError, match="pass --on-row-error fill too"):
        prep.run.run_shards([tmp_path / "data"], tmp_path / "o", config)


def test_explain_shows_the_row_options(tmp_path, capsys):
    data = make(tmp_path / "data", fails=True)
    options = ["--pad", 0, "--on-row-error", "fill", "--fill", -1]
    assert cli("run", data, "--out", tmp_path / "o", *VARIABLE, *options, "--explain") == 0
    text = capsys.readouterr().out
    assert text.startswith(("shards: ", "rows: "))  # the plan first, measured with the options
    assert "could not be measured" not in text
    assert "a.pt:" in text and "row options: --pad 0 --on-row-error fill --fill -1" in text
    # rows spread out by auto: auto's calibration of the first shard, with the options
    assert cli("run", data, "--out", tmp_path / "o", *VARIABLE, *options, "--explain",
               "--parallel", "rows") == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "auto: 4 rows" in text and "choice:" in text
    assert not (tmp_path / "o").exists()


def test_the_reference_is_what_padding_means():
    rows = [rowfns.variable(r) for r in samples([2, 0, 1])]
    assert torch.equal(padded([2, 0, 1], 0), torch.nn.utils.rnn.pad_sequence(rows, True))
    assert padded([1, 3, 2], 0, {1: -1}).tolist() == [[1, 0], [-1, -1], [3, 3]]


@pytest.mark.timeout(120)
def test_a_row_that_kills_its_worker_is_a_recorded_failed_row(tmp_path, capsys):
    """The row's error comes from the pool, not from running the row again in the run's
    own process (a segfaulting row would take the run down)."""
    data = tmp_path / "data"
    W.save_shard({"x": torch.arange(12.0).view(12, 1)}, data / "a.pt", "pt")
    out = tmp_path / "out"
    assert cli("run", data, "--out", out, "--fn", "tests.rowfns:segfault", "--columns", "x",
               "--executor", "processes", "--workers", 2, "--on-row-error", "fill",
               "--fill", -1) == 0  # fmt: skip
    e = entry(out, "a.pt")
    assert e["failed_rows"] == [1]
    assert e["row_errors"][0]["row"] == 1 and "WorkerCrashed" in e["row_errors"][0]["error"]
    got = S.load_shard(out / "a.pt")["out"]
    assert got[1].item() == -1 and got[2].item() == 2.0
