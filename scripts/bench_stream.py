"""Streams of batches: prep's ``Pool.imap_samples`` against the tools a training loop uses.

Run it alone on the machine (figures are medians of interleaved repeats; every
ratio divides figures of the same run):

    python scripts/bench_stream.py                 # 2 workers (or --workers N)
    python scripts/bench_stream.py --quick         # a smoke test: small jobs, 2 repeats
    python scripts/bench_stream.py --jobs hash,tokens --repeat 7

The jobs need nothing downloaded (the ``bench`` extra: pillow, tokenizers):
  fixed    what a stream costs beyond its rows: ms a batch and us a row above serial,
           for serial, processes split and processes whole (trivial rows)
  jpeg     decode a JPEG (textured images made and encoded in memory with PIL),
           centre crop, resize to 224: uint8 [3, 224, 224]; batches of 64
  augment  the same JPEGs as a training loop's images: decode, a random-resized crop
           to 160 and a flip (drawn from each image's crc32, so every tool's rows can
           be checked), normalised: float32 [3, 160, 160]; batches of 64
  tokens   a WordPiece tokenizer trained in memory on generated text (2,048 of
           them; ~0.3-0.6 ms a text: made-up words split into many pieces); ids cut at
           128, padded to the batch's longest (prep: pad=0; others: pad_sequence);
           batches of 256
  hash     pure Python: NFKC, regex words, a hashed bag of words and bigrams
           (zlib.crc32, so every interpreter computes the same); batches of 256
  overlap  hash again, with a training step: the consumer sleeps per batch as long
           as the serial preprocessing of a batch takes over N workers, so the best
           total is max(work / N, steps) = the steps, and no overlap makes it 2x

Every tool is warm (its pool, loader or workers built once, a pass untimed) and
its output is checked equal to the plain loop's before timing. "prep Loader" is
``prep.Loader`` with its defaults (the items as its dataset, its workers sent
indices); "caller CPU" is this process's CPU time a batch (the loop's process:
its threads included, worker processes not). Items/s are
medians; "limit" is the N-core limit (the plain loop's rate x N); a missing peer
(spdl-core, torchdata) is reported as skipped.
"""

from __future__ import annotations

import argparse
import array
import io
import os
import platform
import random
import re
import statistics
import sys
import threading
import time
import unicodedata
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

import prep
from prep.bench import Timing, interleaved, table
from prep.executors import available_cores

MAX_LEN = 128
DIM = 1024
WORD = re.compile(r"\w+")

# ------------------------------------------------------------------ the row functions


