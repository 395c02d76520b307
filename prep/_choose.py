"""The one rule every measured choice in prep takes: auto's executor, a stream's
strategy, ``prep run``'s plan.

    Each arm has a cost (seconds for the same work; a rate is its inverse). The
    incumbent (the choice so far, or the arm that costs the least to be wrong
    about) stays unless another arm costs less than the incumbent's cost divided
    by ``margin``: a challenger must be clearly faster, not faster by noise.

The margins differ by what a wrong switch costs (docs/auto.md, "One rule"); the rule
does not. It decides from numbers alone, so a test gives it numbers of its own:

>>> choice = choose({"split": 1.00, "whole": 0.97}, incumbent="split", margin=1.05)
>>> choice.name, choice.speedup
('split', 1.0)
>>> str(choose({"split": 1.00, "whole": 0.5}, incumbent="split", margin=1.05))
'whole: 2.00x split (a challenger must be 1.05x faster)'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Choice", "choose"]


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` chose, and from what."""

    name: str
    costs: Mapping[str, float]
    incumbent: str
    margin: float

    @property
    def best_other(self) -> str | None:
        """The cheapest arm that was not chosen (None for a single arm)."""
        others = [n for n in self.costs if n != self.name]
        return min(others, key=self.costs.__getitem__) if others else None

    @property
    def speedup(self) -> float:
        """How many times the incumbent's cost the choice's is (1.0: the incumbent kept)."""
        cost = self.costs[self.name]
        return self.costs[self.incumbent] / cost if cost > 0 else float("inf")

    def __str__(self) -> str:
        if self.name != self.incumbent:
            return (
                f"{self.name}: {self.speedup:.2f}x {self.incumbent} "
                f"(a challenger must be {self.margin:.2f}x faster)"
            )
        other = self.best_other
        if other is None:
            return f"{self.name}: the only arm"
        ratio = self.costs[self.name] / self.costs[other] if self.costs[other] > 0 else 1.0
        return (
            f"{self.name}: {other} is {ratio:.2f}x faster, under the {self.margin:.2f}x "
            f"a challenger needs"
        )


def choose(costs: Mapping[str, float], incumbent: str, margin: float = 1.0) -> Choice:
    """The arm of ``costs`` (name -> seconds) to take: the ``incumbent`` unless the
    cheapest other arm costs under the incumbent's divided by ``margin``. An
    incumbent not among the arms is no incumbent: the cheapest arm wins."""
    if not costs:
        raise ValueError("choose() needs at least one arm")
    best = min(costs, key=costs.__getitem__)
    if incumbent not in costs:
        return Choice(best, dict(costs), best, margin)
    keep = costs[incumbent] <= costs[best] * margin
    return Choice(incumbent if keep else best, dict(costs), incumbent, margin)
