"""Row functions from real libraries that are not prep's, as :class:`Workload` objects.

* ``pil_augment``: a ``[256, 256, 3]`` uint8 image a row -> PIL rotate, resize to
  224, Gaussian blur -> ``[224, 224, 3]`` uint8 (PIL releases the GIL in many ops);
* ``hf_tokenize``: a text a row -> a BPE tokenizer of Hugging Face ``tokenizers``,
  trained in memory on a generated corpus (nothing is downloaded) -> 256 int64 ids;
* ``numpy_rfft``: 16384 float32 a row -> ``|np.fft.rfft|`` -> float32;
* ``torch_stft``: a 16000-sample signal a row -> ``|torch.stft|`` (n_fft 400, hop 160,
  Hann window) -> ``[201, 101]`` float32;
* ``text_re``: a text a row -> counts of 8 ``re`` patterns -> int64;
* ``json_parse``: a JSON document a row (40 records) -> 6 summed features, float64.

**Texts are samples.** The text workloads (``samples=True``) have a batch that is a
list of Python ``str`` of varying length, as a data set hands them out, mapped with
:func:`prep.map_samples` / ``Pool.map_samples``; the others are tensor batches for
``map_rows``. Use :func:`call` to run either kind the right way.

Row functions live at module level (worker processes import them by name); their
settings are ``functools.partial`` arguments. PIL, tokenizers and numpy are imported
inside the functions, so this module imports without them; :func:`available` says
which workloads can run here and why the others cannot. Every batch factory is
deterministic (fixed seeds).

>>> from benchmarks.libraries import LIBRARY_WORKLOADS, available
>>> ok, skipped = available()
>>> sorted(set(ok) | set(skipped)) == sorted(LIBRARY_WORKLOADS)
True
>>> row = text_features(texts(1)[0])
>>> row.dtype, tuple(row.shape)
(torch.int64, (8,))
"""

from __future__ import annotations

import functools
import importlib
import itertools
import random
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .jsondocs import json_features, json_records
from .workloads import Workload

__all__ = [
    "LIBRARY_WORKLOADS",
    "LibraryWorkload",
    "available",
    "call",
    "is_samples",
    "missing",
    "texts",
    "unavailable",
]


@dataclass(frozen=True)
class LibraryWorkload(Workload):
    """A :class:`Workload` that needs ``requires`` (module names) and may map samples.

    ``samples=True``: ``batch(rows)`` returns a list of Python objects for
    ``map_samples``, not a batch of tensors for ``map_rows``.
    """

    requires: tuple[str, ...] = ()
    samples: bool = False


def call(pool_or_prep: Any, workload: Workload, batch: Any) -> Any:
    """``pool_or_prep.map_samples`` for a samples workload, else ``.map_rows``.

    ``pool_or_prep`` is a :class:`prep.Pool` (or the ``prep`` module itself, for
    the pool-less functions with their default executor).
    """
    if is_samples(workload):
        return pool_or_prep.map_samples(workload.fn, batch)
    return pool_or_prep.map_rows(workload.fn, batch)


def is_samples(workload: Workload) -> bool:
    """Whether ``workload``'s batch is a list of samples (``map_samples``), not tensors."""
    return bool(getattr(workload, "samples", False))


def unavailable(workload: Workload) -> str:
    """Why ``workload`` cannot run here (a module it requires does not import), or ''."""
    return missing(getattr(workload, "requires", ()))


# ---------------------------------------------------------------- PIL augmentation


def pil_augment(
    row: torch.Tensor, *, angle: float = 12.5, size: int = 224, radius: float = 1.5
) -> torch.Tensor:
    """A uint8 ``[H, W, 3]`` image: rotate, resize to ``size`` x ``size``, blur; uint8 out."""
    import numpy as np
    from PIL import Image, ImageFilter

    image = Image.fromarray(np.ascontiguousarray(row.numpy()), mode="RGB")
    image = image.rotate(angle)  # nearest neighbour, torchvision's RandomRotation default
    image = image.resize((size, size), resample=Image.Resampling.BILINEAR)
    image = image.filter(ImageFilter.GaussianBlur(radius))
    return torch.from_numpy(np.array(image, dtype=np.uint8))