def decode(jpeg: bytes) -> torch.Tensor:
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    w, h = img.size
    side = min(w, h)
    img = img.crop(((w - side) // 2, (h - side) // 2, (w + side) // 2, (h + side) // 2))
    img = img.resize((224, 224), Image.BILINEAR)
    return (
        torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        .view(224, 224, 3)
        .permute(2, 0, 1)
    )


MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def augment(jpeg: bytes) -> torch.Tensor:
    """The image pipeline of a training loop: decode, a random-resized crop to 160, a
    flip, normalise to float32. "Random" from the image's own bytes (crc32), so that
    every tool makes the same rows and they can be checked."""
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    w, h = img.size
    r = zlib.crc32(jpeg)
    scale = 0.35 + 0.65 * ((r & 0xFF) / 255)  # the crop's share of the area
    side = max(16, int(min(w, h) * scale**0.5))
    x0 = (r >> 8) % (w - side + 1)
    y0 = (r >> 16) % (h - side + 1)
    img = img.crop((x0, y0, x0 + side, y0 + side)).resize((160, 160), Image.BILINEAR)
    if r >> 31:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(160, 160, 3)
    return (pixels.permute(2, 0, 1).float() / 255 - MEAN) / STD


TOKENIZER_JSON = ""  # set in main(); travels with the functions that use it
_local = threading.local()


def make_tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(TOKENIZER_JSON)


def encode(tok: Any, text: str) -> torch.Tensor:
    return torch.frombuffer(array.array("q", tok.encode(text).ids[:MAX_LEN]), dtype=torch.int64)


def tokens_with_state(text: str, *, state: Any) -> torch.Tensor:
    """prep's row function: the tokenizer is the worker's state (setup=)."""
    return encode(state, text)


def tokens_local(text: str) -> torch.Tensor:
    """The peers' row function: a tokenizer per thread (one is not safe to share)."""
    tok = getattr(_local, "tok", None)
    if tok is None:
        tok = _local.tok = make_tokenizer()
    return encode(tok, text)


def featurize(text: str) -> torch.Tensor:
    words = WORD.findall(unicodedata.normalize("NFKC", text).lower())
    counts = array.array("f", bytes(4 * DIM))
    for w in words:
        counts[zlib.crc32(w.encode()) % DIM] += 1.0
    for a, b in zip(words, words[1:]):
        counts[zlib.crc32(f"{a} {b}".encode()) % DIM] += 0.5
    return torch.frombuffer(counts, dtype=torch.float32)


# ------------------------------------------------------------------ the data


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """Textured photographs' stand-ins: sums of oriented waves and soft blobs (JPEG
    spends its time on texture; noise would be the worst case, flat colour the best)."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    out = []
    h, w = 256, 320
    y = torch.arange(h, dtype=torch.float32)[:, None]
    x = torch.arange(w, dtype=torch.float32)[None, :]
    for _ in range(n):
        p = torch.rand(12, generator=g)
        planes = []
        for c in range(3):
            fx, fy, ph = 0.02 + 0.2 * p[c], 0.02 + 0.2 * p[c + 3], 6.3 * p[c + 6]
            wave = torch.sin(x * fx + y * fy + ph) + 0.5 * torch.sin(x * fy * 0.7 - y * fx * 1.3)
            blob = torch.exp(-((x - w * p[9]) ** 2 + (y - h * p[10]) ** 2) / (2e3 + 2e4 * p[11]))
            planes.append(128 + 60 * wave + 60 * blob)
        rgb = torch.stack(planes, -1).clamp(0, 255).to(torch.uint8).contiguous()
        img = Image.frombytes("RGB", (w, h), bytes(rgb.flatten().tolist()))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def make_texts(n: int, seed: int = 0, words: int = 90) -> list[str]:
    """Paragraphs of made-up words, Zipf-distributed, with what NFKC changes (ligatures,
    full-width letters) and punctuation."""
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzéüñ"
    vocab = ["".join(rnd.choice(letters) for _ in range(rnd.randint(2, 10))) for _ in range(3000)]
    vocab += ["ﬁne", "ﬂow", "ｗｉｄｅ", "Ⅻ"]
    weights = [1 / (k + 1) for k in range(len(vocab))]
    texts = []
    for _ in range(n):
        picked = rnd.choices(vocab, weights, k=rnd.randint(words // 2, words * 3 // 2))
        texts.append(" ".join(w + rnd.choice(["", "", "", ",", "."]) for w in picked))
    return texts


def train_tokenizer(texts: Sequence[str]) -> str:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=8000, special_tokens=["[UNK]", "[PAD]"])
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


# ------------------------------------------------------------------ the jobs


@dataclass
class Job:
    name: str
    items: list[Any]
    batch: int
    fn: Callable[[Any], torch.Tensor]  # the peers' row function
    prep_fn: Callable[..., torch.Tensor]  # prep's (with state= where it needs one)
    collate: Callable[[list[torch.Tensor]], torch.Tensor]
    options: dict[str, Any]  # prep's options that make its batches equal collate's
    setup: Callable[[], Any] | None = None
    step: float = 0.0  # seconds the consumer sleeps per batch (a training step)

    def batches(self) -> list[list[Any]]:
        return [self.items[i : i + self.batch] for i in range(0, len(self.items), self.batch)]


def stack(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(rows)


def pad_ids(rows: list[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(rows, batch_first=True, padding_value=0)


class ItemDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[Any], fn: Callable[[Any], torch.Tensor]) -> None:
        self.items, self.fn = items, fn

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.fn(self.items[i])


# ------------------------------------------------------------------ the contestants


def consume(batches: Iterator[torch.Tensor], step: float, sink: list[torch.Tensor] | None) -> None:
    for b in batches:
        if step:
            time.sleep(step)
        if sink is not None:
            sink.append(b)


def contestants(job: Job, workers: int, closers: list[Callable[[], None]]) -> dict[str, Any]:
    """name -> run(sink): one pass over the job's items, its batches appended to sink."""
    batches = job.batches()
    runs: dict[str, Any] = {}

    def loop(sink: Any) -> None:
        consume((job.collate([job.fn(x) for x in b]) for b in batches), job.step, sink)

    runs["plain loop"] = loop
    for executor, strategy in [
        ("auto", "auto"),
        ("processes", "whole"),
        ("processes", "split"),
        ("threads", "whole"),
        ("threads", "split"),
    ]:
        pool = prep.Pool(executor, workers=workers, setup=job.setup)
        closers.append(pool.close)

        def run(sink: Any, pool: prep.Pool = pool, strategy: str = strategy) -> None:
            stream = pool.imap_samples(job.prep_fn, batches, strategy=strategy, **job.options)
            consume(stream, job.step, sink)

        label = "prep auto" if executor == "auto" else f"prep {executor} {strategy}"
        runs[label] = run
        runs[label].pool = pool  # type: ignore[attr-defined]  # for its explain()

    # prep's Loader: the items are its map-style dataset, its workers sent indices; its
    # defaults (auto), on a shared pool that prep.shutdown() closes
    ours = prep.Loader(job.items, job.prep_fn, batch_size=job.batch, workers=workers,
                       setup=job.setup, **job.options)  # fmt: skip
    closers.append(prep.shutdown)
    runs["prep Loader"] = lambda sink: consume(iter(ours), job.step, sink)

    loader = torch.utils.data.DataLoader(
        ItemDataset(job.items, job.fn), batch_size=job.batch, num_workers=workers,
        persistent_workers=True, collate_fn=job.collate,
    )  # fmt: skip
    closers.append(lambda: loader._iterator._shutdown_workers() if loader._iterator else None)
    runs[f"DataLoader({workers} workers)"] = lambda sink: consume(iter(loader), job.step, sink)

    tpe = ThreadPoolExecutor(workers)
    closers.append(tpe.shutdown)

    def threadpool(sink: Any) -> None:
        consume((job.collate(list(tpe.map(job.fn, b))) for b in batches), job.step, sink)

    runs["ThreadPoolExecutor.map"] = threadpool
    runs.update(_spdl(job, workers))
    runs.update(_torchdata(job, workers))
    if job.name.startswith("tokens"):
        tok = make_tokenizer()

        def batched(sink: Any) -> None:
            def one(b: list[str]) -> torch.Tensor:
                ids = [torch.tensor(e.ids[:MAX_LEN]) for e in tok.encode_batch(b)]
                return pad_ids(ids)

            consume((one(b) for b in batches), job.step, sink)

        runs["tokenizers encode_batch"] = batched
    return runs


SKIPPED: dict[str, str] = {}


def _spdl(job: Job, workers: int) -> dict[str, Any]:
    try:
        from spdl.pipeline import PipelineBuilder
    except ImportError as exc:
        SKIPPED["SPDL"] = f"spdl-core is not installed ({exc}); pip install 'prep[peers]'"
        return {}

    def run(sink: Any) -> None:
        p = (
            PipelineBuilder()
            .add_source(job.items)
            .pipe(job.fn, concurrency=workers, output_order="input")
            .aggregate(job.batch)
            .pipe(job.collate)
            .add_sink(3)
            .build(num_threads=workers)
        )
        with p.auto_stop():
            consume(iter(p), job.step, sink)

    return {f"SPDL (concurrency {workers})": run}


def _torchdata(job: Job, workers: int) -> dict[str, Any]:
    try:
        from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper
    except ImportError as exc:
        SKIPPED["torchdata"] = f"torchdata is not installed ({exc})"
        return {}

    def run(sink: Any) -> None:
        node = ParallelMapper(IterableWrapper(job.items), job.fn, num_workers=workers)
        node = Mapper(Batcher(node, job.batch, drop_last=False), job.collate)
        consume(iter(Loader(node)), job.step, sink)

    return {f"torchdata ParallelMapper({workers} threads)": run}


# ------------------------------------------------------------------ the race


def check(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    if len(got) != len(want):
        return f"{name}: {len(got)} batches, the loop made {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            return (
                f"{name}: batch {k} differs from the loop's ({tuple(g.shape)} vs {tuple(w.shape)})"
            )
    return None


#: CPU seconds of this process (the training loop's: its threads, prep's producer and
#: threads included; worker processes not) per pass of each tool, the last job's
CPU: dict[str, list[float]] = {}


def on_cpu(name: str, run: Callable[[Any], None]) -> Callable[[], None]:
    """``run(None)``, its CPU time in this process kept in :data:`CPU`."""

    def go() -> None:
        t = time.process_time()
        run(None)
        CPU.setdefault(name, []).append(time.process_time() - t)

    return go


def race(
    job: Job, workers: int, repeat: int
) -> tuple[dict[str, Timing], list[str], dict[str, str]]:
    closers: list[Callable[[], None]] = []
    CPU.clear()
    try:
        runs = contestants(job, workers, closers)
        want: list[torch.Tensor] = []
        runs["plain loop"](want)
        wrong = []
        for name, run in list(runs.items()):
            got: list[torch.Tensor] = []
            try:
                run(got)  # the warm-up pass, checked
            except Exception as exc:  # a peer that cannot run this job: reported, not raced
                wrong.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
                del runs[name]
                continue
            if (why := check(name, got, want)) is not None:
                wrong.append(why)
                del runs[name]
        timings = interleaved({n: on_cpu(n, r) for n, r in runs.items()}, repeat, 1)
        explains = {
            n: r.pool.explain() for n, r in runs.items() if hasattr(r, "pool") and n == "prep auto"
        }
        return timings, wrong, explains
    finally:
        for close in closers:
            close()


def report(job: Job, workers: int, timings: dict[str, Timing], wrong: list[str]) -> list[str]:
    n = len(job.items)
    serial = n / timings["plain loop"].median
    limit = serial * workers
    per_row = 1e6 / serial
    if job.step:
        work = timings["plain loop"].median - job.step * len(job.batches())
        best = max(work / workers, job.step * len(job.batches()))
        bound, bound_text = n / best, "max(work/N, steps)"
    else:
        bound, bound_text = limit, "N-core limit"
    rows = []
    for name, t in sorted(timings.items(), key=lambda kv: kv[1].median):
        rate = n / t.median
        cpu = statistics.median(CPU[name]) / len(job.batches()) * 1e3 if CPU.get(name) else None
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                f"{rate / bound:.2f}",
                f"±{t.spread * 50:.0f}%",
                f"{t.median:.3f}",
                "-" if cpu is None else f"{cpu:.2f}",
            ]
        )
    lines = [
        f"### {job.name}: {n} items, batches of {job.batch}, {workers} workers",
        f"plain loop {serial:,.0f} items/s ({per_row:,.0f} us an item"
        + (f", the step {job.step * 1e3:.1f} ms a batch" if job.step else "")
        + f"); the bound: {bound_text} = {bound:,.0f} items/s",
        "",
        table(rows, ["tool", "items/s", "x bound", "spread", "s/pass", "caller CPU ms/batch"]),
    ]
    lines += [f"- not raced (wrong or failed): {w}" for w in wrong]
    lines += misses(job, timings, bound, per_row)
    return lines


