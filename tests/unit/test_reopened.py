"""A trial skipped as predicted worse and then launched before the end
(``PredictGate.reopen``): ``servesweep status`` counts and names the reopened trials and
gives each one's skip (when, the prediction, the leader) on its line and in ``--json``;
a later run launches a reopened trial its run did not launch (issue 34)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from servesweep.decide.perf import Prediction
from servesweep.decide.perf.gate import Leader, skip_evidence
from servesweep.models import LevelResult, Outcome
from servesweep.report.export import report_document
from servesweep.spec.load import load_sweep_text
from servesweep.store import Store, open_store
from servesweep.sweep.commands.run import open_sweep
from servesweep.sweep.commands.status import format_status, sweep_status
from servesweep.sweep.core import predict_gate
from servesweep.sweep.core.predict_gate import PredictGate

pytestmark = pytest.mark.unit

M = "chat.c1.output_throughput"

_SWEEP = """
name: reopen
server:
  engine: sim
  gpus: [0]
search: {predict: skip}
params:
  grid:
    budget: [1, 8, 16]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
objective: {maximize: output_throughput, workload: chat, concurrency: 1}
"""


def _measure(store: Store, trial_id: int, at: float, value: float) -> None:
    store.begin_attempt(trial_id, at, None)
    store.add_result(trial_id, LevelResult("chat", "c1", 0, {"output_throughput": value}))
    store.finish_trial(trial_id, Outcome.OK, at + 5.0)


def test_status_names_the_reopened_trials_and_their_skip(tmp_path: Path) -> None:
    loaded = load_sweep_text(_SWEEP)
    path = tmp_path / "servesweep.db"
    store = open_store(path)
    try:
        sweep = open_sweep(loaded, store)
        first, second, third = store.trials(sweep.id)
        _measure(store, first.id, 1000.0, 120.0)
        _measure(store, second.id, 1010.0, 100.0)
        evidence = skip_evidence(
            "budget=16",
            {M: Prediction(M, 40.0, 30.0, 50.0, "speculative")},
            Leader(M, "max", 120.0, first.id),
            0.01,
        )
        store.finish_trial(third.id, Outcome.SKIPPED, 1020.0, evidence=evidence)
        gate = PredictGate(loaded.spec, store, sweep, enabled=True)
        gate.reopen(store.trial(third.id))
        # before its late launch: pending, to launch before the end
        pending = sweep_status(path, None)
        assert pending["reopened"] == [third.number]
        line = next(x for x in format_status(pending).splitlines() if "budget=16" in x)
        assert line.strip().startswith(f"{third.number}  pending") and "to launch before" in line
        _measure(store, third.id, 1100.0, 45.0)
    finally:
        store.close()
    status = sweep_status(path, None)
    json.dumps(status)  # what --json prints
    assert status["reopened"] == [third.number]
    row = next(r for r in status["trials"] if r["id"] == third.id)
    assert row["outcome"] == "ok"
    (skip,) = row["reopened"]
    assert skip["skipped_at"] == 1020.0 and skip["reason"] == "predicted_worse"
    assert skip["predicted"][M]["high"] == 50.0
    assert skip["leader"] == {"trial": first.id, "metric": M, "value": 120.0}
    assert all(r["reopened"] == [] for r in status["trials"] if r["id"] != third.id)
    text = format_status(status)
    when = dt.datetime.fromtimestamp(1020.0, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert (
        f"1 reopened: skipped as predicted worse, then launched before the end (their "
        f"interval still reached the leader): #{third.number}"
    ) in text.splitlines(), text
    line = next(x for x in text.splitlines() if "budget=16" in x)
    assert line.strip().startswith(f"{third.number}  ok"), line
    assert line.endswith(
        f"reopened: skipped {when} UTC as predicted worse than #{first.id} ({M} 120): "
        f"{M} 40 [30-50] (speculative); then launched"
    ), line
    # the report's trials say it alike
    store = open_store(path, readonly=True)
    try:
        doc = report_document(store.load_sweep_data())
    finally:
        store.close()
    rows = {r["id"]: r for r in doc["trials"]}
    assert rows[third.id]["reopened"] == row["reopened"]
    assert all(r["reopened"] == [] for i, r in rows.items() if i != third.id)


def test_status_of_a_sweep_without_a_reopened_trial_says_nothing_of_it(tmp_path: Path) -> None:
    loaded = load_sweep_text(_SWEEP)
    path = tmp_path / "servesweep.db"
    store = open_store(path)
    try:
        sweep = open_sweep(loaded, store)
        _measure(store, store.trials(sweep.id)[0].id, 1000.0, 120.0)
    finally:
        store.close()
    status = sweep_status(path, None)
    assert status["reopened"] == []
    assert "reopened" not in format_status(status)


def test_a_reopened_trial_is_never_skipped_again_in_a_later_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends (Ctrl-C, a crash) after reopening a skipped trial and before its
    late launch: the next run's gate launches it (docs/sweep-file.md, "Resume"), whatever
    the prediction says then, while another configuration predicted worse is skipped."""
    loaded = load_sweep_text(_SWEEP)
    store = open_store(tmp_path / "servesweep.db")
    try:
        sweep = open_sweep(loaded, store)
        first, second, third = store.trials(sweep.id)
        _measure(store, first.id, 1000.0, 120.0)
        evidence = skip_evidence(
            "budget=16",
            {M: Prediction(M, 40.0, 30.0, 50.0, "speculative")},
            Leader(M, "max", 120.0, first.id),
            0.01,
        )
        assert evidence is not None
        store.finish_trial(third.id, Outcome.SKIPPED, 1020.0, evidence=evidence)
        PredictGate(loaded.spec, store, sweep, enabled=True).reopen(store.trial(third.id))
        # the next run: every configuration is now predicted worse than the leader
        monkeypatch.setattr(predict_gate, "decide_launch", lambda *_: evidence)
        again = PredictGate(loaded.spec, store, sweep, enabled=True)
        assert again.check(store.trial(third.id)) is None
        skipped = again.check(store.trial(second.id))
        assert skipped is not None and skipped.outcome is Outcome.SKIPPED
    finally:
        store.close()
