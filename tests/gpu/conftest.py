"""Fixtures of the GPU test tier (tests/gpu): the process keeper."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.gpu.gpu_helpers import ProcessKeeper


@pytest.fixture
def keeper() -> Iterator[ProcessKeeper]:
    """Every process the test starts, ended by PID when the test ends (even on failure)."""
    k = ProcessKeeper()
    try:
        yield k
    finally:
        k.cleanup()
