"""The test suite's own layout: pytest imports test modules by basename (rootdir-relative,
no packages), so two test files with one name abort collection of the whole suite."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in seen.items() if len(paths) > 1}
    assert clashes == {}, f"test modules share a basename (pytest cannot collect both): {clashes}"


def test_every_exclusive_module_exists() -> None:
    """dev/test.sh runs the modules of ``EXCLUSIVE`` alone, after the rest: a renamed
    module left in the list would run beside the others again, silently."""
    from tests.conftest import EXCLUSIVE

    integration = {path.name for path in (TESTS / "integration").glob("test_*.py")}
    assert EXCLUSIVE, "no exclusive modules"
    assert not EXCLUSIVE - integration, sorted(EXCLUSIVE - integration)
