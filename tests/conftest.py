"""Shared test configuration: markers are applied by folder."""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {"unit": "unit", "integration": "integration", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
