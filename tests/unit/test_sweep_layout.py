"""The slot's plain data (``sweep.slot_types``) is what the driver, the executors and
the slot runtime all depend on: it imports nothing else of ``sweep``."""

from __future__ import annotations

import ast
from pathlib import Path

import servesweep.sweep.slot_types as slot_types


def test_slot_types_import_nothing_else_of_sweep() -> None:
    tree = ast.parse(Path(slot_types.__file__).read_text())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert imported, "the module imports something"
    assert not [m for m in imported if m.startswith("servesweep.sweep")]
