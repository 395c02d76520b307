"""The shape of the tree: no import cycle between prep's modules."""

from __future__ import annotations

import ast
from pathlib import Path

PREP = Path(__file__).resolve().parent.parent / "prep"


def _module(path: Path) -> str:
    parts = path.relative_to(PREP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """prep's modules that ``path`` imports at module level (a submodule's import of
    its own parent packages is how Python loads it, not a cycle)."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            found |= subs if len(subs) == len(node.names) else subs | {base}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found & modules if m != name and not name.startswith(m + ".")}


def test_no_import_cycle_in_prep():
    paths = {_module(p): p for p in PREP.rglob("*.py")}
    graph = {m: _imports(p, set(paths)) for m, p in paths.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*path[path.index(n) :], n])
            elif n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_import_contracts_hold():
    """import-linter sees imports inside functions and under TYPE_CHECKING too: the
    layers (cli -> collate/run/bench -> api/pool -> auto -> executors) and no cycle
    between sibling modules, with the breaks still to remove listed in .importlinter
    so that no new one comes in."""
    import subprocess
    import sys

    root = PREP.parent
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
