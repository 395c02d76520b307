"""Shard files, the manifest and one shard's work: prep.run's shards, manifest and task."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
import safetensors.torch
import torch

import prep
from prep.errors import Cancelled
from prep.run import save as W
from prep.run import shards as S
from prep.run import temps as T
from prep.run.config import RunConfig, load_fn
from prep.run.manifest import Manifest
from prep.run.shards import ShardFile
from prep.run.task import ShardTask, _named, run_shard
from prep.run.temps import Temps

from .conftest import wait_until


class Evil:
    """Unpickling this runs ``Path.touch(marker)``: a stand-in for arbitrary code."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def tensors(seed: int = 0, rows: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(rows, 3, generator=g), "n": torch.arange(rows)}


def temps_in(folder: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name]


# ------------------------------------------------------------------ saving


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_saves_are_byte_identical_whatever_the_temp_name_or_view(tmp_path, fmt):
    big = torch.arange(40.0)
    a = {"x": big[:10].view(2, 5), "n": torch.arange(3)}  # a view of a larger storage
    b = {"x": torch.arange(10.0).view(2, 5), "n": torch.arange(3)}
    sha_a, size_a = W.save_shard(a, tmp_path / f"a.{fmt}", fmt)
    sha_b, size_b = W.save_shard(b, tmp_path / "sub" / f"b.{fmt}", fmt)
    bytes_a = (tmp_path / f"a.{fmt}").read_bytes()
    assert bytes_a == (tmp_path / "sub" / f"b.{fmt}").read_bytes()
    assert (
        (sha_a, size_a) == (sha_b, size_b) == (W.sha256_file(tmp_path / f"a.{fmt}"), len(bytes_a))
    )
    assert temps_in(tmp_path) == []
    loaded = S.load_shard(tmp_path / f"a.{fmt}")
    assert sorted(loaded) == ["n", "x"] and torch.equal(loaded["x"], b["x"])


def test_pt_bytes_do_not_depend_on_the_file_name(tmp_path):
    # torch.save(obj, path) names the zip's root folder after the file; ours must not
    W.save_shard(tensors(), tmp_path / "one.pt", "pt")
    W.save_shard(tensors(), tmp_path / "two.pt", "pt")
    names = zipfile.ZipFile(tmp_path / "one.pt").namelist()
    assert all(n.startswith("archive/") for n in names)
    assert (tmp_path / "one.pt").read_bytes() == (tmp_path / "two.pt").read_bytes()


def test_pt_bytes_are_the_same_in_another_process(tmp_path):
    code = (
        "import sys, torch; from prep.run import save as W; "
        "from tests.test_shards import tensors; "
        "W.save_shard(tensors(), __import__('pathlib').Path(sys.argv[1]), 'pt')"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "child.pt")], check=True)
    W.save_shard(tensors(), tmp_path / "here.pt", "pt")
    assert (tmp_path / "child.pt").read_bytes() == (tmp_path / "here.pt").read_bytes()


