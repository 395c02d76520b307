"""Arguments are checked where they are given, and every executor keeps its timeout."""

from __future__ import annotations

import math
import time

import pytest
import torch

import prep
from tests import rowfns

pytestmark = pytest.mark.timeout(120)

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
x = torch.arange(8.0).view(8, 1)


def entry_points(**kw):
    """Each place a user gives timeout= or device=, as a call that takes them."""
    yield "map_rows", lambda: prep.map_rows(rowfns.affine, x, executor="serial", **kw)
    yield "map_samples", lambda: prep.map_samples(rowfns.affine, list(x), executor="serial", **kw)
    yield "Pool", lambda: prep.Pool("serial", **kw)


@pytest.mark.parametrize(
    ("timeout", "error", "match"),
    [
        ("5", TypeError, r"timeout='5' is a str, not a number of seconds"),
        (True, TypeError, r"timeout=True is a bool"),
        ([1], TypeError, r"timeout=\[1\] is a list"),
        (0, ValueError, r"timeout=0 is not a positive number"),
        (-1, ValueError, r"timeout=-1 is not a positive number"),
        (math.nan, ValueError, r"timeout=nan is not a positive number"),
    ],
)
def test_a_bad_timeout_is_refused_where_it_is_given(timeout, error, match):
    for where, call in entry_points(timeout=timeout):
        with pytest.raises(error, match=match):
            call()
        assert not issubclass(error, prep.BatchTimeout), where


def test_good_timeouts_pass():
    for _, call in entry_points(timeout=5):
        call()
    assert prep.Pool("serial", timeout=2.5).timeout == 2.5
    assert prep.Pool("serial", timeout=math.inf).timeout is None  # no limit


@NO_CUDA
@pytest.mark.parametrize("executor", sorted(prep.EXECUTORS))
def test_cuda_where_torch_has_none_is_one_clear_error_for_every_executor(executor):
    with pytest.raises(prep.ConfigError, match=r"device='cuda', but torch has no CUDA here"):
        prep.map_rows(rowfns.affine, x, executor=executor, device="cuda")


@NO_CUDA
def test_cuda_where_torch_has_none_is_refused_by_pool_and_collate():
    for make in (
        lambda: prep.Pool(device="cuda:0"),
        lambda: prep.Collate(rowfns.affine, device="cuda"),
    ):
        with pytest.raises(prep.ConfigError, match=r"torch has no CUDA here.*device=None"):
            make()


def test_a_cuda_index_beyond_the_visible_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(prep.ConfigError, match=r"'cuda:3', but only 1 CUDA device"):
        prep.Pool(device="cuda:3")


def test_serial_checks_its_timeout_at_every_row():
    ran: list[int] = []

    def sleepy(row: torch.Tensor) -> torch.Tensor:
        ran.append(1)
        time.sleep(0.3)  # the rows' own time (a wait, whatever the machine's speed)
        return row

    # 32 rows of 0.3 s: checked once a block, the timeout would be seen after all 32
    with pytest.raises(prep.BatchTimeout, match=r"timeout=0.5 s"):
        prep.map_rows(sleepy, torch.zeros(32, 1), executor="serial", timeout=0.5)
    # checked before every row: the rows that started before 0.5 s were up, and no more
    # (two, or three on a machine where a row's own overhead is tiny)
    assert 2 <= len(ran) <= 3, ran