def misses(job: Job, timings: dict[str, Timing], bound: float, per_row: float) -> list[str]:
    n = len(job.items)
    auto = timings.get("prep auto")
    if auto is None:
        return ["- MISS: prep auto did not run"]
    rate = n / auto.median
    peers = {k: n / t.median for k, t in timings.items() if not k.startswith(("prep", "plain"))}
    out = []
    if peers:
        best, best_rate = max(peers.items(), key=lambda kv: kv[1])
        mark = "ok" if rate >= best_rate else "MISS"
        out.append(f"- {mark}: prep auto {rate:,.0f} vs the best peer, {best}, {best_rate:,.0f} "
                   f"({rate / best_rate:.2f}x)")  # fmt: skip
    if job.step or per_row >= 50:
        mark = "ok" if rate * 1.1 >= bound else "MISS"
        out.append(f"- {mark}: prep auto at {bound / rate:.2f}x the bound (target: within 1.1x)")
    ours, theirs = (
        timings.get("prep Loader"),
        next((t for k, t in timings.items() if k.startswith("DataLoader")), None),
    )
    if ours is not None and theirs is not None:
        ratio = theirs.median / ours.median  # > 1: the Loader is faster
        goal = 1.0 if job.step else 0.95  # faster beside a step; within 5% alone
        mark = "ok" if ratio >= goal else "MISS"
        out.append(f"- {mark}: prep Loader {ratio:.2f}x the DataLoader's rate "
                   f"(target: >= {goal:.2f}x)")  # fmt: skip
    return out


