"""The seams of the public API: ``map_rows`` over the shared pools, one options type,
one ``explain`` type, names that mean one thing, and warnings that point at the
user's line whichever way a batch came in."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import threading
import typing
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

import prep
import prep.pool
from prep.core.options import NAMES, CallOptions, Options
from tests import rowfns
from tests.conftest import pool_children

pytestmark = pytest.mark.timeout(120)

PREP = Path(prep.__file__).parent
ROOT = PREP.parent
ROWS = torch.arange(8).view(8, 1)  # fail_on_5 fails row 5


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``from ... import`` in ``path``, in functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append(("." * node.level + (node.module or ""), [a.name for a in node.names]))
    return found


# ------------------------------------------------------------------ api -> pool, one way


def test_pool_never_imports_api_and_api_takes_only_public_names_from_pool():
    assert not [m for m, _ in _imports(PREP / "pool.py") if m in (".api", "prep.api")]
    from_pool = [n for m, names in _imports(PREP / "api.py") if m == ".pool" for n in names]
    assert from_pool and not [n for n in from_pool if n.startswith("_")]


@pytest.mark.parametrize("module", ["api.py", "pool.py", "collate.py"])
def test_no_branch_compares_an_executor_name(module):
    """The registry is a table: nothing asks ``if name == "auto"``."""
    names = set(prep.EXECUTORS) | {"AUTO"}
    tree = ast.parse((PREP / module).read_text())
    compared = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for side in [node.left, *node.comparators]
        if (isinstance(side, ast.Constant) and side.value in names)
        or (isinstance(side, ast.Name) and side.id in names)
    ]
    assert not compared, compared


AT_EXIT = """
import atexit

def after():  # registered before prep's own handler, so it runs after it
    import prep.pool
    print("closed" if warm.closed and not prep.pool.SHARED._pools else "open", flush=True)