def images(rows: int, side: int = 256, seed: int = 0) -> torch.Tensor:
    """``[rows, side, side, 3]`` uint8: smooth random colour fields plus noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(rows, 3, 8, 8, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear")
    noise = torch.rand(rows, 3, side, side, generator=g) * 0.15
    pixels = ((smooth * 0.85 + noise) * 255).clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous()


# ---------------------------------------------------------------- generated text

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "st"]
_ONSETS += ["tr", "ch", "sh", "th", "pl", "gr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ea", "io"]
_CODAS = ["", "", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st"]
_PUNCT = [",", ",", ".", ".", ".", ";", ":", "!", "?"]


def _lexicon(size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


@functools.lru_cache(maxsize=4)
def _zipf_lexicon(size: int = 5000, seed: int = 1234) -> tuple[list[str], list[float]]:
    """Words and their cumulative Zipf weights (rank ** -1)."""
    return _lexicon(size, seed), list(itertools.accumulate(1.0 / r for r in range(1, size + 1)))


def _text(rng: random.Random, words: list[str], cum_weights: list[float], n_words: int) -> str:
    out: list[str] = []
    start = True
    for word in rng.choices(words, cum_weights=cum_weights, k=n_words):
        roll = rng.random()
        if roll < 0.04:
            word = str(rng.randrange(10 ** rng.randint(1, 5)))
        elif roll < 0.06:
            word = word.upper()
        elif start or roll < 0.14:
            word = word.capitalize()
        start = False
        if rng.random() < 0.12:
            punct = rng.choice(_PUNCT)
            word += punct
            start = punct in ".!?"
        out.append(word)
    return " ".join(out)


def texts(rows: int, seed: int = 0, min_words: int = 60, max_words: int = 240) -> list[str]:
    """``rows`` pseudo-English texts of ``min_words``-``max_words`` words (about 400-1,800 chars).

    Zipf-distributed pseudo-words, capitalised sentence starts, some numbers,
    acronyms and punctuation: enough structure for a BPE tokenizer and for regexes.
    """
    words, cum_weights = _zipf_lexicon()
    rng = random.Random(seed)
    return [_text(rng, words, cum_weights, rng.randint(min_words, max_words)) for _ in range(rows)]


# ---------------------------------------------------------------- HF tokenizers BPE

_tokenizers: dict[tuple[int, int], Any] = {}
_tokenizers_lock = threading.Lock()


def bpe_tokenizer(vocab_size: int = 3000, seed: int = 7) -> Any:
    """A BPE ``tokenizers.Tokenizer`` trained in memory, built once per process.

    Trained on 1,000 generated texts (about 0.3 s here, generating them
    included); each worker process builds its own on its first row. Training is
    deterministic for a fixed corpus, so every process encodes alike
    (``hf_tokenize``'s results are checked against serial's).
    """
    key = (vocab_size, seed)
    tok = _tokenizers.get(key)
    if tok is not None:
        return tok
    with _tokenizers_lock:
        tok = _tokenizers.get(key)
        if tok is None:
            from tokenizers import Tokenizer, models, pre_tokenizers, trainers

            tok = Tokenizer(models.BPE(unk_token="[UNK]"))
            tok.pre_tokenizer = pre_tokenizers.Whitespace()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"],
                show_progress=False,
            )
            tok.train_from_iterator(texts(1000, seed=seed), trainer=trainer)
            _tokenizers[key] = tok
    return tok


def hf_encode(text: str, *, max_len: int = 256, vocab_size: int = 3000) -> torch.Tensor:
    """The BPE ids of ``text``, cut or padded (id 0, ``[PAD]``) to ``max_len``, int64."""
    ids = bpe_tokenizer(vocab_size).encode(text).ids[:max_len]
    ids.extend([0] * (max_len - len(ids)))
    return torch.tensor(ids, dtype=torch.int64)


# ---------------------------------------------------------------- numpy FFT


def numpy_rfft(row: torch.Tensor) -> torch.Tensor:
    """``|np.fft.rfft(row)|`` as float32 (``n // 2 + 1`` values)."""
    import numpy as np

    spectrum = np.abs(np.fft.rfft(row.numpy()))
    return torch.from_numpy(spectrum.astype(np.float32, copy=False))


def signals(rows: int, length: int = 16384, seed: int = 0) -> torch.Tensor:
    """``[rows, length]`` float32: a few sines of random frequency plus noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length, dtype=torch.float32) / length
    freqs = torch.randint(5, length // 4, (rows, 4), generator=g).float()
    phases = torch.rand(rows, 4, generator=g) * 6.283
    waves = torch.sin(6.283 * freqs[:, :, None] * t + phases[:, :, None]).sum(1)
    return waves + 0.1 * torch.randn(rows, length, generator=g)


# ---------------------------------------------------------------- torch.stft


@functools.lru_cache(maxsize=8)
def _hann(n_fft: int) -> torch.Tensor:
    return torch.hann_window(n_fft)


def stft_magnitude(row: torch.Tensor, *, n_fft: int = 400, hop_length: int = 160) -> torch.Tensor:
    """``|torch.stft(row)|`` with a Hann window: ``[n_fft // 2 + 1, frames]`` float32."""
    spec = torch.stft(
        row, n_fft=n_fft, hop_length=hop_length, window=_hann(n_fft), return_complex=True
    )
    return spec.abs()


# ---------------------------------------------------------------- Python re features

#: the patterns ``text_features`` counts, in this order
TEXT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in [
        ("words", r"\b\w+\b"),
        ("numbers", r"\b\d+\b"),
        ("capitalised", r"\b[A-Z][a-z]+\b"),
        ("acronyms", r"\b[A-Z]{2,}\b"),
        ("punctuation", r"[.,;:!?]"),
        ("sentences", r"[.!?](?:\s|$)"),
        ("long words", r"\b[a-zA-Z]{9,}\b"),
        ("vowel pairs", r"[aeiou]{2}"),
    ]
)


def text_features(text: str) -> torch.Tensor:
    """How often each of :data:`TEXT_PATTERNS` matches ``text``, int64."""
    return torch.tensor(
        [sum(1 for _ in pattern.finditer(text)) for _, pattern in TEXT_PATTERNS],
        dtype=torch.int64,
    )


# ---------------------------------------------------------------- the table

LIBRARY_WORKLOADS: dict[str, LibraryWorkload] = {
    w.name: w
    for w in [
        LibraryWorkload(
            "pil_augment",
            pil_augment,
            images,
            "PIL: [256, 256, 3] uint8 image -> rotate, resize 224, Gaussian blur; releases "
            "the GIL in many ops",
            requires=("PIL", "numpy"),
        ),
        LibraryWorkload(
            "hf_tokenize",
            hf_encode,
            texts,
            "HF tokenizers: in-memory BPE (vocab 3000) encode of a 400-1,800 char str "
            "sample -> 256 int64 ids (cut or padded)",
            requires=("tokenizers",),
            samples=True,
        ),
        LibraryWorkload(
            "numpy_rfft",
            numpy_rfft,
            signals,
            "numpy: |rfft| of 16384 float32 -> float32",
            requires=("numpy",),
        ),
        LibraryWorkload(
            "torch_stft",
            stft_magnitude,
            functools.partial(signals, length=16000),
            "torch: |stft| of 16000 samples (n_fft 400, hop 160, Hann) -> [201, 101] float32",
        ),
        LibraryWorkload(
            "text_re",
            text_features,
            texts,
            "Python re: counts of 8 patterns in a 400-1,800 char str sample -> int64",
            samples=True,
        ),
        LibraryWorkload(
            "json_parse",
            json_features,
            json_records,
            "Python json: parse a document of 40 records (a str sample, about 5 KB) and "
            "sum their features -> 6 float64",
            samples=True,
        ),
    ]
}


def available(
    names: Sequence[str] | None = None,
) -> tuple[dict[str, LibraryWorkload], dict[str, str]]:
    """The workloads of ``names`` (default: all) that can run here, and why the rest cannot.

    A workload is skipped when a module it requires does not import.
    """
    ok: dict[str, LibraryWorkload] = {}
    skipped: dict[str, str] = {}
    for name in names if names is not None else list(LIBRARY_WORKLOADS):
        w = LIBRARY_WORKLOADS[name]
        reason = missing(w.requires)
        if reason:
            skipped[name] = reason
        else:
            ok[name] = w
    return ok, skipped


@functools.cache
def _importable(module: str) -> str:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"{module} does not import ({type(exc).__name__}: {exc})"
    return ""


def missing(modules: Sequence[str]) -> str:
    """Why ``modules`` cannot all be imported here ('' if they can): one reason each."""
    return "; ".join(r for r in map(_importable, modules) if r)
