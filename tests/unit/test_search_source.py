"""The driver's source of trials: a grid's plan of pending trials prunes when the
sweep file asks for it, as a capped grid and every sampling search do."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.spec.load import load_sweep_text
from servesweep.store import open_store
from servesweep.sweep.commands.run import open_sweep
from servesweep.sweep.core.search_source import SearchSource

pytestmark = pytest.mark.unit

_SWEEP = """
name: plan
server:
  engine: sim
  gpus: [0]
search: {SEARCH}
params:
  grid:
    budget: [1, 2, 3]
workloads:
  - name: chat
    concurrency: [1, 4]
    requests: 2
"""


def _source(tmp_path: Path, search: str, planned: bool) -> SearchSource:
    loaded = load_sweep_text(_SWEEP.replace("{SEARCH}", search))
    store = open_store(tmp_path / "db")
    sweep = open_sweep(loaded, store)
    only = [t.fingerprint for t in store.trials(sweep.id)] if planned else None
    source = SearchSource(store, sweep, loaded.spec, only=only)
    assert source.planned is planned
    return source


@pytest.mark.parametrize("planned", [True, False])
def test_a_grid_prunes_only_when_asked(tmp_path: Path, planned: bool) -> None:
    asked = _source(tmp_path / "asked", "{strategy: grid, prune: true}", planned)
    policy = asked.prune_policy()
    assert policy is not None and policy.enabled
    assert policy.repeats == {"chat": 1}
    default = _source(tmp_path / "default", "{strategy: grid}", planned)
    assert default.prune_policy() is None
