"""Shared test configuration: markers are applied by folder, and integration modules are
grouped for running side by side (``pytest -n N --dist loadgroup``, pytest-xdist).

Side by side, each integration module runs whole on one worker (its module-scoped
fixtures — a vLLM server, a Ray cluster — start once), and the modules that use one of
the machine's single services run on the same worker one after another: the systemd
sandbox (one per machine: ``up`` clears any other) and the private dockerd. Modules
listed in ``_FIRST`` (the longest, measured) are handed out first, so the run does not
end on one long module while the other worker idles.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {"unit": "unit", "integration": "integration", "gpu": "gpu"}

_SERVICE_FIXTURES = {"systemd_sandbox": "machine-services", "dockerd": "machine-services"}
"""Session fixtures that stand for one service of the machine: their modules share a group."""

_FIRST: tuple[str, ...] = ()
"""Integration modules handed out first, longest first (file names)."""


def _module_group(items: list[pytest.Item]) -> str:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in _SERVICE_FIXTURES:
                return _SERVICE_FIXTURES[fixture]
    return Path(str(items[0].fspath)).name


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
        if "integration" in parts:
            by_module.setdefault(str(item.fspath), []).append(item)
    for module_items in by_module.values():
        group = _module_group(module_items)
        for item in module_items:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return _FIRST.index(name) if name in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: the order within a rank stays as collected