def test_shared_storage_is_saved_as_separate_tensors(tmp_path):
    t = torch.arange(6.0)
    W.save_shard({"a": t, "b": t}, tmp_path / "s.safetensors", "safetensors")
    assert torch.equal(S.load_shard(tmp_path / "s.safetensors")["b"], t)


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    W.save_shard(tensors(1), path, "pt")
    old = path.read_bytes()

    def half_then_fail(tensors, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setitem(W._WRITERS, "pt", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        W.save_shard(tensors(2), path, "pt")
    assert path.read_bytes() == old
    assert temps_in(tmp_path) == []


def test_abandoned_temps_are_removed_and_refused(tmp_path):
    temps = Temps()
    tmp = temps.new(tmp_path / "a.pt")
    tmp.write_bytes(b"partial")
    assert T._TEMP.match(tmp.name), tmp.name
    assert temps.abandon() == [tmp]
    assert not tmp.exists()
    with pytest.raises(Cancelled):
        temps.new(tmp_path / "b.pt")
    with pytest.raises(Cancelled):
        W.save_shard(tensors(), tmp_path / "c.pt", "pt", temps)
    assert list(tmp_path.iterdir()) == []


def test_remove_stale_temps_only_removes_ours(tmp_path):
    (tmp_path / "sub").mkdir()
    dead = 99_999_999  # above any pid_max (at most 2**22): no such process
    ours = [
        tmp_path / f".a.pt.tmp-{dead}-0123abcd",
        tmp_path / "sub" / f".b.safetensors.tmp-{dead}-ffffffff",
        tmp_path / f".c.pt.tmp-{2**70}-ffffffff",  # too large for a PID at all
    ]
    theirs = [tmp_path / "a.pt", tmp_path / ".hidden", tmp_path / ".x.tmp-1-nothex!"]
    for p in ours + theirs:
        p.write_bytes(b"")
    assert sorted(T.remove_stale_temps(tmp_path)) == sorted(ours)
    assert all(p.exists() for p in theirs)


def test_remove_stale_temps_keeps_those_of_live_writers(tmp_path):
    # a live process (this one) started before writing the file: another run in flight
    live = tmp_path / f".a.pt.tmp-{os.getpid()}-0123abcd"
    live.write_bytes(b"in flight")
    # the same live PID on a file last written before that process started: a crashed
    # run's file under a reused PID
    reused = tmp_path / f".b.pt.tmp-{os.getpid()}-ffffffff"
    reused.write_bytes(b"left by a crash")
    os.utime(reused, (1e9, 1e9))  # 2001
    # a zombie writes nothing more
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: _state(zombie.pid) == "Z", timeout=15)
    undead = tmp_path / f".c.pt.tmp-{zombie.pid}-00000000"
    undead.write_bytes(b"")
    try:
        assert sorted(T.remove_stale_temps(tmp_path)) == sorted([reused, undead])
    finally:
        zombie.wait()
    assert live.exists()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# ------------------------------------------------------------------ loading


def test_weights_only_refuses_a_malicious_pickle_and_never_runs_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"x": torch.ones(2), "payload": Evil(marker)}, path)
    with pytest.raises(prep.ShardError, match=r"evil\.pt.*--trust-pickle"):
        S.load_shard(path)
    assert not marker.exists()
    # the payload is real: trusting the file runs it (then the result is no tensor dict)
    with pytest.raises(prep.ShardError, match="not tensors"):
        S.load_shard(path, trust_pickle=True)
    assert marker.exists()


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_a_truncated_shard_names_the_file(tmp_path, fmt):
    path = tmp_path / f"cut.{fmt}"
    W.save_shard(tensors(), path, fmt)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(prep.ShardError, match=rf"cut\.{fmt}: cannot be read"):
        S.load_shard(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ([torch.ones(2)], "holds a list, expected a dict"),
        ({"x": torch.ones(2), "y": 3}, r"entries \{'y': 'int'\} are not tensors"),
        ({}, "empty dict"),
    ],
)
def test_not_a_tensor_dict(tmp_path, content, match):
    torch.save(content, tmp_path / "odd.pt")
    with pytest.raises(prep.ShardError, match=match):
        S.load_shard(tmp_path / "odd.pt")


