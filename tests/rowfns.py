"""Row functions for the tests, at module level so worker processes can import them."""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

import prep


def _affine_batch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


@prep.rowwise(batched=_affine_batch)
def affine(row: torch.Tensor) -> torch.Tensor:
    return row * 2 + 1


def _reverse_batch(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1)


@prep.rowwise(batched=_reverse_batch)
def reverse(row: torch.Tensor) -> torch.Tensor:
    """Works for every dtype, bool included."""
    return row.flip(-1)


def _pair_batch(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a + b, a.flatten(1).sum(1)


@prep.rowwise(batched=_pair_batch)
def pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a + b, a.flatten().sum()


def _named_batch(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"sum": x + y, "flip": x.flip(-1)}


@prep.rowwise(batched=_named_batch)
def named(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"sum": x + y, "flip": x.flip(-1)}


def identity(row: torch.Tensor) -> torch.Tensor:
    return row


def ragged(row: torch.Tensor) -> torch.Tensor:
    """Row 3 returns a shorter tensor than the others."""
    return row[:2] if int(row.flatten()[0]) == 3 else row


def wrong_dtype(row: torch.Tensor) -> torch.Tensor:
    return row.double() if int(row.flatten()[0]) == 2 else row


def not_a_tensor(row: torch.Tensor) -> object:
    return row.tolist()


def fail_on_5(row: torch.Tensor) -> torch.Tensor:
    if int(row.flatten()[0]) == 5:
        raise ValueError(f"cannot handle {int(row.flatten()[0])}")
    return row


def sample_len(sample: dict) -> torch.Tensor:
    """A collate-style fn: pad a variable-length sample to 8."""
    t = torch.as_tensor(sample["tokens"], dtype=torch.int64)[:8]
    return torch.nn.functional.pad(t, (0, 8 - len(t)))


def hang(row: torch.Tensor) -> torch.Tensor:
    if int(row.flatten()[0]) == 1:
        time.sleep(3600)
    return row


def segfault(row: torch.Tensor) -> torch.Tensor:
    if int(row.flatten()[0]) == 1:
        ctypes.string_at(0)
    return row


def suicide(row: torch.Tensor) -> torch.Tensor:
    if int(row.flatten()[0]) == 1:
        os.kill(os.getpid(), 9)
    return row


def slow(row: torch.Tensor) -> torch.Tensor:
    time.sleep(0.05)
    return row


def thread_settings(row: torch.Tensor) -> torch.Tensor:
    return torch.tensor(
        [torch.get_num_threads(), int(os.environ.get("OMP_NUM_THREADS", "0")), os.getpid()]
    )


def returns_lambda_tensor(row: torch.Tensor) -> torch.Tensor:
    return row


def pad_tokens(sample: torch.Tensor) -> torch.Tensor:
    """Variable-length int64 tokens -> 6, padded with zeros behind."""
    return torch.nn.functional.pad(sample[:6], (0, max(0, 6 - len(sample))))


def pad_pair(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, label = sample
    return pad_tokens(tokens), label


def pad_dict(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"tokens": pad_tokens(sample["tokens"]), "n": torch.tensor(len(sample["tokens"]))}


def row_sum(row: torch.Tensor) -> torch.Tensor:
    return row.sum(0, keepdim=True)


def cuda_state(row: torch.Tensor) -> torch.Tensor:
    """1 where this process has initialized CUDA (a worker never should)."""
    return torch.tensor([float(torch.cuda.is_initialized())])


def with_lock(row: torch.Tensor, *, lock: object) -> torch.Tensor:
    """Bound to a lock with functools.partial: a function no pickler can send."""
    return row


def nap(i: int) -> int:
    """A task that takes 20 ms on any machine (a sleep needs no CPU)."""
    time.sleep(0.02)
    return i


def variable(sample: torch.Tensor) -> torch.Tensor:
    """``sample`` = [length, fails, value]: ``length`` copies of ``value`` (float32),
    or a ValueError where ``fails`` is 1."""
    length, fails, value = (int(v) for v in sample[:3])
    if fails:
        raise ValueError(f"bad sample {value}")
    return torch.full((length,), float(value))


def ragged_2d(sample: torch.Tensor) -> dict[str, torch.Tensor]:
    """``sample`` = [h, w, value]: a dict of an int64 ``[h, w]`` block and a bool ``[w]``."""
    h, w, value = (int(v) for v in sample[:3])
    return {
        "ids": torch.full((h, w), value, dtype=torch.int64),
        "mask": torch.ones(w, dtype=torch.bool),
    }


def ids_and_ids_lengths(sample: torch.Tensor) -> dict[str, torch.Tensor]:
    """A dict result whose second key is what ``prep run --pad`` names the first's lengths."""
    return {"ids": sample[:1], "ids_lengths": sample[1:2]}


def exits(row: torch.Tensor) -> torch.Tensor:
    """Row 1 ends its worker process at once (``os._exit``, no cleanup)."""
    if int(row.flatten()[0]) == 1:
        os._exit(3)
    return row


def dies_writing(row: torch.Tensor) -> torch.Tensor:
    """Row 1 leaves a shard's temporary file in $PREP_TEST_OUT, as a save in progress
    does, and ends its worker process at once: a worker killed while it wrote."""
    if int(row.flatten()[0]) == 1:
        out = os.environ["PREP_TEST_OUT"]
        with open(os.path.join(out, f".s0.pt.tmp-{os.getpid()}-0123abcd"), "wb") as f:
            f.write(b"PK")
        os._exit(3)
    return row


def shaped(sample: torch.Tensor) -> torch.Tensor:
    """``sample`` = [dims, d0, d1, d2, dtype index, value]: a tensor of that many dims."""
    dims, d0, d1, d2, dtype, value = (int(v) for v in sample[:6])
    kind = (torch.float32, torch.int64, torch.bool, torch.float16)[dtype]
    return torch.full((d0, d1, d2)[:dims], value, dtype=torch.float32).to(kind)


def marks_then_sleeps(row: torch.Tensor, *, path: str, seconds: float) -> torch.Tensor:
    """Touches ``path`` (a test waits for it: the batch has started, in a worker), then
    sleeps: a test synchronises on the file, never on a sleep of its own."""
    with open(path, "a"):
        pass
    time.sleep(seconds)
    return row


def wwm_row(input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A dict-shard row function in pure Python, as issue 30's user wrote one: ``input_ids``
    [L] and its scalar ``lengths`` (a 0-d tensor) by name; ids past the length become 0,
    and a row whose length is 7 raises (a bad sample)."""
    n = int(lengths)
    if n == 7:
        raise ValueError(f"bad sample: length {n}")
    ids = input_ids.tolist()
    return torch.tensor([t if i < n else 0 for i, t in enumerate(ids)], dtype=torch.int64)


def needs_state(x: torch.Tensor, *, state: dict) -> torch.Tensor:
    """A row function that takes per-worker state (``--setup``)."""
    return x + state["offset"]


def waits_for_go(row: torch.Tensor, *, started: str, go: str) -> torch.Tensor:
    """Touches ``started`` (a test waits for it: a shard is in flight on a worker), then
    waits until the file ``go`` exists: the test decides when the row ends, by an event."""
    with open(started, "a"):
        pass
    while not os.path.exists(go):
        time.sleep(0.01)
    return row


def exits_politely(row: torch.Tensor) -> torch.Tensor:
    """A row starting with 1 calls ``sys.exit``: a BaseException, not a row's error."""
    if int(row.flatten()[0]) == 1:
        sys.exit(3)
    return row


def scaled_by(x: torch.Tensor, fn: int = 1, names: int = 1, positional: int = 1) -> torch.Tensor:
    """Keywords named as prep's own call checks name their parameters (--arg fn=...)."""
    return x * fn * names * positional