atexit.register(after)
import os, torch, prep, prep.pool
print(os.getpid(), flush=True)
input()  # the test looks for processes here, after the import
prep.map_rows(torch.neg, torch.ones(8, 1), executor="processes", workers=2)
warm = prep.pool.SHARED.pool("processes", 2)._warm
print(len(warm.get("processes").engine.pids), flush=True)
"""


def test_importing_prep_starts_no_process_and_the_shared_pools_close_at_exit():
    proc = subprocess.Popen(
        [sys.executable, "-c", AT_EXIT],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pid = int(proc.stdout.readline())
        assert not pool_children(pid)
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "2"  # the workers map_rows started
        assert proc.stdout.readline().strip() == "closed"
        assert proc.wait(60) == 0
    finally:
        proc.kill()


def test_threads_calling_map_rows_at_once_share_one_pool_and_get_their_own_rows(no_leaks):
    prep.shutdown()
    start = threading.Barrier(4)
    got: dict[int, torch.Tensor] = {}

    def call(k: int) -> None:
        start.wait()
        x = torch.full((16, 2), float(k))
        got[k] = prep.map_rows(rowfns.affine, x, executor="threads", workers=2)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == [0, 1, 2, 3]
    assert all(torch.equal(got[k], torch.full((16, 2), 2.0 * k + 1)) for k in got)
    assert list(prep.pool.SHARED._pools) == [("threads", 2, None)]


def test_shutdown_closes_the_shared_pools_and_the_next_call_makes_new_ones(no_leaks):
    prep.map_rows(rowfns.affine, ROWS.float(), executor="threads", workers=2)
    (pool,) = [p for k, p in prep.pool.SHARED._pools.items() if k[:2] == ("threads", 2)]
    executor = pool._get("threads")
    prep.shutdown()
    assert not prep.pool.SHARED._pools
    out = prep.map_rows(rowfns.affine, ROWS.float(), executor="threads", workers=2)
    assert torch.equal(out, ROWS * 2.0 + 1)
    (again,) = prep.pool.SHARED._pools.values()
    assert again is not pool and again._get("threads") is not executor


def test_auto_shares_the_executors_of_its_pool():
    with prep.Pool("auto", workers=2) as pool:
        auto = pool._get("auto")
        assert auto._get("threads") is pool._get("threads")


# ------------------------------------------------------------------ one options type


def test_the_keyword_type_and_the_dataclass_name_the_same_options():
    hints = typing.get_type_hints(CallOptions)
    assert tuple(hints) == NAMES
    assert tuple(f.name for f in dataclasses.fields(Options) if f.init) == NAMES


def test_options_are_frozen_and_checked_once():
    options = Options(pad=0, device="cpu", timeout=10**400)
    assert options.device == torch.device("cpu") and options.timeout is None  # no limit
    assert options.policy.padding is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.pad = 1  # type: ignore[misc]


POOL = lambda: prep.Pool("serial")  # noqa: E731
CALLS = {
    "map_rows": lambda **kw: prep.map_rows(torch.neg, torch.ones(2, 2), executor="serial", **kw),
    "map_samples": lambda **kw: prep.map_samples(torch.neg, [torch.ones(2)], **kw),
    "Pool.map_rows": lambda **kw: POOL().map_rows(torch.neg, torch.ones(2, 2), **kw),
    "Pool.map_samples": lambda **kw: POOL().map_samples(torch.neg, [torch.ones(2)], **kw),
    "Pool.imap": lambda **kw: POOL().imap(torch.neg, [torch.ones(2, 2)], **kw),
    "Pool.imap_samples": lambda **kw: POOL().imap_samples(torch.neg, [[1]], **kw),
    "Collate": lambda **kw: prep.Collate(torch.neg, executor="serial", **kw)([torch.ones(2)]),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_name_that_is_not_an_option_is_one_error_naming_it_and_the_choices(call):
    with pytest.raises(TypeError) as raised:
        CALLS[call](padd=0)
    text = str(raised.value)
    assert text.startswith(f"{call}() got padd=, which is not an option (did you mean pad=?)")
    assert "the options are device=, timeout=, out=, pad=, pad_to=" in text


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_bad_value_is_refused_the_same_way_everywhere(call):
    with pytest.raises(ValueError, match="on_error='drop' is not one of 'raise', 'fill', 'skip'"):
        CALLS[call](on_error="drop")


def test_a_pools_device_and_timeout_are_each_calls_defaults():
    with prep.Pool("serial", device="meta", timeout=30) as pool:
        assert pool.map_rows(torch.neg, torch.ones(2, 2)).device.type == "meta"
        assert pool.map_rows(torch.neg, torch.ones(2, 2), device="cpu").device.type == "cpu"
        with pytest.raises(ValueError, match="timeout=-1 is not a positive number"):
            pool.map_rows(torch.neg, torch.ones(2, 2), timeout=-1)


def test_collate_checks_its_options_when_made_and_refuses_out():
    with pytest.raises(ValueError, match="on_error='drop'"):
        prep.Collate(torch.neg, on_error="drop")
    with pytest.raises(prep.ConfigError, match="device='nowhere' is not a torch device"):
        prep.Collate(torch.neg, device="nowhere")
    with pytest.raises(prep.ConfigError, match="out= is one buffer"):
        prep.Collate(torch.neg, out=torch.zeros(2, 2))


def test_collate_takes_a_timeout_like_every_other_call():
    """40 rows of at least 50 ms each under serial, which checks before every row: past
    0.5 s whatever the machine's speed."""
    collate = prep.Collate(rowfns.slow, executor="serial", timeout=0.5)
    try:
        with pytest.raises(prep.BatchTimeout):
            collate([torch.ones(1)] * 40)
    finally:
        collate.close()


# ------------------------------------------------------------------ one explain type


def test_explain_returns_an_explanation_everywhere():
    x = torch.arange(64.0).view(64, 1)
    why = prep.explain(rowfns.affine, x, workers=2)
    assert isinstance(why, prep.Explanation) and isinstance(why, str)
    (cal,) = why.calibrations
    assert why.choice == cal.choice and why.predicted == cal.predicted  # read through
    assert str(why) == str(cal)
    with prep.Pool("auto", workers=2) as pool:
        before = pool.explain()
        assert isinstance(before, prep.Explanation) and before == "nothing yet"
        assert before.calibrations == ()
        with pytest.raises(AttributeError, match="auto has measured nothing yet"):
            before.choice  # noqa: B018
        pool.map_rows(rowfns.affine, x)
        after, choices = pool.explain(), pool.choices()
    assert isinstance(after, prep.Explanation)
    assert after.calibrations == tuple(choices) and after.choice == choices[-1].choice
    assert str(after).splitlines()[-1].strip() == f"choice: {after.choice}"


def test_no_field_of_a_calibration_is_hidden_by_a_str_method():
    """An Explanation is a str: a Calibration field that str also has would read as
    the str's, not the calibration's."""
    fields = {f.name for f in dataclasses.fields(prep.auto.Calibration)}
    public = {n for n in dir(prep.auto.Calibration) if not n.startswith("_")}
    assert not (fields | public) & set(dir(str))


# ------------------------------------------------------------------ names


