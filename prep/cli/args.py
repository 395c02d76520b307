"""The command line's argument types: each turns one string into a value, or says
what a good one looks like (argparse prints it as the usage error, exit code 2)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["columns", "count", "key_value", "number", "parse_value", "positive", "shape"]


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is {what}")
    return value


def positive(text: str) -> int:
    return _integer(text, 1, "not a positive integer (>= 1)")


def count(text: str) -> int:
    return _integer(text, 0, "negative; pass an integer >= 0")


def parse_value(text: str) -> bool | int | float | str:
    """A ``--arg`` value: ``true``/``false`` (any case), an int, a float, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE with KEY a Python identifier; e.g. --arg max_len=16"
        )
    return key, parse_value(value)


def number(text: str) -> bool | int | float:
    """A ``--pad``/``--fill`` value: a number (``nan`` and ``inf`` too) or true/false."""
    value = parse_value(text)
    if isinstance(value, str):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. 0, -1, 0.5 or nan")
    return value


def shape(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a shape; give sizes >= 0 separated by commas, e.g. 128 or 3,64"
        )
    return sizes


def columns(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty column name; e.g. --columns x,mask"
        )
    return names
