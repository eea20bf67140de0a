"""The package layout: no import cycle anywhere in kbpg (function-local and TYPE_CHECKING
imports included), and the layers import-linter checks, read from pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO_ROOT = Path(__file__).resolve().parent.parent


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(module: str) -> None:
        nonlocal counter
        index[module] = low[module] = counter
        counter += 1
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in graph.modules or not imported.startswith("kbpg"):
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(m for m in graph.modules if m.startswith("kbpg")):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph("kbpg", exclude_type_checking_imports=False, cache_dir=None)
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_loop() -> None:
    graph = grimp.build_graph("kbpg", exclude_type_checking_imports=False, cache_dir=None)
    graph.add_import(importer="kbpg.store.db", imported="kbpg.search.run")
    assert any("kbpg.store.db" in cycle and "kbpg.search.run" in cycle for cycle in _cycles(graph))


def test_import_contracts_hold() -> None:
    """The layers (faces > app > search | ingest > models | store > config > errors), no cycle
    between siblings, click only in kbpg.cli, the web framework only in kbpg.serve."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