def test_prep_executors_is_the_subpackage_and_the_registry_is_executors_in_capitals():
    import types

    import prep.executors

    assert isinstance(prep.executors, types.ModuleType)
    assert prep.executors.REGISTRY.items() <= prep.EXECUTORS.items()
    assert "auto" in prep.EXECUTORS and prep.EXECUTORS["auto"] is prep.auto.AutoExecutor
    with pytest.raises(TypeError):
        prep.EXECUTORS["mine"] = prep.executors.REGISTRY["serial"]  # type: ignore[index]


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.ClassDef):
        return node.name == name
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def test_one_thing_is_called_progress():
    defined = [
        str(path.relative_to(PREP))
        for path in PREP.rglob("*.py")
        for node in ast.parse(path.read_text()).body
        if _defines(node, "Progress")
    ]
    assert len(defined) <= 1, defined


# ------------------------------------------------------------------ warnings point here


def _warned_here(call) -> None:
    """``call()`` warns once of its failed row, at this file's line."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    assert [w.filename for w in seen] == [__file__], [(w.filename, str(w.message)) for w in seen]
    assert "1 of 8 rows failed and were filled" in str(seen[0].message)


@pytest.mark.parametrize("executor", ["serial", "threads"])
def test_a_warning_points_at_the_line_that_called_map_rows(executor):
    _warned_here(lambda: prep.map_rows(rowfns.fail_on_5, ROWS, executor=executor, on_error="fill"))
    _warned_here(
        lambda: prep.map_samples(rowfns.fail_on_5, list(ROWS), executor=executor, on_error="fill")
    )


@pytest.mark.parametrize("executor", ["serial", "threads"])
def test_a_warning_points_at_the_line_that_called_a_pool(executor):
    with prep.Pool(executor, workers=2) as pool:
        _warned_here(lambda: pool.map_rows(rowfns.fail_on_5, ROWS, on_error="fill"))
        _warned_here(lambda: pool.map_samples(rowfns.fail_on_5, list(ROWS), on_error="fill"))


@pytest.mark.parametrize("collate", [None, default_collate])
def test_a_warning_points_at_the_line_that_called_collate(collate):
    collate_fn = prep.Collate(rowfns.fail_on_5, executor="threads", collate=collate,
                              on_error="fill", workers=2)  # fmt: skip
    try:
        _warned_here(lambda: collate_fn(list(ROWS)))
    finally:
        collate_fn.close()


@pytest.mark.parametrize(("prefetch", "strategy"), [(0, "split"), (2, "split"), (2, "whole")])
def test_a_warning_points_at_the_line_that_called_imap(prefetch, strategy):
    with prep.Pool("threads", workers=2) as pool:
        _warned_here(
            lambda: list(
                pool.imap(rowfns.fail_on_5, [ROWS], on_error="fill", prefetch=prefetch,
                          strategy=strategy)
            )
        )  # fmt: skip


def test_the_dataloader_worker_fallback_points_at_the_caller(monkeypatch):
    monkeypatch.setattr(prep.pool, "in_worker_process", lambda: True)
    monkeypatch.setattr(prep.pool, "_warned_fallback", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = prep.map_rows(rowfns.affine, ROWS.float(), executor="processes", workers=2)
    assert torch.equal(out, ROWS * 2.0 + 1)
    assert [w.filename for w in seen] == [__file__]
    assert "using 'threads' in this worker instead" in str(seen[0].message)


# ------------------------------------------------------------------ sizes

SIZED = sorted(str(p.relative_to(PREP)) for p in PREP.rglob("*.py"))


@pytest.mark.parametrize("module", SIZED)
def test_every_module_keeps_its_size(module):
    """Modules up to 400 lines, classes up to 200, functions up to 60."""
    text = (PREP / module).read_text()
    assert len(text.splitlines()) <= 400
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            limit = 200 if isinstance(node, ast.ClassDef) else 60
            assert lines <= limit, f"{module}: {node.name} is {lines} lines"


@pytest.mark.parametrize("name", sorted(prep.EXECUTORS))
def test_an_executor_is_run_and_close_and_little_else(name):
    """The ``concurrent.futures`` shape: ``run`` and ``close``, the workers, the engine
    that ``submit``s units, ``release`` and the kind's traits; what auto asks of a kind
    is its cost model (``prep.auto.models``), not the executor's."""
    cls = prep.EXECUTORS[name]
    members = {m for m in dir(cls) if not m.startswith("_") and m != "name"}
    members |= {m for m in vars(cls(1)) if not m.startswith("_")}
    # auto's own report: the choice of each signature, which explain() and Pool.choices read
    contract = {"workers", "traits", "engine", "run", "close", "release"}
    assert members - contract <= ({"choices"} if name == "auto" else set()), members
    assert len(members - {"choices"}) <= 6
