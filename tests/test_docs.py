"""The examples in README.md and docs/*.md run, each in a fresh interpreter.

Every ```python block runs with ``python -``; every ```bash block whose commands
are all ``prep ...`` runs with ``bash``, the venv's ``prep`` on the PATH. Each
runs in its own empty folder (so files it writes go nowhere else), bounded by
a timeout. The convention, visible in the rendered page, is the block's first line:

* ``# not run: <why>`` shows the block without running it (it needs a cluster,
  or a module that is yours, not prep's);
* ``# needs: <module or cuda>[, ...]`` skips it, with the reason, where that is
  missing (an optional extra, a GPU).

Other blocks (``text``, shell blocks that call other programs) are not code to run.
The design page may only name files that exist under ``prep/``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
TIMEOUT = {"python": 240, "bash": 300}
EXTRAS = {  # module -> the extra that installs it, for the skip reason
    "dask": "dask",
    "distributed": "dask",
    "matplotlib": "bench",
    "PIL": "bench",
    "tokenizers": "bench",
    "mpire": "peers",
    "torchdata": "peers",
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def first(self) -> str:
        return self.code.lstrip().splitlines()[0] if self.code.strip() else ""


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        lang, code = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(page, line, lang, code))
    return found


def runnable(block: Block) -> bool:
    if block.lang == "python":
        return True
    if block.lang != "bash":
        return False
    commands = [
        ln.strip() for ln in block.code.splitlines() if ln.strip() and not ln.startswith("#")
    ]
    return bool(commands) and all(c.startswith("prep ") for c in commands)


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL if runnable(b) or b.first.startswith("# not run:")]


def missing(needs: str) -> str | None:
    """Why a ``# needs: a, b`` block cannot run here, or None."""
    for name in (n.strip() for n in needs.split(",")):
        if name == "cuda":
            if not torch.cuda.is_available():
                return "needs a CUDA GPU, and torch sees none here"
        elif importlib.util.find_spec(name) is None:
            extra = EXTRAS.get(name)
            how = f' (the "{extra}" extra: pip install -e ".[{extra}]")' if extra else ""
            return f"needs {name}, which is not installed{how}"
    return None


def test_there_are_examples_to_run() -> None:
    pages = {b.page.name for b in ALL if runnable(b) and b.lang == "python"}
    assert "README.md" in pages
    assert {"api.md", "auto.md", "streams.md", "errors.md"} <= pages


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
@pytest.mark.timeout(TIMEOUT["bash"] + 30)
def test_example_runs(block: Block, tmp_path: Path) -> None:
    first = block.first
    if first.startswith("# not run:"):
        pytest.skip(f"marked {first!r}")
    if first.startswith("# needs:"):
        reason = missing(first.removeprefix("# needs:"))
        if reason:
            pytest.skip(reason)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [sys.executable, "-"] if block.lang == "python" else ["bash", "-euo", "pipefail"]
    try:
        proc = subprocess.run(
            command,
            input=block.code,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT[block.lang],
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} did not finish within {TIMEOUT[block.lang]} s")
    assert proc.returncode == 0, (
        f"{block.id} exited {proc.returncode}\n--- code\n{block.code}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


def test_design_names_only_files_that_exist() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`(prep/[\w/.]+)`", text))
    assert named, "design.md names no files"
    gone = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not gone, f"docs/design.md names files that are not in the tree: {gone}"


def test_links_between_pages_resolve() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.(?:md|png))(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
