"""What ``explain()`` returns, from ``prep.explain`` and ``Pool.explain`` alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .auto import Calibration

NOTHING = "nothing yet"


class Explanation(str):
    """What ``auto`` measured, predicted and chose: the text ``print`` shows (an
    Explanation is that ``str``), and the calibrations it was written from, for code.

    ``calibrations`` holds auto's latest calibration of each signature, the latest
    last: one from ``prep.explain(fn, batch)``, those a pool has made from
    ``Pool.explain()`` (none where auto has not run: the text is then "nothing
    yet"). ``streams`` are the lines on the strategy of the pool's latest streams. The
    latest calibration's fields read through (``.choice``, ``.predicted``,
    ``.dropped``, ...); :class:`~prep.auto.Calibration` documents them.

    >>> import torch, prep
    >>> why = prep.explain(lambda r: r * 2, torch.ones(64, 3))
    >>> why.choice == why.calibrations[-1].choice and str(why).startswith(why.choice)
    True
    """

    calibrations: tuple[Calibration, ...]
    streams: tuple[str, ...]

    def __new__(
        cls, calibrations: Sequence[Calibration] = (), streams: Sequence[str] = ()
    ) -> Explanation:
        text = "\n\n".join(str(c) for c in calibrations)
        text = "\n".join([text, *streams]).strip() or NOTHING
        self = super().__new__(cls, text)
        self.calibrations, self.streams = tuple(calibrations), tuple(streams)
        return self

    def __getattr__(self, name: str) -> Any:
        # only names str lacks come here: the latest calibration's fields
        if name.startswith("_") or not self.calibrations:
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r}"
                + ("" if name.startswith("_") else " (auto has measured nothing yet)")
            )
        return getattr(self.calibrations[-1], name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Explanation, (self.calibrations, self.streams))


__all__ = ["NOTHING", "Explanation"]
