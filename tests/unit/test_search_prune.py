"""Early stop decisions: a violated constraint, an objective that cannot reach the best
so far beyond the noise, and what is never decided (unfinished levels, opt-out)."""

from __future__ import annotations

from servesweep.models import LevelResult
from servesweep.search import Goal, Incumbent, PrunePolicy, prune_reason
from servesweep.spec.constraints import parse_constraint, parse_metric_ref

THROUGHPUT = parse_metric_ref("chat.c8.output_throughput")
TTFT = parse_metric_ref("chat.c1.ttft_p99_ms")
CONSTRAINT = parse_constraint("chat.c1.ttft_p99_ms < 500")


def level(label: str, repeat: int = 0, **metrics: float) -> LevelResult:
    return LevelResult("chat", label, repeat, metrics)


def policy(
    *,
    best: float | None = 1000.0,
    spread: float = 0.0,
    repeats: int = 1,
    enabled: bool = True,
    constraints: bool = True,
) -> PrunePolicy:
    front = () if best is None else (Incumbent((best,), (spread,), trial=4),)
    goal = Goal(((THROUGHPUT, "max"),), (CONSTRAINT,) if constraints else ())
    return PrunePolicy(goal, {"chat": repeats}, front, enabled=enabled)


def test_violated_constraint_stops_the_trial() -> None:
    reason = prune_reason(policy(), [level("c1", ttft_p99_ms=812.0)])
    assert reason == "constraint chat.c1.ttft_p99_ms < 500 is violated: chat.c1.ttft_p99_ms = 812"


def test_met_constraint_and_unmeasured_objective_continue() -> None:
    assert prune_reason(policy(), [level("c1", ttft_p99_ms=320.0)]) is None


def test_constraint_waits_for_every_repeat_of_its_level() -> None:
    results = [level("c1", 0, ttft_p99_ms=900.0)]
    assert prune_reason(policy(repeats=2), results) is None
    results.append(level("c1", 1, ttft_p99_ms=200.0))
    # the mean of the repeats (550) is what the report judges
    assert prune_reason(policy(repeats=2), results) is not None
    results[1] = level("c1", 1, ttft_p99_ms=0.0)
    assert prune_reason(policy(repeats=2), results) is None  # mean 450 meets it


def test_objective_far_below_the_best_stops_the_trial() -> None:
    results = [level("c1", ttft_p99_ms=100.0), level("c8", output_throughput=800.0)]
    reason = prune_reason(policy(best=1000.0), results)
    assert reason == (
        "chat.c8.output_throughput = 800 cannot reach the best so far 1000 (trial 4) "
        "within the noise ±50"
    )


def test_objective_within_the_noise_continues() -> None:
    results = [level("c1", ttft_p99_ms=100.0), level("c8", output_throughput=960.0)]
    assert prune_reason(policy(best=1000.0), results) is None  # 5 % margin
    # a measured spread wider than the margin widens the noise
    near = [level("c1", ttft_p99_ms=100.0), level("c8", output_throughput=850.0)]
    assert prune_reason(policy(best=1000.0), near) is not None
    assert prune_reason(policy(best=1000.0, spread=200.0), near) is None


def test_minimised_objective_prunes_the_slow_ones() -> None:
    goal = Goal(((TTFT, "min"),))
    slow = PrunePolicy(goal, {"chat": 1}, (Incumbent((100.0,), (0.0,), 2),))
    assert prune_reason(slow, [level("c1", ttft_p99_ms=140.0)]) is not None
    assert prune_reason(slow, [level("c1", ttft_p99_ms=104.0)]) is None


def test_no_best_yet_means_only_constraints_prune() -> None:
    results = [level("c1", ttft_p99_ms=100.0), level("c8", output_throughput=1.0)]
    assert prune_reason(policy(best=None), results) is None


def test_opt_out_never_prunes() -> None:
    assert prune_reason(policy(enabled=False), [level("c1", ttft_p99_ms=5000.0)]) is None


def test_trial_metric_constraint_prunes_before_any_level() -> None:
    goal = Goal(((THROUGHPUT, "max"),), (parse_constraint("load_s < 600"),))
    slow_load = PrunePolicy(goal, {"chat": 1})
    assert prune_reason(slow_load, [], {"load": 720.0}) == (
        "constraint load_s < 600 is violated: load_s = 720"
    )
    assert prune_reason(slow_load, [], {"load": 300.0}) is None


def test_pareto_front_prunes_only_what_is_beaten_on_every_objective() -> None:
    goal = Goal(((THROUGHPUT, "max"), (TTFT, "min")))
    front = (Incumbent((1000.0, 100.0), (0.0, 0.0), 1), Incumbent((1500.0, 300.0), (0.0, 0.0), 2))
    pareto = PrunePolicy(goal, {"chat": 1}, front)
    worse = [level("c1", ttft_p99_ms=400.0), level("c8", output_throughput=900.0)]
    assert (
        prune_reason(pareto, worse) == "trial 1 is better on every objective by more than the noise"
    )
    tradeoff = [level("c1", ttft_p99_ms=50.0), level("c8", output_throughput=600.0)]
    assert prune_reason(pareto, tradeoff) is None
