"""The CUDA paths: results land on the GPU, workers never touch CUDA. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import prep
from tests import rowfns

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(120),
]

EXECUTORS = sorted(prep.EXECUTORS)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_result_lands_on_the_device(executor):
    x = torch.randn(64, 5, 3)
    got = prep.map_rows(rowfns.affine, x, executor=executor, workers=2, device="cuda")
    torch.cuda.synchronize()
    assert got.device.type == "cuda"
    assert torch.equal(got.cpu(), x * 2 + 1)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_out_on_the_device_is_filled(executor):
    x = torch.randn(40, 4)
    out = torch.empty(40, 4, device="cuda")
    got = prep.map_rows(rowfns.affine, x, executor=executor, workers=2, out=out)
    torch.cuda.synchronize()
    assert got is out and torch.equal(out.cpu(), x * 2 + 1)


@pytest.mark.parametrize("executor", ["serial", "threads", "vectorized", "vmap", "auto"])
def test_a_batch_already_on_the_gpu(executor):
    x = torch.randn(32, 6, device="cuda")
    got = prep.map_rows(rowfns.affine, x, executor=executor, workers=2)
    assert got.device.type == "cuda" and torch.equal(got, x * 2 + 1)


def test_processes_refuse_gpu_tensors_and_never_init_cuda():
    torch.zeros(1, device="cuda")  # CUDA is initialized in this (the parent) process
    assert torch.cuda.is_initialized()
    with pytest.raises(prep.ConfigError, match="workers never touch CUDA"):
        prep.map_rows(rowfns.affine, torch.ones(4, 2, device="cuda"), executor="processes")
    flags = prep.map_rows(
        rowfns.cuda_state, torch.ones(8, 1), executor="processes", workers=2, device="cuda"
    )
    assert flags.device.type == "cuda" and flags.sum().item() == 0


def test_collate_moves_to_the_device_in_the_main_process_only():
    data = [torch.arange(n) for n in range(1, 13)]
    collate = prep.Collate(rowfns.pad_tokens, executor="threads", device="cuda")
    assert collate(data[:4]).device.type == "cuda"
    pinned = prep.Collate(rowfns.pad_tokens, executor="threads", pin_memory=True)
    assert pinned(data[:4]).is_pinned()
    # in workers: CPU tensors; the DataLoader's own pin_memory pins them in the main process
    loader = DataLoader(
        data,
        batch_size=4,
        num_workers=1,
        collate_fn=collate,
        multiprocessing_context="spawn",
        pin_memory=True,
    )
    batches = list(loader)
    assert all(b.device.type == "cpu" and b.is_pinned() for b in batches)
    collate.close()
    pinned.close()


@pytest.mark.parametrize("executor", ["serial", "threads"])
def test_padded_rows_that_grow_stay_on_the_gpu(executor):
    # a CUDA tensor's is_shared() is always True: a padded buffer grown for a longer row
    # must stay on the GPU, not move to CPU shared memory
    samples = [torch.arange(n, device="cuda") for n in (1, 5, 2, 9, 3)]
    got = prep.map_samples(rowfns.identity, samples, pad=0, executor=executor, workers=2)
    want = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    assert got.device.type == "cuda" and torch.equal(got, want)
