"""The layout of ``servesweep.sweep``: four sub-packages whose imports point one way
(commands -> executors -> core -> slots -> events), and the slot's plain data
(``sweep.slots.data``), which the driver, the executors and the slot runtime all depend
on, importing nothing else of ``sweep``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import servesweep.sweep as sweep
import servesweep.sweep.slots.data as slot_data

_SWEEP = Path(sweep.__file__).parent
_ORDER = ("events", "slots", "core", "executors", "commands")
"""Bottom first: each part may import the parts before it, never one after it."""


def _imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]


def _part(module: str) -> str | None:
    """``servesweep.sweep.core.driver`` -> ``core`` (None: not of ``sweep``)."""
    names = module.split(".")
    return names[2] if names[:2] == ["servesweep", "sweep"] and len(names) > 2 else None


def test_slot_data_imports_nothing_else_of_sweep() -> None:
    imported = _imported(Path(slot_data.__file__))
    assert imported, "the module imports something"
    assert not [m for m in imported if m.startswith("servesweep.sweep")]


def test_every_module_of_sweep_is_in_one_of_its_parts() -> None:
    modules = {p.relative_to(_SWEEP).parts[0].removesuffix(".py") for p in _SWEEP.rglob("*.py")}
    assert modules - {"__init__"} == set(_ORDER)


@pytest.mark.parametrize("part", _ORDER)
def test_imports_point_down_the_layout(part: str) -> None:
    below = set(_ORDER[: _ORDER.index(part) + 1])
    wrong = []
    for path in sorted((_SWEEP / part).rglob("*.py")) or [_SWEEP / f"{part}.py"]:
        for module in _imported(path):
            other = _part(module)
            if other is not None and other not in below:
                wrong.append(f"{path.relative_to(_SWEEP)} imports {module}")
    assert not wrong, wrong
