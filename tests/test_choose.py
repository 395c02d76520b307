"""The one rule every measured choice takes (``prep._choose``), on figures the tests
give it, and a check that auto, the stream's strategy and ``prep run``'s plan use it
rather than a margin of their own."""

from __future__ import annotations

import ast
import pathlib

import pytest

from prep._choose import choose

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("costs", "incumbent", "margin", "expected"),
    [
        ({"a": 1.0, "b": 0.96}, "a", 1.05, "a"),  # 4% faster: noise
        ({"a": 1.0, "b": 0.90}, "a", 1.05, "b"),  # 11% faster: clearly
        ({"a": 1.0, "b": 1.0 / 1.05}, "a", 1.05, "a"),  # exactly the margin: kept
        ({"a": 1.0, "b": 0.5, "c": 0.4}, "a", 1.05, "c"),  # the cheapest challenger
        ({"a": 0.5, "b": 1.0}, "a", 1.05, "a"),
        ({"a": 0.9, "b": 1.0}, "gone", 1.5, "a"),  # no incumbent: the cheapest
        ({"a": 1.0}, "a", 2.0, "a"),
    ],
)
def test_a_challenger_must_beat_the_incumbent_by_the_margin(costs, incumbent, margin, expected):
    assert choose(costs, incumbent, margin).name == expected


def test_the_choice_says_what_it_weighed():
    moved = choose({"split": 1.0, "whole": 0.25}, "split", 1.05)
    assert str(moved) == "whole: 4.00x split (a challenger must be 1.05x faster)"
    kept = choose({"split": 1.0, "whole": 0.98}, "split", 1.05)
    assert str(kept).startswith("split: whole is 1.02x faster, under the 1.05x")


def test_no_arm_is_an_error():
    with pytest.raises(ValueError, match="at least one arm"):
        choose({}, "a")


def _margin_comparisons(path: pathlib.Path) -> list[str]:
    """Comparisons in ``path`` with a figure multiplied or divided by a margin (a name
    ending in MARGIN or HYSTERESIS, or ``margin``): a decider of its own."""

    def is_margin(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else ""
        return name == "margin" or name.endswith(("MARGIN", "HYSTERESIS"))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for sub in ast.walk(node):
                if isinstance(sub, ast.BinOp) and (is_margin(sub.left) or is_margin(sub.right)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_auto_streams_and_prep_run_decide_by_the_one_rule():
    deciders = ["prep/auto/_decisions.py", "prep/stream/strategy.py", "prep/run/plan.py"]
    for rel in deciders:
        text = (ROOT / rel).read_text()
        assert "choose(" in text, f"{rel} does not call the one decider"
    found = [hit for rel in deciders for hit in _margin_comparisons(ROOT / rel)]
    assert not found, f"margins compared outside prep._choose: {found}"
