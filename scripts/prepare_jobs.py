"""The row functions and data of ``scripts/bench_prepare.py``: two ways to prepare a data set.

Plain functions, importable by name from the folder this file is in (``prep run --fn
prepare_jobs:wwm_row`` run from there, or from a folder this file was copied into):

* :func:`wwm_row`: whole-word masking of WordPiece-like token ids, in pure Python (the
  GIL held the whole time); a shard is ``{"input_ids": int64 [rows, 128], "seed": int64
  [rows]}`` (:func:`make_wwm_shard`);
* :func:`image_row`: resize, colour jitter and normalise an image with torch ops; a shard
  is ``{"image": uint8 [rows, 3, 256, 256], "seed": int64 [rows]}``
  (:func:`make_image_shard`);
* :func:`cumsum_row` and :func:`python_row`: a light torch row and a pure-Python one,
  for thousands of small shards ``{"x": int64 [rows, 32]}`` (:func:`make_small_shard`);
* :func:`affine_row`: ``x * 0.5 + 1``, for shards of about 1 GiB ``{"x": float32 [rows,
  4096]}`` (:func:`make_big_shard`), where reading, writing and memory are the job.

All are deterministic: a row's randomness comes from its ``seed`` alone, so every way of
running them (a loop, processes, threads, another library) must produce the same bytes.

    python scripts/prepare_jobs.py        # the cost of a row of each, in this process
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = [
    "BIG_WIDTH",
    "GIB_ROWS",
    "IMAGE_SIDE",
    "MAKERS",
    "OUT_SIDE",
    "SEQ",
    "SMALL_WIDTH",
    "VOCAB",
    "affine_row",
    "cumsum_row",
    "image_row",
    "make_big_shard",
    "make_image_shard",
    "make_small_shard",
    "make_wwm_shard",
    "python_row",
    "wwm_row",
    "write_shards",
]

# ------------------------------------------------------------------ whole-word masking

SEQ = 128
VOCAB = 30_000
CLS, SEP, MASK = 101, 102, 103  # special ids (below FIRST_PIECE): never grouped, never masked
FIRST_PIECE = 1_000  # ids 0..999 are special or unused
CONTINUATION = 20_000  # ids 20000..29999 continue the word before them, as "##ing" does
MASK_RATE = 0.15
#: candidate maskings drawn per row; the one whose count of masked pieces is nearest
#: MASK_RATE of the pieces is kept (picking whole words over- or undershoots that budget
#: when long words are drawn). It sets a row's cost: about 150-300 us on one core.
CANDIDATES = 10


def wwm_row(input_ids: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """Whole-word masking of one row of ids (int64 [SEQ]) with ``random.Random(int(seed))``.

    A word is a piece that is not a continuation followed by its continuation pieces. About
    MASK_RATE of the words are picked; every piece of a picked word becomes MASK (80% of the
    words), a random piece (10%) or stays (10%). Of CANDIDATES such draws, the first whose
    masked pieces are nearest MASK_RATE of the row's pieces wins. Returns int64 [SEQ].
    """
    ids = input_ids.tolist()
    rnd = random.Random(int(seed))
    word_of = []  # the word index of every position, -1 for special ids
    words = 0
    previous = -1
    for i, t in enumerate(ids):
        if t < FIRST_PIECE:
            word_of.append(-1)
            continue
        if t < CONTINUATION or previous != i - 1:
            words += 1  # a word starts here (a continuation after a special starts one too)
        word_of.append(words - 1)
        previous = i
    if not words:
        return torch.tensor(ids, dtype=torch.int64)
    pieces = len(ids) - word_of.count(-1)
    budget = MASK_RATE * pieces
    picks = max(1, round(MASK_RATE * words))
    best, best_gap = ids, float("inf")
    for _ in range(CANDIDATES):
        how = {w: rnd.random() for w in rnd.sample(range(words), picks)}
        out = []
        masked = 0
        for t, w in zip(ids, word_of):
            r = how.get(w)
            if r is None:
                out.append(t)
                continue
            masked += 1
            if r < 0.8:
                out.append(MASK)
            elif r < 0.9:
                out.append(rnd.randrange(FIRST_PIECE, VOCAB))
            else:
                out.append(t)
        gap = abs(masked - budget)
        if gap < best_gap:
            best, best_gap = out, gap
    return torch.tensor(best, dtype=torch.int64)


def _zipf(low: int, high: int, n: int, g: torch.Generator, s: float = 1.1) -> torch.Tensor:
    """``n`` ids in [low, high), the k-th most frequent with weight 1 / k**s."""
    weights = 1.0 / torch.arange(1, high - low + 1, dtype=torch.float64) ** s
    return low + torch.multinomial(weights, n, replacement=True, generator=g)


def make_wwm_shard(rows: int, seed: int) -> dict[str, torch.Tensor]:
    """``{"input_ids": int64 [rows, SEQ], "seed": int64 [rows]}``: CLS, pieces, SEP.

    About a third of the pieces are continuations (Zipf-distributed over their range, as
    the word starts are over theirs), so words run from one piece to several.
    """
    g = torch.Generator().manual_seed(seed)
    n = rows * SEQ
    starts = _zipf(FIRST_PIECE, CONTINUATION, n, g)
    continues = _zipf(CONTINUATION, VOCAB, n, g)
    is_continuation = torch.rand(n, generator=g) < 0.35
    ids = torch.where(is_continuation, continues, starts).view(rows, SEQ)
    ids[:, 0], ids[:, -1] = CLS, SEP
    seeds = seed * 1_000_003 + torch.arange(rows, dtype=torch.int64)
    return {"input_ids": ids.contiguous(), "seed": seeds}


# ------------------------------------------------------------------ images

IMAGE_SIDE = 256
OUT_SIDE = 224
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def image_row(image: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """Resize (bilinear, antialiased) uint8 [3, H, W] to [3, 224, 224], jitter brightness
    and contrast by factors in [0.6, 1.4] drawn from ``torch.Generator().manual_seed(seed)``,
    normalise with ImageNet's mean and std; float16 [3, 224, 224].

    Only element-wise ops follow the resize, and the contrast's centre (the image's mean
    grey) is an integer sum, so the bytes do not depend on how many threads torch uses.
    """
    g = torch.Generator().manual_seed(int(seed))
    brightness, contrast = (0.6 + 0.8 * torch.rand(2, generator=g, dtype=torch.float64)).tolist()
    # mean grey of the input, ITU-R 601 weights in integers: exact in any summation order
    rgb = image.to(torch.int64).sum(dim=(1, 2))
    grey = float(299 * rgb[0] + 587 * rgb[1] + 114 * rgb[2]) / (1000 * 255 * image[0].numel())
    x = image.to(torch.float32).unsqueeze(0).div_(255)
    x = F.interpolate(x, size=(OUT_SIDE, OUT_SIDE), mode="bilinear", antialias=True)[0]
    x = x.mul_(brightness).clamp_(0, 1)
    centre = min(grey * brightness, 1.0)
    x = x.sub_(centre).mul_(contrast).add_(centre).clamp_(0, 1)
    return x.sub_(MEAN).div_(STD).to(torch.float16)


def make_image_shard(rows: int, seed: int) -> dict[str, torch.Tensor]:
    """``{"image": uint8 [rows, 3, 256, 256], "seed": int64 [rows]}``: random pixels."""
    g = torch.Generator().manual_seed(seed)
    shape = (rows, 3, IMAGE_SIDE, IMAGE_SIDE)
    image = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    seeds = seed * 1_000_003 + torch.arange(rows, dtype=torch.int64)
    return {"image": image, "seed": seeds}


# ------------------------------------------------------------------ many small shards
# issue 38: 2,000 shards of 8 rows (int64 [32]), where what a shard costs beyond its rows
# (a round trip, a manifest line, an fsync) is most of the run

SMALL_WIDTH = 32


def cumsum_row(x: torch.Tensor) -> torch.Tensor:
    """A light torch row."""
    return x.cumsum(0)


def python_row(x: torch.Tensor) -> torch.Tensor:
    """A pure-Python row of about 40 us (the GIL held): a running sum, element by element."""
    values, total, out = x.tolist(), 0, []
    for _ in range(12):
        total, out = 0, []
        for v in values:
            total += v * v % 7
            out.append(total)
    return torch.tensor(out)


def make_small_shard(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randint(0, 1000, (rows, SMALL_WIDTH), generator=g)}


# ------------------------------------------------------------------ gigabyte shards
# issue 38: 3 shards of 1 GiB (float32 [65536, 4096]) and a light row, where what counts
# is the bytes read, written and held

BIG_WIDTH = 4096
#: rows of a 1 GiB shard
GIB_ROWS = 2**30 // (BIG_WIDTH * 4)


def affine_row(x: torch.Tensor) -> torch.Tensor:
    """A light torch row on a big shard: ``x * 0.5 + 1``."""
    return x * 0.5 + 1


def make_big_shard(rows: int, seed: int) -> dict[str, torch.Tensor]:
    """``{"x": float32 [rows, BIG_WIDTH]}`` of normal draws (``GIB_ROWS`` rows: 1 GiB)."""
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(rows, BIG_WIDTH, generator=g)}


# ------------------------------------------------------------------ shards on disk

MAKERS = {
    "wwm": make_wwm_shard,
    "images": make_image_shard,
    "small-torch": make_small_shard,
    "small-python": make_small_shard,
    "big": make_big_shard,
}


def write_shards(folder: Path | str, job: str, shards: int, rows: int, seed: int = 0) -> list[Path]:
    """Write ``shards`` files ``shard-00000.pt``.. of ``rows`` rows of ``job`` into ``folder``
    (``torch.save`` of a dict of tensors); their paths, in order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(shards):
        path = folder / f"shard-{k:05d}.pt"
        torch.save(MAKERS[job](rows, seed * 10_007 + k), path)
        paths.append(path)  # each shard freed before the next is made: one in memory
    return paths


def row_cost(job: str, rows: int = 300) -> float:
    """Seconds a row of ``job`` takes in this process (after a few untimed rows)."""
    fn = {"wwm": wwm_row, "images": image_row}[job]
    shard = MAKERS[job](rows, 12345)
    cols = list(shard.items())
    for i in range(min(rows, 5)):
        fn(**{k: v[i] for k, v in cols})
    start = time.perf_counter()
    for i in range(rows):
        fn(**{k: v[i] for k, v in cols})
    return (time.perf_counter() - start) / rows


if __name__ == "__main__":
    for job, n in [("wwm", 500), ("images", 100)]:
        print(f"{job}: {row_cost(job, n) * 1e6:,.0f} us a row ({torch.get_num_threads()} threads)")
