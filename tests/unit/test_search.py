"""The search the driver calls: ask, tell, exhausted; rebuilt from stored trials after a
restart; failures that blame the configuration against failures of the environment."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from optuna.trial import TrialState

from servesweep.decide.perf import Prediction
from servesweep.decide.perf.gate import Leader, skip_evidence
from servesweep.models import Evidence, FailureClass, LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search import Search, VerdictKind, create_search
from servesweep.search.grid import GridSearch
from servesweep.search.sampled import ENV_ATTEMPTS, SampledSearch
from servesweep.spec import load_sweep_text
from servesweep.spec.schema import SweepSpec

HEAD = """\
name: s
server: {engine: sim}
workloads:
  - {name: chat, concurrency: [1, 8]}
objective: {maximize: output_throughput, workload: chat, concurrency: 8}
constraints: [chat.c1.ttft_p99_ms < 100]
"""

SPACE = """\
params:
  grid:
    seqs: [16, 32, 64, 128]
    tokens: {low: 1024, high: 8192, step: 1024}
    spec: [0, 2, 4]
"""


def sweep(search: str, params: str = SPACE, head: str = HEAD) -> SweepSpec:
    return load_sweep_text(f"{head}{params}search: {search}\n").spec


def throughput(params: dict[str, Any]) -> float:
    seqs, tokens, spec = params["seqs"], params.get("tokens", 2048), params.get("spec", 0)
    return 100.0 + seqs * 0.5 + tokens / 512 - (spec - 2) ** 2 * 3


def ttft(params: dict[str, Any]) -> float:
    return 40.0 + params.get("tokens", 2048) / 128


def results_of(params: dict[str, Any]) -> list[LevelResult]:
    return [
        LevelResult("chat", "c1", 0, {"ttft_p99_ms": ttft(params), "output_throughput": 10.0}),
        LevelResult("chat", "c8", 0, {"output_throughput": throughput(params)}),
    ]


class Driver:
    """Runs a search the way the driver does, with a clock and a record per trial."""

    def __init__(self, search: Search, outcome: Callable[[ServerConfig], Outcome] | None = None):
        self.search = search
        self.outcome = outcome or (lambda c: Outcome.OK)
        self.history: list[tuple[TrialRecord, list[LevelResult]]] = []
        self.clock = 1000.0
        self.asked: list[ServerConfig] = []
        self._ids = itertools.count(1)

    def ask(self) -> ServerConfig | None:
        config = self.search.ask()
        if config is not None:
            self.asked.append(config)
        return config

    def record(self, config: ServerConfig, outcome: Outcome, **kw: Any) -> TrialRecord:
        number = next(self._ids)
        self.clock += 10
        return TrialRecord(
            id=number,
            sweep_id=1,
            seq=number,
            fingerprint=config.fingerprint,
            params=dict(config.params),
            outcome=outcome,
            started_at=kw.pop("started_at", self.clock),
            finished_at=kw.pop("finished_at", self.clock + 5 if outcome.final else None),
            attempts=kw.pop("attempts", 1),
            **kw,
        )

    def finish(self, config: ServerConfig, outcome: Outcome | None = None, **kw: Any) -> None:
        outcome = outcome or self.outcome(config)
        record = self.record(config, outcome, **kw)
        results = results_of(dict(config.params)) if outcome is Outcome.OK else []
        self.history.append((record, results))
        self.search.tell(record, results)

    def run(self, count: int) -> None:
        for _ in range(count):
            config = self.ask()
            assert config is not None
            self.finish(config)


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_same_seed_same_sequence(strategy: str) -> None:
    runs = []
    for _ in range(2):
        driver = Driver(create_search(sweep(f"{{strategy: {strategy}, trials: 40, seed: 5}}")))
        driver.run(12)
        runs.append([c.fingerprint for c in driver.asked])
    assert runs[0] == runs[1]
    other = Driver(create_search(sweep(f"{{strategy: {strategy}, trials: 40, seed: 6}}")))
    other.run(12)
    assert [c.fingerprint for c in other.asked] != runs[0]


@pytest.mark.parametrize("strategy", ["random", "tpe", "grid"])
@pytest.mark.parametrize("done", [1, 7, 15])
def test_rebuilt_search_proposes_what_the_first_would_have(strategy: str, done: int) -> None:
    params = (
        SPACE
        if strategy != "grid"
        else SPACE.replace("{low: 1024, high: 8192, step: 1024}", "[1024, 4096, 8192]")
    )
    spec = sweep(f"{{strategy: {strategy}, trials: 40, seed: 3}}", params)
    driver = Driver(create_search(spec))
    driver.run(done)
    expected = driver.search.ask()
    rebuilt = create_search(spec, driver.history)
    assert expected is not None
    assert rebuilt.ask() == expected
    if isinstance(rebuilt, SampledSearch):
        assert rebuilt.notes == []


def test_rebuilt_search_replays_parallel_asks_in_their_order() -> None:
    spec = sweep("{strategy: tpe, trials: 40, seed: 11, startup_trials: 3}")
    driver = Driver(create_search(spec))
    # two slots: a, b asked together; a finishes, c asked; b finishes, d asked...
    slots = [driver.ask(), driver.ask()]
    started = {0: 1000.0, 1: 1000.5}
    clock = 1001.0
    for step in range(8):
        slot = step % 2
        config = slots[slot]
        assert config is not None
        driver.finish(config, started_at=started[slot], finished_at=clock)
        slots[slot] = driver.ask()
        started[slot] = clock + 0.1
        clock += 3.0
    assert len({c.fingerprint for c in driver.asked}) == len(driver.asked)
    # the two running trials are in the history as running (started, not finished)
    for slot in (0, 1):
        config = slots[slot]
        assert config is not None
        running = driver.record(config, Outcome.RUNNING, started_at=started[slot])
        driver.history.append((running, []))
    expected = driver.search.ask()
    rebuilt = create_search(spec, driver.history)
    # the unfinished trials first, in the order they were asked, then the next proposal
    assert [rebuilt.ask(), rebuilt.ask()] == slots
    assert rebuilt.ask() == expected
    assert isinstance(rebuilt, SampledSearch) and rebuilt.notes == []


@pytest.mark.parametrize("killed", ["stored", "started", "after_a_skip"])
def test_a_search_killed_during_a_trial_launches_the_cap_exactly_in_all(killed: str) -> None:
    """A run killed during its third trial of six, then a rerun (which makes the running
    trial pending again, its start kept): the rebuilt search asks the killed trial first
    and counts it once, then the configurations the cap leaves, then nothing. A trial
    skipped before the kill (predicted worse) is stored but not in the cap: the store
    then holds the cap plus the skipped ones."""
    spec = sweep("{strategy: tpe, trials: 6, seed: 5, startup_trials: 2}")
    driver = Driver(create_search(spec))
    driver.run(2)
    skipped = 0
    if killed == "after_a_skip":
        config = driver.ask()
        assert config is not None
        metric = "chat.c8.output_throughput"
        below = {metric: Prediction(metric, 40.0, 30.0, 50.0, "speculative")}
        evidence = skip_evidence("x", below, Leader(metric, "max", 120.0, 1), 0.01)
        driver.finish(config, Outcome.SKIPPED, evidence=evidence, started_at=None)
        skipped = 1
    third = driver.ask()
    assert third is not None
    started = None if killed == "stored" else driver.clock + 6.0  # after the last end
    attempts = 0 if killed == "stored" else 1
    pending = driver.record(third, Outcome.PENDING, started_at=started, attempts=attempts)
    driver.history.append((pending, []))
    rerun = Driver(create_search(spec, driver.history))
    assert rerun.ask() == third
    rerun.finish(third)
    rerun.run(3)
    assert rerun.ask() is None
    stored = {c.fingerprint for c in driver.asked} | {c.fingerprint for c in rerun.asked}
    assert len(stored) == 6 + skipped
    assert len(driver.asked) + len(rerun.asked) == 6 + skipped + 1  # the killed one twice


def test_another_seed_in_the_history_still_measures_nothing_twice() -> None:
    driver = Driver(create_search(sweep("{strategy: tpe, trials: 80, seed: 1}")))
    driver.run(10)
    spec = sweep("{strategy: tpe, trials: 80, seed: 2}")
    rebuilt = create_search(spec, driver.history)
    assert isinstance(rebuilt, SampledSearch)
    assert rebuilt.notes and "not what the sampler proposes" in rebuilt.notes[0]
    measured = {c.fingerprint for c in driver.asked}
    again = Driver(rebuilt)
    again.run(20)
    assert measured.isdisjoint(c.fingerprint for c in again.asked)


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_a_finite_space_runs_out_without_duplicates(strategy: str) -> None:
    params = "params:\n  grid:\n    seqs: [16, 32, 64]\n    spec: {low: 0, high: 4, step: 2}\n"
    head = HEAD.replace("constraints: [chat.c1.ttft_p99_ms < 100]\n", "")
    spec = sweep(f"{{strategy: {strategy}, seed: 4}}", params, head)
    driver = Driver(create_search(spec))

    def results(params: dict[str, Any]) -> list[LevelResult]:
        return [LevelResult("chat", "c8", 0, {"output_throughput": params["seqs"] + 0.0})]

    while (config := driver.ask()) is not None:
        record = driver.record(config, Outcome.OK)
        driver.search.tell(record, results(dict(config.params)))
    fingerprints = [c.fingerprint for c in driver.asked]
    assert len(fingerprints) == len(set(fingerprints)) == 9


@pytest.mark.parametrize(("strategy", "trials"), [("tpe", 30), ("random", None)])
def test_forbidden_configurations_are_never_proposed(strategy: str, trials: int | None) -> None:
    params = SPACE + "  when: [spec <= seqs / 16]\n  exclude: [{seqs: 128, spec: 4}]\n"
    cap = f", trials: {trials}" if trials else ""
    spec = sweep(f"{{strategy: {strategy}, seed: 8, startup_trials: 4{cap}}}", params)
    search = create_search(spec)
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    while (config := driver.ask()) is not None:
        driver.finish(config)
    for config in driver.asked:
        p = config.params
        assert p["spec"] <= p["seqs"] / 16
        assert (p["seqs"], p["spec"]) != (128, 4)
    allowed = {c.fingerprint for c in search.space.allowed()}
    asked = {c.fingerprint for c in driver.asked}
    assert len(asked) == len(driver.asked) == (trials or len(allowed))
    assert asked <= allowed
    # the sampler was told about the forbidden proposals without a launch: infeasible
    forbidden = [
        t
        for t in search.study.trials
        if t.state is TrialState.COMPLETE and t.constraints.get("c1", 0) > 0
    ]
    assert forbidden


def test_config_failure_is_infeasible_for_the_sampler() -> None:
    search = create_search(sweep("{strategy: tpe, trials: 20, seed: 1}"))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    config = driver.ask()
    assert config is not None
    driver.finish(
        config,
        Outcome.FAILED,
        failure_class=FailureClass.START_CRASH,
        evidence=Evidence(message="CUDA out of memory", reason="oom"),
    )
    told = search.told[config.fingerprint].verdict
    assert told.kind is VerdictKind.INFEASIBLE and "start_crash (oom)" in told.reason
    trial = search.study.trials[-1]
    assert trial.state is TrialState.COMPLETE
    assert trial.constraints["c1"] > 0  # the failure constraint
    assert all(c.fingerprint != config.fingerprint for c in (driver.ask() for _ in range(10)) if c)


def test_met_and_violated_constraints_reach_the_sampler() -> None:
    search = create_search(sweep("{strategy: random, trials: 20, seed: 1}"))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    driver.run(12)
    for trial in search.study.trials:
        if trial.state is not TrialState.COMPLETE:
            continue
        tokens = trial.params["tokens"]
        violated = ttft({"tokens": tokens}) >= 100
        assert (trial.constraints["c0"] > 0) == violated
        assert trial.constraints["c1"] <= 0


@pytest.mark.parametrize(
    "failure",
    [
        FailureClass.GPU_BUSY,
        FailureClass.PORT_IN_USE,
        FailureClass.STOP_FAILED,
        FailureClass.NODE_LOST,
    ],
)
def test_environment_failure_is_never_blamed_on_the_config(failure: FailureClass) -> None:
    search = create_search(sweep("{strategy: tpe, trials: 20, seed: 1}"))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    config = driver.ask()
    assert config is not None
    for attempt in range(1, ENV_ATTEMPTS):
        driver.finish(config, Outcome.FAILED, failure_class=failure, attempts=attempt)
        assert config.fingerprint not in search.told
        assert all(t.state is TrialState.RUNNING for t in search.study.trials)
        assert driver.ask() == config  # asked again, the same sampler trial
    driver.finish(config, Outcome.FAILED, failure_class=failure, attempts=ENV_ATTEMPTS)
    assert config.fingerprint not in search.told
    assert [t.state for t in search.study.trials] == [TrialState.FAIL]  # not learned from
    assert driver.ask() != config  # given up after ENV_ATTEMPTS attempts


def test_environment_failure_in_the_history_is_asked_again_first() -> None:
    spec = sweep("{strategy: tpe, trials: 20, seed: 2}")
    driver = Driver(create_search(spec))
    driver.run(3)
    config = driver.ask()
    assert config is not None
    driver.finish(config, Outcome.FAILED, failure_class=FailureClass.GPU_BUSY)
    rebuilt = create_search(spec, driver.history)
    assert rebuilt.ask() == config


def test_pruned_trial_is_told_pruned_with_its_intermediate_value() -> None:
    search = create_search(sweep("{strategy: tpe, trials: 20, seed: 1}"))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    config = driver.ask()
    assert config is not None
    record = driver.record(config, Outcome.PRUNED, evidence=Evidence(message="cannot win"))
    search.tell(record, results_of(dict(config.params)))
    trial = search.study.trials[-1]
    assert trial.state is TrialState.PRUNED
    assert trial.intermediate_values == {0: throughput(dict(config.params))}


def test_a_trial_skipped_as_predicted_worse_is_told_pruned_and_not_in_the_cap() -> None:
    search = create_search(sweep("{strategy: tpe, trials: 2, seed: 1}"))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    config = driver.ask()
    assert config is not None
    metric = "chat.c8.output_throughput"
    below = {metric: Prediction(metric, 40.0, 30.0, 50.0, "speculative")}
    evidence = skip_evidence("x", below, Leader(metric, "max", 120.0, 1), 0.01)
    record = driver.record(config, Outcome.SKIPPED, evidence=evidence, started_at=None)
    search.tell(record, [])
    trial = search.study.trials[-1]
    assert trial.state is TrialState.PRUNED
    assert trial.intermediate_values == {0: 40.0}  # its predicted value
    assert search.trials_left == 2  # never launched: not in the cap
    assert search.front() == ()  # a prediction is never the best so far


def test_unfinished_trial_told_is_asked_again() -> None:
    search = create_search(sweep("{strategy: random, trials: 20, seed: 1}"))
    driver = Driver(search)
    config = driver.ask()
    assert config is not None
    search.tell(driver.record(config, Outcome.INTERRUPTED), [])
    assert driver.ask() == config


def test_parallel_asks_never_hand_out_the_same_config() -> None:
    params = "params:\n  grid:\n    seqs: [16, 32]\n    spec: [0, 2]\n"
    search = create_search(sweep("{strategy: tpe, seed: 1, startup_trials: 0}", params))
    asked = [search.ask() for _ in range(5)]
    running = [c for c in asked if c is not None]
    assert len(running) == 4 and len({c.fingerprint for c in running}) == 4
    assert asked[4] is None  # every allowed config is running


def test_trials_cap_and_budget() -> None:
    spec = sweep("{strategy: random, trials: 3, budget: {time: 1h, gpu_hours: 2}}")
    search = create_search(spec)
    driver = Driver(search)
    driver.run(3)
    assert search.ask() is None
    assert not search.exhausted(elapsed_s=3599, gpu_seconds=7199)
    assert search.exhausted(elapsed_s=3600, gpu_seconds=0)
    assert search.exhausted(elapsed_s=0, gpu_seconds=7200)
    unbounded = create_search(sweep("{strategy: random, trials: 3}"))
    assert not unbounded.exhausted(elapsed_s=1e9, gpu_seconds=1e9)


def test_points_come_first_and_teach_the_sampler_when_they_fit() -> None:
    params = SPACE + "  points:\n    - {seqs: 64, tokens: 2048, spec: 2}\n    - {seqs: 8}\n"
    search = create_search(sweep("{strategy: tpe, trials: 20, seed: 1}", params))
    assert isinstance(search, SampledSearch)
    driver = Driver(search)
    first, second = driver.ask(), driver.ask()
    assert first is not None and dict(first.params) == {"seqs": 64, "tokens": 2048, "spec": 2}
    assert second is not None and dict(second.params) == {"seqs": 8}
    assert [t.params for t in search.study.trials] == [{"seqs": 2, "tokens": 2048, "spec": 1}]


def test_multi_objective_searches_keep_a_pareto_front() -> None:
    head = HEAD.replace(
        "objective: {maximize: output_throughput, workload: chat, concurrency: 8}\n",
        "objective:\n  - {maximize: chat.c8.output_throughput}\n"
        "  - {minimize: chat.c1.ttft_p99_ms}\n",
    )
    for strategy in ("nsga2", "tpe"):
        search = create_search(sweep(f"{{strategy: {strategy}, trials: 30, seed: 1}}", head=head))
        Driver(search).run(14)
        front = search.front()
        assert front
        for a in front:
            for b in front:
                assert not (a.values[0] > b.values[0] and a.values[1] < b.values[1])


def grid_spec() -> SweepSpec:
    return sweep("{strategy: grid}", "params:\n  grid:\n    seqs: [16, 32]\n    spec: [0, 2]\n")


def test_grid_runs_the_expansion_in_order_and_continues_after_a_restart() -> None:
    search = create_search(grid_spec())
    assert isinstance(search, GridSearch)
    driver = Driver(search)
    order = [dict(c.params) for c in search.configs]
    assert order == [
        {"seqs": 16, "spec": 0},
        {"seqs": 16, "spec": 2},
        {"seqs": 32, "spec": 0},
        {"seqs": 32, "spec": 2},
    ]
    a, b = driver.ask(), driver.ask()
    assert a is not None and b is not None
    driver.finish(a, Outcome.FAILED, failure_class=FailureClass.GPU_BUSY)
    driver.history.append((driver.record(b, Outcome.INTERRUPTED), []))
    rebuilt = create_search(grid_spec(), driver.history)
    # a grid's failure stays final as it always has; the interrupted one runs again
    assert [rebuilt.ask(), rebuilt.ask(), rebuilt.ask(), rebuilt.ask()] == [
        b,
        *search.configs[2:],
        None,
    ]


def test_grid_trials_cap() -> None:
    spec = sweep("{strategy: grid, trials: 2}", "params:\n  grid:\n    seqs: [16, 32, 64]\n")
    driver = Driver(create_search(spec))
    driver.run(2)
    assert driver.ask() is None


def test_a_grid_plan_runs_exactly_its_configurations_whatever_the_cap() -> None:
    spec = sweep("{strategy: grid, trials: 1}", "params:\n  grid:\n    seqs: [16, 32, 64]\n")
    configs = GridSearch(spec).configs
    plan = create_search(spec, only=[configs[2].fingerprint, configs[0].fingerprint])
    assert plan.planned and not create_search(spec).planned
    assert not plan.exhausted(elapsed_s=0.0, gpu_seconds=0.0)
    # in the grid's order, both although the cap says one
    assert [plan.ask(), plan.ask(), plan.ask()] == [configs[0], configs[2], None]
    assert plan.exhausted(elapsed_s=0.0, gpu_seconds=0.0)


def test_public_api_is_pinned() -> None:
    import servesweep.search as search_pkg

    assert sorted(search_pkg.__all__) == sorted(
        [
            "NOISE_MARGIN",
            "Goal",
            "History",
            "Incumbent",
            "Measured",
            "PrunePolicy",
            "Search",
            "Verdict",
            "VerdictKind",
            "create_search",
            "goal_of",
            "judge",
            "measure",
            "prune_reason",
        ]
    )
    for name in search_pkg.__all__:
        assert hasattr(search_pkg, name)


def _skipped_then_launched_at_the_end(
    spec: SweepSpec,
) -> tuple[Driver, TrialRecord, TrialRecord, list[LevelResult]]:
    """A sampled search whose fourth proposal is skipped as predicted worse, that goes
    on, and launches that trial at the end of the sweep (its interval still reached
    the leader): its trial keeps its id and number, and now holds the late launch."""
    driver = Driver(create_search(spec))
    driver.run(3)
    config = driver.ask()
    assert config is not None
    metric = "chat.c8.output_throughput"
    below = {metric: Prediction(metric, 40.0, 30.0, 50.0, "speculative")}
    evidence = skip_evidence("x", below, Leader(metric, "max", 120.0, 1), 0.01)
    driver.finish(config, Outcome.SKIPPED, evidence=evidence, started_at=None)
    skipped = driver.history[-1][0]
    driver.run(4)
    launched = dataclasses.replace(
        skipped,
        outcome=Outcome.OK,
        evidence=None,
        started_at=driver.clock + 10,
        finished_at=driver.clock + 15,
    )
    results = results_of(dict(config.params))
    driver.search.tell(launched, results)
    return driver, skipped, launched, results


def test_a_skipped_trial_launched_at_the_end_replays_where_the_sampler_told_it() -> None:
    spec = sweep("{strategy: tpe, trials: 40, seed: 7, startup_trials: 3}")
    driver, skipped, launched, results = _skipped_then_launched_at_the_end(spec)
    expected = driver.search.ask()
    # the store holds the trial once, as launched; its skip is a fact beside it
    # (search_history puts it back where it happened)
    stored = [(launched, results) if r.id == skipped.id else (r, res) for r, res in driver.history]
    history = [*stored[:3], (skipped, []), *stored[3:]]
    rebuilt = create_search(spec, history)
    assert isinstance(rebuilt, SampledSearch)
    assert rebuilt.notes == []
    assert rebuilt.ask() == expected
    assert rebuilt.told[launched.fingerprint].verdict.kind is VerdictKind.COMPLETE
    # the trial's latest state alone puts its ask at the late launch: not where the
    # sampler proposed it, which is what a rerun used to warn of
    alone = create_search(spec, stored)
    assert alone.notes and "not what the sampler proposes" in alone.notes[0]
    # another seed is still not what the sampler proposes
    other = sweep("{strategy: tpe, trials: 40, seed: 8, startup_trials: 3}")
    assert any("not what the sampler proposes" in n for n in create_search(other, history).notes)


def test_a_late_launch_of_a_skipped_trial_that_did_not_finish_is_asked_again_first() -> None:
    spec = sweep("{strategy: tpe, trials: 40, seed: 7, startup_trials: 3}")
    driver, skipped, launched, _ = _skipped_then_launched_at_the_end(spec)
    killed = dataclasses.replace(launched, outcome=Outcome.PENDING, finished_at=None)
    stored = [(killed, []) if r.id == skipped.id else (r, res) for r, res in driver.history]
    rebuilt = create_search(spec, [*stored[:3], (skipped, []), *stored[3:]])
    assert isinstance(rebuilt, SampledSearch) and rebuilt.notes == []
    assert rebuilt.ask() == driver.asked[3]  # the skipped one, launched again
    assert rebuilt.trials_left == 40 - 7  # not counted in the cap: it was skipped


def test_a_grid_continues_from_each_trials_latest_state() -> None:
    params = "params:\n  grid:\n    seqs: [16, 32]\n    spec: [0, 2]\n"
    spec = sweep("{strategy: grid}", params)
    driver = Driver(create_search(spec))
    config = driver.ask()
    assert config is not None
    metric = "chat.c8.output_throughput"
    below = {metric: Prediction(metric, 40.0, 30.0, 50.0, "speculative")}
    evidence = skip_evidence("x", below, Leader(metric, "max", 120.0, 1), 0.01)
    skipped = driver.record(config, Outcome.SKIPPED, evidence=evidence, started_at=None)
    relaunched = dataclasses.replace(skipped, outcome=Outcome.PENDING, finished_at=None)
    rebuilt = create_search(spec, [(skipped, []), (relaunched, [])])
    assert rebuilt.ask() == config  # pending now: run again in its place
