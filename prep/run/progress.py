"""What ``prep run`` tells the person watching it.

A tqdm bar (shards, rows, rows/s, ETA) when stderr is a terminal; one plain
line per shard otherwise (a log file or CI has no use for carriage returns);
nothing but errors with ``quiet``. The summary comes last either way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from .._progress import CountBar

__all__ = ["ShardProgress", "Summary"]


@dataclass
class Summary:
    """The outcome of a run, as counted by its driver."""

    shards: int = 0  # found
    done: int = 0
    skipped: int = 0  # already done, per the manifest
    failed: list[tuple[str, str]] = field(default_factory=list)  # (input, one-line error)
    #: input -> the whole formatted traceback of its failure (also in the manifest)
    tracebacks: dict[str, str] = field(default_factory=dict)
    #: the first failure's traceback, prep's frames left out, printed at the end ("" where
    #: every failure is prep's verdict on a file or a setting, which says it all)
    traceback: str = ""
    traceback_of: str = ""  # the input whose traceback that is
    row_failures: int = 0  # shards failed by a row the function raised on
    not_started: int = 0  # after a stop on error, or an interrupt
    abandoned: int = 0  # in flight when interrupted
    rows: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    interrupted: str | None = None  # "SIGINT" or "SIGTERM"
    manifest: str = ""
    on_row_error: str = "raise"  # what rows the function raised on did: see prep.run.rows
    rows_failed: int = 0  # under on_row_error fill/skip: filled or left out
    shards_with_failed_rows: int = 0
    #: how the shards ran, and why, in one sentence (locally; "" on a cluster)
    plan: str = ""
    #: why no shard started after some point: the disk under --out is full (one line)
    halted: str | None = None

    @property
    def exit_code(self) -> int:
        """0 when every shard is done (failed rows under fill/skip included: the run did
        what it was asked, and warns); 1 when some shard failed; 130/143 when interrupted."""
        if self.interrupted is not None:
            return 143 if self.interrupted == "SIGTERM" else 130
        return 1 if self.failed or self.halted else 0


class ShardProgress:
    """Reports a run on ``stream``: a bar if it is a terminal (or ``bar=True``), else lines."""

    def __init__(
        self, *, quiet: bool = False, stream: TextIO | None = None, bar: bool | None = None
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        if bar is None:
            bar = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar_wanted = bar and not quiet
        self._bar: Any = None
        self._total = 0
        self._count = 0

    def start(self, todo: int, skipped: int, stale: int, plan: str = "") -> None:
        self._total = todo
        if self.quiet:
            return
        if plan:
            self._line(plan)
        if skipped or stale:
            self._line(
                f"{skipped} shard(s) already done per the manifest, skipped; "
                f"{stale} stale temporary file(s) removed"
            )
        if self.bar_wanted:  # the stream's bar too: shards with their rows and rows/s
            self._bar = CountBar("shard", todo, "prep run", self.stream)

    def note(self, text: str) -> None:
        """A line the person may want to know (not under ``quiet``)."""
        if not self.quiet:
            self._line(f"note: {text}")

    def warn(self, text: str) -> None:
        """A line the person must know, even under ``quiet``."""
        self._line(f"warning: {text}")

    def done(self, entry: dict[str, Any]) -> None:
        self._count += 1
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.advance(int(entry["rows"]))
        else:
            self._line(
                f"[{self._count}/{self._total}] {entry['input']}: {entry['rows']:,} rows "
                f"in {entry['seconds']:.2f} s{_ran(entry)}{_failed_rows(entry)}"
            )

    def halt(self, line: str) -> None:
        """The run starts no other shard: ``line`` says why and the fix (even when quiet)."""
        if self._bar is not None:
            self._bar.write(f"prep run: {line}", file=self.stream)
        else:
            self._line(line)

    def failed(self, name: str, error: str) -> None:
        self._count += 1
        if self._bar is not None:
            self._bar.advance(0)
            self._bar.write(f"prep run: {name} FAILED: {error}", file=self.stream)
        elif not self.quiet:
            self._line(f"[{self._count}/{self._total}] {name} FAILED: {error}")

    def finish(self, s: Summary) -> None:
        """Close the bar and print the summary (failures and failed rows even when quiet)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if not self.quiet:
            mb = s.bytes_read / 1e6
            secs = max(s.seconds, 1e-9)
            self._line(
                f"{s.shards} shard(s): {s.done} done, {s.skipped} skipped, {len(s.failed)} "
                f"failed, {s.not_started + s.abandoned} not finished; {s.rows:,} rows "
                f"written; {mb:,.1f} MB read in {s.seconds:.2f} s ({mb / secs:,.1f} MB/s, "
                f"{s.rows / secs:,.0f} rows/s)"
            )
        if s.rows_failed:
            what = "filled" if s.on_row_error == "fill" else "left out"
            self._line(
                f"warning: {s.rows_failed:,} row(s) in {s.shards_with_failed_rows} shard(s) "
                f"failed and were {what} (--on-row-error {s.on_row_error}); each shard's "
                f"failed_rows and row_errors are in {s.manifest}"
            )
        if s.failed:
            self._failures(s)
        if s.interrupted is not None:
            self._line(
                f"interrupted by {s.interrupted}: {s.abandoned} shard(s) in flight abandoned "
                f"(temporary files removed); the {s.done} finished are recorded in "
                f"{s.manifest}; rerun with --resume to finish"
            )
        elif s.failed and s.not_started and s.halted is None:
            self._line(
                f"stopped after the first failure; {s.not_started} shard(s) not started. "
                f"Fix the failure and rerun with --resume, or pass --on-error skip to go on "
                f"past failed shards{_row_hint(s, '. ')}"
            )

    def _failures(self, s: Summary) -> None:
        """One traceback at most, and one line per failed shard (those printed as they
        failed are not repeated); the rest is in the manifest."""
        if s.traceback:
            self._line(f"{s.traceback_of} failed with (prep's own frames left out):")
            print(s.traceback.rstrip("\n"), file=self.stream)
        where = f"each one's error and traceback are in {s.manifest}"
        if self.quiet:  # not listed as they failed
            self._line(f"{len(s.failed)} shard(s) failed; {where}:")
            for name, error in s.failed:
                print(f"  {name}: {error}", file=self.stream)
        else:
            self._line(f"{len(s.failed)} shard(s) failed (listed above); {where}")
        if s.row_failures and not s.not_started and s.interrupted is None:
            self._line(f"rerun with --resume{_row_hint(s, '; ')}")

    def _line(self, text: str) -> None:
        print(f"prep run: {text}", file=self.stream, flush=True)


def _failed_rows(entry: dict[str, Any]) -> str:
    """``"; 2 rows failed, filled"`` for a shard with failed rows, else nothing."""
    failed = entry.get("failed_rows")
    if not failed:
        return ""
    what = "filled" if entry.get("on_row_error") == "fill" else "left out"
    return f"; {len(failed):,} row(s) failed, {what}"


def _ran(entry: dict[str, Any]) -> str:
    """``" (rows: processes, chosen by auto)"``: what ran the shard's rows, if recorded."""
    ran = entry.get("executor")
    if not ran:
        return ""
    asked = entry.get("executor_asked")
    return f" (rows: {ran}{', chosen by ' + asked if asked else ''})"


def _row_hint(s: Summary, before: str) -> str:
    """What saves the shards a row failed, if any did: ``--on-row-error``, not --on-error."""
    if not s.row_failures:
        return ""
    return (
        f"{before}--on-row-error skip (leave out the rows the function raises on) or fill "
        f"(--fill VALUE in their place) saves the {s.row_failures} shard(s) a row failed, "
        f"each one's manifest entry listing its failed rows"
    )
