"""The shape of the tree: prep's imports run one way, and no module reaches back.

Both checks read the import graph that import-linter builds (grimp): every import,
inside functions and under ``TYPE_CHECKING`` too, since a cycle the type checker
needs is a cycle of ideas all the same.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm,
    written as a loop: the graph is deep enough to be wary of recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e", "d"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_prep() -> None:
    """No cycle anywhere: between siblings (import-linter's contract checks those) and
    across depths (``prep.run.task -> prep`` with ``prep -> prep.run`` is one)."""
    import grimp

    built = grimp.build_graph(
        "prep", include_external_packages=False, exclude_type_checking_imports=False
    )
    graph = {m: set(built.find_modules_directly_imported_by(m)) for m in built.modules}
    assert len(graph) > 50 and "prep.cli" in graph["prep.__main__"]  # the graph is prep's
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_import_contracts_hold() -> None:
    """The layers (cli -> collate/run/bench -> api -> pool -> registry -> auto -> executors)
    and no cycle between sibling modules, with the breaks still to remove listed in
    .importlinter so that no new one comes in."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
