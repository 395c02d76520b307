"""Wisdom (prep.auto.wisdom): auto's figures remembered across interpreters."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import prep
from prep.auto import wisdom
from prep.core.policy import RAISE
from prep.core.rows import rows_of

from . import wisdomfns

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache" / "wisdom.json"
    monkeypatch.setenv(wisdom.ENV, str(path))
    monkeypatch.setattr(wisdom, "busy", lambda: "")  # a quiet machine (injected)
    return path


def key_of(fn, batch, workers=2):
    rows = rows_of(batch)
    return wisdom.key(fn, rows.layout(), len(rows), workers, (False, repr(RAISE)))


def python(code: str, path: Path, timeout: float = 90) -> str:
    """Run ``code`` in a second interpreter (a fresh str hash seed, its own imports)."""
    env = {**os.environ, wisdom.ENV: str(path), "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONHASHSEED", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


# ---------------------------------------------------------------- the key


def test_the_key_is_the_same_in_another_interpreter(file):
    code = """
        import torch
        from prep.core.policy import RAISE
        from prep.core.rows import rows_of
        from prep.auto import wisdom
        from tests import wisdomfns
        rows = rows_of(torch.ones(64, 3))
        print(wisdom.key(wisdomfns.doubled, rows.layout(), 64, 2, (False, repr(RAISE))))
    """
    assert python(code, file).strip() == key_of(wisdomfns.doubled, torch.ones(64, 3))


def test_the_key_changes_with_the_code_the_arguments_the_shapes_and_the_workers():
    x = torch.ones(64, 3)
    base = key_of(wisdomfns.doubled, x)
    assert base is not None
    others = [
        key_of(wisdomfns.tripled, x),  # other code
        key_of(functools.partial(torch.mul, other=2), x),
        key_of(functools.partial(torch.mul, other=3), x),  # another bound argument
        key_of(wisdomfns.doubled, torch.ones(64, 4)),  # another row shape
        key_of(wisdomfns.doubled, torch.ones(640, 3)),  # 10x the rows
        key_of(wisdomfns.doubled, x, workers=3),
    ]
    assert len({base, *others}) == len(others) + 1
    assert key_of(wisdomfns.doubled, torch.ones(100, 3)) == base  # within 4x: the same


def test_a_lambda_is_keyed_by_its_code_and_captured_values_or_not_at_all():
    def make(scale):
        return lambda r: r * scale

    x = torch.ones(8, 3)
    assert key_of(make(2), x) == key_of(make(2), x) != key_of(make(3), x)
    lock = threading.Lock()  # no stable stand-in: not remembered
    assert key_of(lambda r: r if lock else r, x) is None


class _Scale:
    def __init__(self, k: float) -> None:
        self.k = k

    def apply(self, row: torch.Tensor) -> torch.Tensor:
        return row * self.k


def test_one_key_in_the_process_by_code_where_it_can_by_object_where_it_cannot():
    from prep.core.identity import identity, key

    def make(scale):
        return lambda r: r * scale

    # a fresh lambda of the same code and values is the function already seen
    assert key(make(2)) == key(make(2)) != key(make(3))
    # a bound method carries its object: two objects are two functions, one object one,
    # however often ``obj.apply`` makes a new method object; none is remembered across
    # interpreters (the object has no stable stand-in)
    a, b = _Scale(2.0), _Scale(3.0)
    assert key(a.apply) == key(a.apply) != key(b.apply)
    assert identity(a.apply) is None
    lock = threading.Lock()
    assert key(lambda r: r if lock else r)[0] == "ids"


# ---------------------------------------------------------------- the file


def test_wisdom_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(wisdom.ENV, "off")
    assert wisdom.location() is None
    assert not wisdom.remember("k", {"choice": "serial", "rows": 4, "figures": {"serial": 1.0}})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(wisdomfns.doubled, torch.ones(64, 3))
    assert not any(tmp_path.iterdir())


def test_the_default_file_is_in_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(wisdom.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert wisdom.location() == tmp_path / "prep" / "wisdom.json"


def test_a_first_run_remembers_and_forget_clears(file):
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(3):
            pool.map_rows(wisdomfns.doubled, torch.ones(64, 3))
        (cal,) = pool.choices()
    wisdom.flush()  # auto writes in the background
    entry = json.loads(file.read_text())["entries"][key_of(wisdomfns.doubled, torch.ones(64, 3))]
    assert entry["choice"] == cal.choice and cal.choice in entry["figures"]
    assert prep.forget() == 1 and not file.exists()
    assert prep.forget() == 0


def test_a_second_interpreter_starts_on_the_remembered_choice(file):
    x = torch.ones(64, 3)
    # an injected figure: threads, which no measurement of this light function would pick
    figures = {"threads": 1e-5, "serial": 1.0}
    assert wisdom.remember(key_of(wisdomfns.doubled, x), {"choice": "threads", "rows": 64,
                                                          "figures": figures})  # fmt: skip
    code = """
        import torch, prep
        from tests import wisdomfns
        with prep.Pool("auto", workers=2) as pool:  # (it writes its figures at exit)
            out = pool.map_rows(wisdomfns.doubled, torch.ones(64, 3))
            assert torch.equal(out, torch.full((64, 3), 2.0))
            (cal,) = pool.choices()
            print(cal.choice, cal.sample, sorted(cal.observed), cal.remembered != "")
            print(pool.explain())
    """
    out = python(code, file)
    assert out.splitlines()[0] == "threads 0 ['threads'] True", out  # no calibration
    assert "remembered from an earlier run" in out


def test_a_remembered_choice_moves_when_the_figures_do():
    from prep.auto import Decisions

    entry = {"choice": "threads", "rows": 100, "figures": {"threads": 0.01, "serial": 0.05}}
    d = Decisions.from_wisdom(entry, workers=2, options="")
    assert d.cal.choice == "threads" and d.cal.remembered
    d.observe("threads", 0.2, 100)  # this machine is not what the file says today
    assert d.cal.choice == "serial"


def test_each_executors_own_figures_are_remembered_by_its_name_and_old_entries_read():
    from prep.auto import Calibration, Decisions

    cal = Calibration(rows=100, workers=2, predicted={"serial": 0.05, "threads": 0.03})
    cal.choice, cal.serial_row = "threads", 5e-4
    cal.start["processes"], cal.speedup["threads"] = 0.3, 1.7
    again = Decisions.from_wisdom(json.loads(json.dumps(cal.to_wisdom())), 2, "").cal
    assert (again.start, again.speedup, again.serial_row) == (cal.start, cal.speedup, 5e-4)
    # an entry an older prep wrote kept them under keys of their own
    old = {"choice": "serial", "rows": 100, "figures": {"serial": 0.05}, "serial_row": 5e-4,
           "process_start": 0.3, "thread_speedup": 1.7}  # fmt: skip
    again = Decisions.from_wisdom(old, 2, "").cal
    assert again.start == {"processes": 0.3} and again.speedup == {"threads": 1.7}


@pytest.mark.parametrize(
    "text",
    ["{not json", json.dumps({"format": 1, "entries": {"K": {"choice": "nope", "rows": 4,
                                                            "figures": {"nope": 1.0}}}}),
     json.dumps({"format": 1, "entries": {"K": {"choice": "serial", "rows": 4,
                                                "figures": {"serial": -1.0}}}}),
     json.dumps({"format": 99, "entries": {}}), json.dumps([1, 2])],
)  # fmt: skip
def test_a_corrupt_or_stale_file_is_ignored_and_replaced(file, text):
    x = torch.ones(64, 3)
    file.parent.mkdir(parents=True)
    file.write_text(text.replace("K", key_of(wisdomfns.doubled, x) or "K"))
    with prep.Pool("auto", workers=2) as pool:
        assert torch.equal(pool.map_rows(wisdomfns.doubled, x), x * 2)
        (cal,) = pool.choices()
    assert not cal.remembered and cal.sample > 0  # measured here
    wisdom.flush()
    assert json.loads(file.read_text())["format"] == wisdom.FORMAT  # a whole file again


def test_changed_code_is_not_the_remembered_function(file):
    x = torch.ones(64, 3)
    entry = {"choice": "threads", "rows": 64, "figures": {"threads": 1e-5, "serial": 1.0}}
    wisdom.remember(key_of(wisdomfns.doubled, x), entry)
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(wisdomfns.tripled, x)  # same module, other code
        (cal,) = pool.choices()
    assert not cal.remembered


def test_two_processes_writing_at_once_lose_no_entry(file):
    code = """
        import sys
        from prep.auto import wisdom
        for i in range(60):
            assert wisdom.remember(f"{sys.argv[1]}-{i}",
                                   {"choice": "serial", "rows": 4, "figures": {"serial": 1.0}})
    """
    env = {**os.environ, wisdom.ENV: str(file), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), tag], env=env, cwd=ROOT)
        for tag in ("a", "b", "c")
    ]
    assert [p.wait(timeout=90) for p in procs] == [0, 0, 0]
    entries = json.loads(file.read_text())["entries"]
    assert len(entries) == 180
    assert not [p for p in file.parent.iterdir() if p.suffix == ".tmp"]  # no temp left


def test_prep_forget_on_the_command_line(file, capsys):
    from prep.cli import main

    wisdom.remember("k", {"choice": "serial", "rows": 4, "figures": {"serial": 1.0}})
    assert main(["forget"]) == 0
    assert f"forgot 1 remembered choice of auto ({file})" in capsys.readouterr().out
    assert not file.exists()


def test_an_interpreter_writes_what_auto_learned_by_the_time_it_exits(file):
    code = """
        import torch, prep
        from prep.auto import wisdom
        from tests import wisdomfns
        wisdom.busy = lambda: ""  # a quiet machine (injected)
        prep.map_rows(wisdomfns.doubled, torch.ones(64, 3), workers=2)
    """
    python(code, file)
    entries = json.loads(file.read_text())["entries"]
    assert key_of(wisdomfns.doubled, torch.ones(64, 3)) in entries


def test_figures_taken_on_a_busy_machine_are_not_remembered(file, monkeypatch):
    monkeypatch.setattr(wisdom, "busy", lambda: "the load average is 5.1 on 2 cores")
    with prep.Pool("auto", workers=2) as pool:
        for _ in range(3):
            pool.map_rows(wisdomfns.doubled, torch.ones(64, 3))
        (cal,) = pool.choices()
    wisdom.flush()
    assert not file.exists()
    assert "not remembered for later runs: the load average is 5.1 on 2 cores" in str(cal)


def test_a_remembered_calibration_tries_no_executor_again():
    from prep.auto import Decisions

    entry = {"choice": "serial", "rows": 100, "figures": {"serial": 0.05, "threads": 0.06}}
    d = Decisions.from_wisdom(entry, workers=2, options="")
    d.observe("serial", 0.05, 100)
    assert d.next_trial() is None  # threads' figure is a whole batch's, from that run


def test_wisdom_off_says_nothing_of_a_busy_machine(monkeypatch):
    monkeypatch.setenv(wisdom.ENV, "off")
    monkeypatch.setattr(wisdom, "busy", lambda: "the load average is 5.1 on 2 cores")
    with prep.Pool("auto", workers=2) as pool:
        pool.map_rows(wisdomfns.doubled, torch.ones(64, 3))
        (cal,) = pool.choices()
        ((_, (decisions,)),) = pool._get("auto")._choices.values()
    assert decisions.wisdom_key is None and "remembered" not in str(cal)


def test_a_remembered_choice_is_written_again_only_once_it_moved():
    """A short program on a remembered choice pays no write (a thread start, a file
    write) for figures the file already holds: its choice's own batches are written
    after 8, and a new choice at once."""
    from prep.auto import Decisions

    entry = {"choice": "serial", "rows": 100, "figures": {"serial": 0.05, "threads": 0.06}}
    d = Decisions.from_wisdom(entry, workers=2, options="")
    writes = []
    for batch in range(8):
        d.observe("serial", 0.05, 100)
        writes += [batch] if d.wisdom_changed() else []
    assert writes == [7]  # after 8 of its batches
    for _ in range(8):  # now ten times slower: threads is the better choice
        d.observe("serial", 0.5, 100)
    assert d.cal.choice == "threads" and d.wisdom_changed()