def test_legacy_pt_files_load_without_mmap(tmp_path):
    torch.save(tensors(), tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert torch.equal(S.load_shard(tmp_path / "old.pt")["n"], torch.arange(5))


def test_find_shards(tmp_path):
    (tmp_path / "d" / "deep").mkdir(parents=True)
    for name in ["d/b.pt", "d/a.safetensors", "d/deep/c.pt", "d/notes.txt", "e.pt"]:
        (tmp_path / name).write_bytes(b"")
    found = S.find_shards([tmp_path / "d", tmp_path / "e.pt"])
    assert [s.rel for s in found] == ["a.safetensors", "b.pt", "deep/c.pt", "e.pt"]
    with pytest.raises(prep.ConfigError, match="does not exist"):
        S.find_shards([tmp_path / "nope"])
    with pytest.raises(prep.ConfigError, match="is not a shard"):
        S.find_shards([tmp_path / "d" / "notes.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(prep.ConfigError, match="no .pt or .safetensors files found in"):
        S.find_shards([tmp_path / "empty"])
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "e.pt").write_bytes(b"")
    with pytest.raises(prep.ConfigError, match="would both be written to 'e.pt'"):
        S.find_shards([tmp_path / "e.pt", tmp_path / "f"])


def test_make_shards_is_deterministic_and_fits_side_context(tmp_path):
    a = prep.run.make_shards(tmp_path / "a", shards=2, rows=64, seq=12, dim=3, seed=7)
    b = prep.run.make_shards(tmp_path / "b", shards=2, rows=64, seq=12, dim=3, seed=7, fmt="pt")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != a[1].read_bytes()
    t = S.load_shard(a[0])
    assert t["x"].shape == (64, 12, 3) and t["x"].dtype == torch.float32
    assert t["mask"].dtype == torch.bool and t["length"].dtype == torch.int64
    for m, n in zip(t["mask"], t["length"]):
        where = m.nonzero().flatten()
        assert 6 <= n <= 12
        if len(where):  # one contiguous span inside the valid length
            assert where[-1] - where[0] + 1 == len(where) and where[-1] < n
    assert (~t["mask"].any(1)).any(), "some rows have no span"
    with pytest.raises(prep.ConfigError, match="shards=0"):
        prep.run.make_shards(tmp_path / "c", shards=0)


# ------------------------------------------------------------------ the manifest


def test_manifest_append_read_and_a_torn_last_line(tmp_path):
    m = Manifest(tmp_path)
    m.append({"schema": 1, "input": "a.pt", "n": 1})
    m.append({"schema": 1, "input": "a.pt", "n": 2})
    m.close()
    with open(m.path, "a") as f:
        f.write('{"schema": 1, "input": "b.pt", "n"')  # a crash mid-append
    assert {k: v["n"] for k, v in m.entries().items()} == {"a.pt": 2}
    m.append({"schema": 1, "input": "b.pt", "n": 3})
    m.close()
    lines = m.path.read_text().splitlines()
    assert [json.loads(x)["n"] for x in lines] == [1, 2, 3]


def test_manifest_is_done_checks_input_recipe_and_output(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    W.save_shard(tensors(), src / "a.pt", "pt")
    shard = S.find_shards([src])[0]
    config = RunConfig("tests.rowfns:affine", columns=("x",))
    out = tmp_path / "out"
    entry = run_shard(ShardTask(shard, out, config))
    m = Manifest(out)
    recipe = config.recipe()
    assert m.is_done(entry, shard, recipe)
    assert not m.is_done(None, shard, recipe)
    assert not m.is_done(entry, shard, {**recipe, "args": {"k": 1}})
    (out / "a.pt").write_bytes((out / "a.pt").read_bytes()[:-1] + b"?")
    assert not m.is_done(entry, shard, recipe)
    entry = run_shard(ShardTask(shard, out, config))
    assert m.is_done(entry, shard, recipe)
    W.save_shard(tensors(), src / "a.pt", "pt")  # same bytes, new mtime
    assert not m.is_done(entry, shard, recipe)


# ------------------------------------------------------------------ one shard


@pytest.mark.parametrize(
    ("fn", "columns", "keys"),
    [
        ("tests.rowfns:affine", ("x",), ["out"]),
        ("tests.rowfns:pair", ("x", "y"), ["out0", "out1"]),
        ("tests.rowfns:named", None, ["sum", "flip"]),
    ],
)
@pytest.mark.parametrize("executor", ["serial", "auto"])
def test_run_shard_names_the_results(tmp_path, fn, columns, keys, executor):
    src = tmp_path / "a.safetensors"
    W.save_shard({"x": torch.ones(4, 3), "y": torch.full((4, 3), 2.0)}, src, "safetensors")
    config = RunConfig(fn, columns=columns, executor=executor, format="pt")
    entry = run_shard(ShardTask(ShardFile(src, "a.safetensors"), tmp_path / "out", config))
    assert entry["output"] == "a.pt" and entry["rows"] == 4
    assert list(S.load_shard(tmp_path / "out" / "a.pt")) == keys  # .pt keeps the fn's order


def test_run_shard_problems_name_the_file(tmp_path):
    src = tmp_path / "a.pt"
    W.save_shard({"x": torch.arange(8).view(8, 1), "y": torch.ones(3)}, src, "pt")
    task = lambda **kw: ShardTask(ShardFile(src, "a.pt"), tmp_path / "o", RunConfig(**kw))
    with pytest.raises(prep.ShardError, match=r"a\.pt: has no column 'z'; it has 'x', 'y'"):
        run_shard(task(fn="tests.rowfns:affine", columns=("x", "z")))
    with pytest.raises(prep.ShardError, match=r"a\.pt: the columns must share dim 0.*x: 8, y: 3"):
        run_shard(task(fn="tests.rowfns:named"))
    with pytest.raises(TypeError, match="returned a list; to be saved it must"):
        _named([1, 2], "m:f")
    with pytest.raises(prep.RowError, match="row 5: ValueError"):
        run_shard(task(fn="tests.rowfns:fail_on_5", columns=("x",), executor="serial"))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("prep.ops.side_context_row", "is not MODULE:NAME"),
        ("no_such_module_xyz:f", "cannot import module"),
        ("prep.ops:nope", "has no 'nope'"),
        ("prep:__version__", "is a str, expected a function"),
    ],
)
def test_load_fn_errors(spec, match):
    with pytest.raises(prep.ConfigError, match=match):
        load_fn(spec)
    assert load_fn("prep.ops:side_context_row").__name__ == "side_context_row"


def test_safetensors_input_round_trip(tmp_path):
    safetensors.torch.save_file(tensors(), tmp_path / "a.safetensors")
    assert torch.equal(S.load_shard(tmp_path / "a.safetensors")["n"], torch.arange(5))
