"""What a benchmarks run times: the variants, by name, and the grid of settings to time them in.

A *variant* is a way to run a workload: an executor of the registry, ``auto``
(warm), ``auto_first`` (its first call, calibration included), or one of two
baselines people write without prep (:mod:`benchmarks.baselines`): ``loop`` (a
Python loop and ``torch.stack``) and ``plain_joblib`` (``joblib.Parallel`` over
row views). With ``peers``, the tools people use instead of prep
(:mod:`benchmarks.peers`) are variants too, each warm and on its first call.
:class:`Grid` names the workloads, variants, peers, rows per batch and workers
to time, and how often.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prep.bench.race import is_count
from prep.errors import ConfigError
from prep.executors import available_cores
from prep.registry import EXECUTORS as REGISTRY

from .libraries import LIBRARY_WORKLOADS
from .peers import PEERS, first_call
from .workloads import WORKLOADS, Workload

__all__ = [
    "AUTO",
    "AUTO_FIRST",
    "DEFAULT_WORKLOADS",
    "FIRST_CALLS",
    "LABELS",
    "LOOP",
    "PEER_WORKLOADS",
    "PLAIN_JOBLIB",
    "POOLS",
    "QUICK_PEER_WORKLOADS",
    "QUICK_WORKLOADS",
    "Grid",
    "default_workers",
    "is_count",
    "is_peer",
    "label",
    "uses_workers",
    "variants",
]

AUTO, AUTO_FIRST, LOOP, PLAIN_JOBLIB = "auto", "auto_first", "loop", "plain_joblib"
#: executors that start threads or processes, whose start-up is measured apart
POOLS = ("threads", "processes", "joblib")
#: first-call variants -> the warm variant they start: they are timed once, alone
FIRST_CALLS = {AUTO_FIRST: AUTO, **{first_call(name): name for name in PEERS}}
LABELS = {
    AUTO_FIRST: "auto (first call, calibration included)",
    LOOP: "loop + torch.stack",
    PLAIN_JOBLIB: "plain joblib.Parallel",
    **{p.name: p.label for p in PEERS.values()},
    **{first_call(p.name): f"{p.label} (first call)" for p in PEERS.values()},
}

DEFAULT_WORKLOADS = (
    "noop",
    "tokenize",
    "python",
    "matmul",
    "sleep",
    "side_context_small",
    "side_context",
)
QUICK_WORKLOADS = ("python", "tokenize", "side_context_small", "sleep")
#: with peers: prep's workloads and the real libraries' (those whose library is missing skip)
PEER_WORKLOADS = (*DEFAULT_WORKLOADS, *LIBRARY_WORKLOADS)
QUICK_PEER_WORKLOADS = (*QUICK_WORKLOADS, "text_re")


def variants() -> tuple[str, ...]:
    """Every name ``executors=`` accepts: the registry, ``auto`` and the two baselines."""
    return (*(n for n in REGISTRY if n != AUTO), AUTO, LOOP, PLAIN_JOBLIB)


def default_workers() -> tuple[int, ...]:
    """1 (every executor's fixed cost, alone) and one worker per core."""
    return tuple(sorted({1, available_cores()}))


def label(name: str) -> str:
    """How a variant is named in tables and pictures."""
    return LABELS.get(name, name)


def uses_workers(name: str) -> bool:
    """Whether the variant's time depends on the workers setting (serial's does not)."""
    return name in (*POOLS, PLAIN_JOBLIB, AUTO, AUTO_FIRST) or is_peer(name)


def is_peer(name: str) -> bool:
    """Whether the variant is a peer tool, warm or on its first call."""
    return name in PEERS or FIRST_CALLS.get(name) in PEERS


@dataclass(frozen=True)
class Grid:
    """Which workloads, variants, peers, rows per batch and workers to time, and how often.

    ``workloads`` are names of :data:`benchmarks.workloads.WORKLOADS` or of
    :data:`benchmarks.libraries.LIBRARY_WORKLOADS`, or
    :class:`~benchmarks.workloads.Workload` objects; ``peers`` names of
    :data:`benchmarks.peers.PEERS` (none by default); ``timeout`` bounds each call
    of a prep executor (seconds; None, the default, as in ``map_rows``), not a peer's.
    """

    workloads: tuple[str | Workload, ...] = DEFAULT_WORKLOADS
    executors: tuple[str, ...] = field(default_factory=variants)
    rows: tuple[int, ...] = (16, 64, 256)
    workers: tuple[int, ...] = field(default_factory=default_workers)
    repeat: int = 5
    # None, as users call map_rows: a timeout changes how some executors run (joblib warms
    # its workers first), so it would time something users do not get
    timeout: float | None = None
    peers: tuple[str, ...] = ()

    @classmethod
    def quick(cls, **changes: Any) -> Grid:
        """A grid that finishes in well under a minute on 2 cores: a smoke test."""
        settings: dict[str, Any] = {
            "workloads": QUICK_WORKLOADS,
            "rows": (8, 64),
            "workers": (min(2, available_cores()),),
            "repeat": 2,
        }
        return cls(**{**settings, **changes})

    def __post_init__(self) -> None:
        for name in ("workloads", "executors", "rows", "workers"):
            value = getattr(self, name)
            if isinstance(value, (str, Workload)) or not isinstance(value, Sequence):
                raise ConfigError(f"Grid({name}={value!r}) needs a list or tuple")
            if not value:
                raise ConfigError(f"Grid({name}=()) is empty; give at least one")
            object.__setattr__(self, name, tuple(value))
        known = variants()
        bad = [e for e in self.executors if e not in known]
        if bad:
            raise ConfigError(
                f"executors {', '.join(map(repr, bad))} unknown; choose from {', '.join(known)}"
            )
        bad = [w for w in self.workloads if not isinstance(w, Workload) and w not in _NAMED]
        if bad:
            raise ConfigError(
                f"workloads {', '.join(map(repr, bad))} unknown; choose from "
                f"{', '.join(_NAMED)}, or give your own with --fn and --batch"
            )
        self._check_peers()
        for name in ("rows", "workers"):
            bad = [n for n in getattr(self, name) if not is_count(n)]
            if bad:
                raise ConfigError(f"{name} {bad} are not positive integers; e.g. {name}=(16, 64)")
        if not is_count(self.repeat):
            raise ConfigError(f"repeat={self.repeat!r} is not a positive integer; e.g. repeat=5")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"timeout={self.timeout!r} must be > 0 seconds, or None")

    def _check_peers(self) -> None:
        if isinstance(self.peers, str) or not isinstance(self.peers, Sequence):
            raise ConfigError(f"Grid(peers={self.peers!r}) needs a list or tuple of names")
        object.__setattr__(self, "peers", tuple(dict.fromkeys(self.peers)))
        bad = [p for p in self.peers if p not in PEERS]
        if bad:
            raise ConfigError(
                f"peers {', '.join(map(repr, bad))} unknown; choose from {', '.join(PEERS)}"
            )

    def resolved(self) -> list[Workload]:
        """The workloads as objects, in order."""
        return [w if isinstance(w, Workload) else _NAMED[w] for w in self.workloads]

    def to_dict(self) -> dict[str, Any]:
        return {
            "workloads": [w.name for w in self.resolved()],
            "executors": list(self.executors),
            "rows": list(self.rows),
            "workers": list(self.workers),
            "repeat": self.repeat,
            "timeout_s": self.timeout,
            "peers": list(self.peers),
        }


_NAMED: dict[str, Workload] = {**WORKLOADS, **LIBRARY_WORKLOADS}
