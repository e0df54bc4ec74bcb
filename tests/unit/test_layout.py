"""The package's layers (docs/architecture.md): every decision is made in
``servesweep.decide``, which imports nothing above it; the sweep and the search never
reach up into the report; and no module imports, through any chain, a module that
imports it back (an import circle), also through a package's ``__init__``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import servesweep

pytestmark = pytest.mark.unit

_ROOT = Path(servesweep.__file__).parent


def _name(path: Path) -> str:
    parts = ("servesweep", *path.relative_to(_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {_name(p): p for p in sorted(_ROOT.rglob("*.py"))}


def _known(name: str) -> str | None:
    """``name`` or its nearest ancestor that is a module of the package."""
    while name and name not in _MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[str]:
    """The package's modules ``module`` imports, wherever the import is (in a function,
    under ``TYPE_CHECKING``): ``import a.b`` names ``a.b``; ``from a import b`` names
    ``a`` (its ``__init__`` runs first) and ``a.b`` when that is a module."""
    for node in ast.walk(ast.parse(_MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            known = _known(name)
            if known is not None and known != module:
                yield known


_GRAPH = {module: sorted(set(_imports(module))) for module in _MODULES}


def _under(module: str, *packages: str) -> bool:
    return any(
        module == f"servesweep.{p}" or module.startswith(f"servesweep.{p}.") for p in packages
    )


def test_the_sweep_and_the_search_never_import_the_report() -> None:
    wrong = [
        f"{module} imports {other}"
        for module, imported in _GRAPH.items()
        if _under(module, "sweep", "search")
        for other in imported
        if _under(other, "report")
    ]
    assert not wrong, wrong


def test_decide_imports_nothing_above_it() -> None:
    above = ("sweep", "search", "report", "bench", "servers", "store", "cli", "sim")
    wrong = [
        f"{module} imports {other}"
        for module, imported in _GRAPH.items()
        if _under(module, "decide")
        for other in imported
        if _under(other, *above)
    ]
    assert [m for m in _GRAPH if _under(m, "decide")], "the decisions' package exists"
    assert not wrong, wrong


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in _GRAPH[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in _GRAPH:
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_in_the_package() -> None:
    assert not _circles()


def test_a_circle_is_found() -> None:
    """The check itself: a circle added to the graph is reported."""
    a, b = "servesweep.decide.best", "servesweep.decide.stats"
    saved = list(_GRAPH[b])
    _GRAPH[b] = [*saved, a]
    try:
        assert any({a, b} <= set(c) for c in _circles())
    finally:
        _GRAPH[b] = saved
