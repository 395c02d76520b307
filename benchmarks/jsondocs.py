"""JSON documents as samples, for the ``json_parse`` workload of
:mod:`benchmarks.libraries`: Python's ``json`` parsing a str a row, GIL-bound."""

from __future__ import annotations

import json
import random

import torch


def _words(n: int, rng: random.Random) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    return ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(n)]


def json_records(rows: int, seed: int = 0, records: int = 40) -> list[str]:
    """JSON documents of ``records`` records each (a log line or an API answer per
    sample), with numbers, strings and nested lists."""
    rng = random.Random(seed)
    words = _words(400, rng)
    docs = []
    for _ in range(rows):
        items = [
            {
                "id": rng.randrange(10**6),
                "score": round(rng.uniform(-5, 5), 4),
                "tags": rng.sample(words, rng.randint(1, 5)),
                "text": " ".join(rng.choices(words, k=rng.randint(3, 12))),
                "point": [rng.random(), rng.random()],
            }
            for _ in range(records)
        ]
        docs.append(json.dumps({"version": 1, "items": items}))
    return docs


def json_features(doc: str) -> torch.Tensor:
    """Parse a JSON document and sum its records' features: 6 float64."""
    items = json.loads(doc)["items"]
    return torch.tensor(
        [
            len(items),
            sum(it["score"] for it in items),
            sum(len(it["tags"]) for it in items),
            sum(len(it["text"]) for it in items),
            sum(it["point"][0] for it in items),
            sum(it["point"][1] for it in items),
        ],
        dtype=torch.float64,
    )


__all__ = ["json_features", "json_records"]