def machine(workers: int) -> list[str]:
    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}",
                f"prep {getattr(prep, '__version__', '?')}"]  # fmt: skip
    for mod, name in [("PIL", "pillow"), ("tokenizers", "tokenizers"),
                      ("spdl.pipeline", "spdl-core"), ("torchdata", "torchdata")]:  # fmt: skip
        try:
            from importlib.metadata import version

            __import__(mod)
            versions.append(f"{name} {version(name)}")
        except Exception:
            versions.append(f"{name} missing")
    cores = available_cores()
    return [
        f"machine: {platform.machine()} {platform.processor() or ''}, {cores} cores usable, "
        f"{workers} workers",
        "versions: " + ", ".join(versions),
    ]


def jobs(quick: bool, workers: int, which: set[str]) -> Iterator[Job]:
    global TOKENIZER_JSON
    scale = 4 if quick else 1
    if "jpeg" in which or "augment" in which:
        items = make_jpegs(1024 // scale)
        if "jpeg" in which:
            yield Job("jpeg", items, 64, decode, decode, stack, {})
        if "augment" in which:
            yield Job("augment (decode, random-resized crop, flip, normalise)", items, 64,
                      augment, augment, stack, {})  # fmt: skip
    texts = make_texts(4096 // scale)
    if "tokens" in which:
        TOKENIZER_JSON = train_tokenizer(texts[:2000])
        half = texts[: len(texts) // 2]
        yield Job(
            "tokens", half, 256, tokens_local, tokens_with_state, pad_ids, {"pad": 0},
            setup=make_tokenizer,
        )  # fmt: skip
    if "hash" in which:
        yield Job("hash", texts, 256, featurize, featurize, stack, {})
    if "overlap" in which:
        half = texts[: len(texts) // 2]
        t = time.perf_counter()
        for x in half[:512]:
            featurize(x)
        per_batch = (time.perf_counter() - t) / 512 * 256
        yield Job("overlap (hash + a training step)", half, 256, featurize, featurize, stack, {},
                  step=per_batch / workers)  # fmt: skip


# ------------------------------------------------------------------ fixed costs


def identity(row: torch.Tensor) -> torch.Tensor:
    return row


def first_n(row: torch.Tensor) -> torch.Tensor:
    """A ragged row of token ids: its first ``row[0]`` values (16-512)."""
    return row[1 : 1 + int(row[0])]


def fixed_costs(workers: int, repeat: int) -> list[str]:
    """What a stream pays beyond its rows, per batch and per row (issue 20's targets:
    processes <= 0.3 ms a batch, <= 5 us a row above serial, <= 10 us a row with pad=),
    for serial, processes split and processes whole: streams of trivial rows."""
    g = torch.Generator().manual_seed(0)
    tiny = [torch.zeros(16, 4) for _ in range(200)]
    wide = [torch.zeros(4096, 4) for _ in range(12)]
    ragged = []
    for _ in range(12):
        ids = torch.randint(1, 30_000, (256, 513), generator=g)
        ids[:, 0] = torch.randint(16, 513, (256,), generator=g)
        ragged.append(ids)
    cases = {"tiny": (identity, tiny, {}), "wide": (identity, wide, {}),
             "ragged": (first_n, ragged, {"pad": 0})}  # fmt: skip
    ways = {"serial": ("serial", "split"), "processes split": ("processes", "split"),
            "processes whole": ("processes", "whole")}  # fmt: skip
    pools = {name: prep.Pool(ex, workers=workers) for name, (ex, _) in ways.items()}
    try:
        runs = {
            f"{case} {name}": (
                lambda p=pools[name], f=fn, b=batches, o=opts, s=ways[name][1]: list(
                    p.imap(f, b, strategy=s, **o)
                )
            )
            for case, (fn, batches, opts) in cases.items()
            for name in ways
        }
        t = interleaved(runs, repeat, 1)
    finally:
        for p in pools.values():
            p.close()
    rows = []
    for case, (_, batches, _) in cases.items():
        n, per = len(batches), len(batches[0])
        base = t[f"{case} serial"].median / n
        for name in ways:
            batch = t[f"{case} {name}"].median / n
            # the stream's cost beyond serial's, on all workers together (the CPU it costs)
            over = (batch * (1 if name == "serial" else workers) - base) / per * 1e6
            rows.append(
                [case, name, f"{batch * 1e3:.3f}", f"{over:+.2f}" if name != "serial" else "-"]
            )
    return [
        f"### fixed costs: trivial rows, {workers} workers (ms a batch; us a row above serial, "
        f"times the workers: the CPU the stream adds)",
        "tiny: 16 rows of 4 floats; wide: 4,096 rows of 4 floats; ragged: 256 rows of 16-512 "
        "token ids, pad=0",
        "",
        table(rows, ["batches", "way", "ms a batch", "us a row above serial (x workers)"]),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small jobs, 2 repeats")
    parser.add_argument("--jobs", default="fixed,jpeg,augment,tokens,hash,overlap")
    args = parser.parse_args(argv)
    # every tool is timed warm here, as a first run: auto starts from nothing remembered
    os.environ["PREP_WISDOM"] = "off"
    repeat = 2 if args.quick else args.repeat
    torch.set_num_threads(1)  # as the DataLoader's workers do; the loop is single-threaded
    out = ["# bench_stream: Pool.imap_samples against the tools a training loop uses", ""]
    out += machine(args.workers)
    out += [f"figures: medians of {repeat} interleaved passes, each tool warm; 'x bound' "
            f"divides by the bound named under each job (>= 0.91 is within 1.1x)", ""]  # fmt: skip
    print("\n".join(out), flush=True)
    if "fixed" in args.jobs.split(","):
        print("\n".join(fixed_costs(args.workers, repeat)), flush=True)
    for job in jobs(args.quick, args.workers, set(args.jobs.split(","))):
        timings, wrong, explains = race(job, args.workers, repeat)
        lines = report(job, args.workers, timings, wrong)
        said = [line for e in explains.values() for line in e.splitlines()]
        said = [line for line in said if "stream" in line or "choice" in line]
        lines += ["", "prep auto's explain():", *("    " + line for line in said), ""]
        print("\n".join(lines), flush=True)
    for peer, why in SKIPPED.items():
        print(f"skipped: {peer}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
