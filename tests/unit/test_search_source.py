"""The driver's source of trials: a grid's plan of pending trials prunes when the
sweep file asks for it, as a capped grid and every sampling search do."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.decide.perf import Prediction
from servesweep.decide.perf.gate import Leader, skip_evidence
from servesweep.models import LevelResult, Outcome
from servesweep.spec.load import load_sweep_text
from servesweep.store import Store, TrialRecord, open_store
from servesweep.sweep.commands.run import open_sweep
from servesweep.sweep.core.predict_gate import PredictGate
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


_TPE = """
name: tpe
server:
  engine: sim
  gpus: [0]
search: {strategy: tpe, trials: 12, seed: 7, startup_trials: 3}
params:
  grid:
    max_num_seqs: [8, 16, 32, 64]
    budget: [0, 1, 2, 4]
workloads:
  - name: chat
    concurrency: [8]
    requests: 2
objective: {maximize: output_throughput, workload: chat, concurrency: 8}
"""


def _measure(store: Store, source: SearchSource, trial: TrialRecord, at: float) -> None:
    store.begin_attempt(trial.id, at, None)
    value = 100.0 + trial.params["max_num_seqs"] - 3.0 * (trial.params["budget"] - 2) ** 2
    store.add_result(trial.id, LevelResult("chat", "c8", 0, {"output_throughput": value}))
    store.finish_trial(trial.id, Outcome.OK, at + 5.0)
    done = store.trial(trial.id)
    source.tell(done, store.results(trial.id, with_samples=False))


def test_a_skipped_trial_launched_at_the_end_is_replayed_where_it_was_skipped(
    tmp_path: Path,
) -> None:
    """A sampled search whose fourth proposal is skipped as predicted worse and then
    launched before the sweep ends (its trial then holds only that late launch): the
    rebuilt search replays the skip where the sampler was told it, warns of nothing,
    and proposes what the first run would have proposed next."""
    loaded = load_sweep_text(_TPE)
    store = open_store(tmp_path / "db")
    sweep = open_sweep(loaded, store)
    source = SearchSource(store, sweep, loaded.spec)
    gate = PredictGate(loaded.spec, store, sweep, enabled=True)
    clock, skipped = 1000.0, None
    for step in range(7):
        (trial,) = source.take(1)
        clock += 10.0
        if step == 3:
            metric = "chat.c8.output_throughput"
            below = {metric: Prediction(metric, 40.0, 30.0, 50.0, "empirical")}
            evidence = skip_evidence("x", below, Leader(metric, "max", 120.0, 1), 0.01)
            store.finish_trial(trial.id, Outcome.SKIPPED, clock, evidence=evidence)
            skipped = store.trial(trial.id)
            source.tell(skipped, [])
            continue
        _measure(store, source, trial, clock)
    assert skipped is not None
    _measure(store, source, gate.reopen(skipped), clock + 100.0)
    expected = source.search.ask()
    assert store.trial(skipped.id).outcome is Outcome.OK
    # the skip is kept, and read back for the reports as the record they render
    (kept,) = store.load_sweep_data(sweep.id, with_samples=False).reopened[skipped.id]
    assert kept.trial == skipped.id and kept.skipped_at == skipped.finished_at
    assert kept.evidence == skipped.evidence
    rebuilt = SearchSource(store, sweep, loaded.spec)
    assert rebuilt.notes == []
    assert rebuilt.search.ask() == expected
    # a trial that is genuinely not what the sampler proposes still warns
    other = load_sweep_text(_TPE.replace("seed: 7", "seed: 8"))
    assert any(
        "not what the sampler proposes" in n for n in SearchSource(store, sweep, other.spec).notes
    )
