"""How often a sweep names the wrong winner, per decision policy, and what it costs.

A simulated landscape with a known truth stands in for an inference server: ``--configs``
configurations of one engine whose true output throughput (concurrency 1) is known:
the best at 300 tok/s, two more within 0.5-1.5 % of it (as good, for any purpose), two
2.5-4 % behind it, the rest 5-30 % behind. A measured level is built request by
request, as the load generator records it (``RequestSample``: TTFT, chunk times,
tokens), with the noise a real server shows:

- **between launches**: each launch of a configuration runs at a factor drawn from
  N(1, ``--launch-sd``) (default 2 %: the H200 measured 1.9 % at c1 and 2.2 % at c4
  across five launches of llama-server);
- **within a launch**: each request's decode rate varies N(1, ``--request-sd``)
  (default 6 %), each repeat of a level adds N(1, 0.5 %).

Every policy reads the same measurements and decides through servesweep's own
``find_best`` (intervals from ``servesweep.decide.level_intervals``, the decision from
``servesweep.decide.uncertainty``):

- ``mean``: one launch, one repeat, the highest mean wins (servesweep before intervals);
- ``grid-repeats-3``: one launch, three repeats, the highest mean (the usual remedy);
- ``intervals``: one launch, one repeat, ``best`` with intervals (a tie: the leader);
- ``intervals+confirm``: as ``intervals``; then servesweep's confirm phase decides
  (``servesweep.decide.confirm.decide``, what the driver runs after a sweep, with
  ``confirm: {top: 3, launches: 1, budget: N}``): the tie set's leading candidates are
  relaunched, one launch each per round, stored as further launches of their trials,
  and ``best`` decides again on all the results (successive elimination: a candidate
  decisively beaten leaves), until one is left or the budget is spent
  (``--confirm-launches`` extra launches; by default as many as keep its GPU-hours
  within those of ``grid-repeats-3``).

- ``screening+confirm``: ``screening: {requests: 25%}`` (its default threshold, 5 %;
  ``--screen-threshold``) first, then as
  ``intervals+confirm``: each configuration's launch measures a short level (8 of the
  32 requests) first; servesweep's screening decision
  (``servesweep.decide.screening.screen_reason``, what the slot runs, against the
  references the driver gives it: the candidates of ``best`` so far, by their own
  screening figures) either screens it out or measures the full level in the same
  launch (the same launch factor); then the confirm phase on the full results, with
  the same budget.

The confirm phase is also run with one of servesweep's rules taken away (``no
equivalence stop``; ``pairwise``: 95 % per comparison instead of family-wise; ``before``:
neither these nor the launch variation in one launch's interval). ``--same K`` puts K
configurations exactly as fast as the best (differing only in ``--seed``) in place of
the two within 0.5-1.5 %; ``--threshold`` sets ``decision.threshold``.

A winner is **wrong** when its true throughput is more than 2 % below the true best. A
configuration within 0.5 % of the true best is **dropped** when the confirm phase stops
relaunching it as beaten or the final result (winner and tie set) leaves it out.
GPU-hours come from a model of a large deployment: 8 GPUs, 7 min to stop, release and
load, 3 min per measured level. Numbers over ``--seeds`` seeds (Wilson 95 % interval
of the wrong-winner rate).

Run:  .venv/bin/python bench/winner_accuracy.py [--seeds 100] [--configs 12] [--same 2]
      [--threshold 0.05] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from servesweep.decide.best import BestResult, find_best
from servesweep.decide.confirm import Done, Relaunch, Round, cost, decide, spent_launches
from servesweep.decide.intervals import wilson
from servesweep.decide.level_intervals import level_intervals
from servesweep.decide.screening import (
    Reference,
    ScreenPolicy,
    figure_of,
    screen_reason,
    screening_stats,
)
from servesweep.decide.uncertainty import Rules
from servesweep.models import InstanceRecord, LevelResult, Outcome, RequestSample
from servesweep.records import SweepData, SweepRecord, TrialRecord
from servesweep.spec.constraints import parse_metric_ref
from servesweep.spec.schema import ConfirmBudget, ConfirmSpec

GPUS = 8
LAUNCH_MIN = 7.0
"""Minutes to stop, release and load one configuration."""
LEVEL_MIN = 3.0
"""Minutes of one measured level."""
REQUESTS = 32
TOKENS = 24
BEST = 300.0
OBJECTIVE = "chat.c1.output_throughput"


@dataclass
class Noise:
    launch_sd: float
    request_sd: float
    repeat_sd: float = 0.005


def landscape(rng: random.Random, n: int, same: int = 0) -> list[float]:
    """True throughputs: the best, two as good, two just worse, the rest worse; with
    ``same``, that many configurations exactly as fast as the best (configurations
    that differ only in ``--seed``) instead of the two as good."""
    out = [BEST]
    if same:
        out += [BEST] * same
        out += [BEST * (1 - rng.uniform(0.025, 0.04)) for _ in range(2)]
        out += [BEST * (1 - rng.uniform(0.05, 0.30)) for _ in range(n - 3 - same)]
        rng.shuffle(out)
        return out
    out += [BEST * (1 - rng.uniform(0.005, 0.015)) for _ in range(2)]
    out += [BEST * (1 - rng.uniform(0.025, 0.04)) for _ in range(2)]
    out += [BEST * (1 - rng.uniform(0.05, 0.30)) for _ in range(n - 5)]
    rng.shuffle(out)
    return out


def measure(
    truth: float,
    launch_factor: float,
    repeat: int,
    launch: int,
    rng: random.Random,
    noise: Noise,
    requests: int = REQUESTS,
) -> LevelResult:
    """One level at concurrency 1: ``requests`` one after another, TTFT 30 ms, one
    token per chunk, each request's decode rate noisy."""
    rate = truth * launch_factor * rng.gauss(1.0, noise.repeat_sd)
    samples: list[RequestSample] = []
    t = 0.0
    tokens_total = 0
    for i in range(requests):
        duration = TOKENS / max(1.0, rate * rng.gauss(1.0, noise.request_sd))
        ttft = min(0.5 * duration, max(0.005, rng.gauss(0.030, 0.003)))
        gaps = (max(1e-5, (duration - ttft) / (TOKENS - 1)),) * (TOKENS - 1)
        end = t + ttft + sum(gaps)
        samples.append(
            RequestSample(
                index=i,
                ok=True,
                sent_at=t,
                first_token_at=t + ttft,
                finished_at=end,
                prompt_tokens=64,
                completion_tokens=TOKENS,
                chunk_gaps=gaps,
                chunk_tokens=(1,) * TOKENS,
            )
        )
        tokens_total += TOKENS
        t = end
    metrics = {"output_throughput": tokens_total / t, "duration_s": t}
    intervals = level_intervals(samples, duration_s=t, resamples=100)
    keep = {"output_throughput": intervals["output_throughput"]}
    return LevelResult(
        "chat", "c1", repeat, metrics, intervals=keep, confidence=0.95, launch=launch
    )


def _trial(tid: int) -> TrialRecord:
    return TrialRecord(
        id=tid,
        sweep_id=1,
        seq=tid,
        fingerprint=f"c{tid}",
        params={"config": tid},
        outcome=Outcome.OK,
        instance=InstanceRecord(launcher="subprocess", pids=(1,), gpus=tuple(range(GPUS))),
        attempts=1,
    )


def _data(results: dict[int, list[LevelResult]]) -> SweepData:
    sweep = SweepRecord(1, "accuracy", "a.yaml", "", "h", 0.0, "0")
    return SweepData(
        sweep=sweep,
        trials=tuple(_trial(t) for t in results),
        results={t: tuple(r) for t, r in results.items()},
    )


def hours(launches: int, levels: float) -> float:
    """GPU-hours of ``launches`` launches and ``levels`` measured levels."""
    return (launches * LAUNCH_MIN + levels * LEVEL_MIN) * GPUS / 60


def _launches(rng: random.Random, noise: Noise) -> float:
    return rng.gauss(1.0, noise.launch_sd)


@dataclass
class Decision:
    chosen: int
    gpu_hours: float
    launches: int
    decided: bool
    screened_out: int = 0
    good_screened_out: bool = False
    """A configuration within 2 % of the true best was screened out."""
    equivalent: bool = False
    """The confirm phase ended on equivalence."""
    near_dropped: bool = False
    """A configuration within 0.5 % of the true best was decisively beaten."""


@dataclass
class Variant:
    """How the decisions are made: ``rules`` for ``best`` (None: the defaults) and
    whether the confirm phase stops on equivalence."""

    rules: Rules | None = None
    equivalence: bool = True


DECISION = [Rules()]
"""``decision`` of the sweep file (``--threshold``)."""
SAME = [0]
"""``--same``."""


def variants() -> dict[str, Variant]:
    """The confirm policies compared: servesweep's; without its equivalence stop;
    with pairwise comparisons at ``decision.confidence`` instead of family-wise ones;
    and before the launch rule, the family-wise tie set and the equivalence test (one
    launch's interval taken as it is, the phase ending only when separated or out of
    budget)."""
    rules = DECISION[0]
    return {
        "intervals+confirm": Variant(rules),
        "intervals+confirm, no equivalence stop": Variant(rules, equivalence=False),
        "intervals+confirm, pairwise": Variant(replace(rules, family_wise=False)),
        "intervals+confirm, before": Variant(
            replace(rules, launch_sd=0.0, family_wise=False), equivalence=False
        ),
    }


def _best(results: dict[int, list[LevelResult]], variant: Variant) -> BestResult:
    return find_best(_data(results), OBJECTIVE, rules=variant.rules)


@dataclass
class Confirmed:
    best: BestResult
    extra: int
    """Extra launches spent."""
    equivalent: bool
    """The phase ended because the candidates left were equivalent."""
    dropped: bool
    """A configuration within 0.5 % of the true best was dropped: the confirm phase
    stopped relaunching it as beaten, or the final result (winner and tie set) left it
    out."""


def _near(truth: list[float], trials: set[int]) -> bool:
    """Whether one of ``trials`` is within :data:`NEAR` of the true best."""
    top = max(truth)
    return any(truth[t - 1] >= (1 - NEAR) * top for t in trials)


def _near_dropped(now: BestResult, truth: list[float]) -> bool:
    """Whether ``now`` (a final result) leaves out a configuration within :data:`NEAR`
    of the true best."""
    kept = {c.trial.id for c in now.ties} | ({now.trial.id} if now.trial else set())
    return _near(truth, {c.trial.id for c in now.ranking} - kept)


NEAR = 0.005
"""A configuration this close to the true best (relative) must not be dropped."""


def _confirm(
    results: dict[int, list[LevelResult]],
    truth: list[float],
    rng: random.Random,
    noise: Noise,
    confirm_launches: int,
    variant: Variant | None = None,
) -> Confirmed:
    """The confirm phase as the driver decides it, on ``results`` (one level per launch,
    grown in place): the result of ``best`` at its end, the extra launches spent, how
    it ended and whether a near-best configuration was dropped on the way."""
    variant = variant or Variant(DECISION[0])
    now = _best(results, variant)
    dropped = False
    equivalent = False
    if confirm_launches >= 2:
        spec = ConfirmSpec(top=3, launches=1, budget=ConfirmBudget(launches=confirm_launches))
        rounds: list[Round] = []
        while True:
            tied = [c.trial.id for c in now.ranking if c is now.winner or c in now.ties]
            same = frozenset(c.trial.id for c in now.equivalent) if variant.equivalence else None
            stored = {t: len(r) for t, r in results.items()}  # one level per launch
            step = decide(spec, tied, stored, rounds, equivalent=same or frozenset())
            if rounds and isinstance(step, Relaunch):
                # the candidates of the last round it no longer relaunches as beaten
                left = set(rounds[-1].targets) - set(step.targets) - (same or frozenset())
                dropped = dropped or _near(truth, left)
            if isinstance(step, Done):
                equivalent = step.reason == "equivalent"
                break
            for tid, more in step.more.items():
                for k in range(more):
                    factor = _launches(rng, noise)
                    launch = stored[tid] + k
                    results[tid].append(measure(truth[tid - 1], factor, 0, launch, rng, noise))
            rounds.append(Round(step.round, step.targets, done=True, relaunches=cost(step)))
            now = _best(results, variant)
    extra = spent_launches({t: len(r) for t, r in results.items()}, 1)
    return Confirmed(now, extra, equivalent, dropped or _near_dropped(now, truth))


SCREEN_REQUESTS = REQUESTS // 4
"""``screening: {requests: 25%}``."""


def _references(
    full: dict[int, list[LevelResult]], short: dict[int, LevelResult]
) -> tuple[Reference, ...]:
    """What the driver gives the slot: the candidates of ``best`` so far (measured in
    full), by their own screening figures."""
    if not full:
        return ()
    ref = parse_metric_ref(OBJECTIVE)
    out = []
    for cand in find_best(_data(full), OBJECTIVE, rules=DECISION[0]).ranking:
        stats = screening_stats([short[cand.trial.id]], ref)
        if stats is not None:
            out.append(Reference(cand.trial.id, cand.trial.id, (figure_of(stats, 0.95),)))
    return tuple(out)


SCREEN_THRESHOLD = [0.05]
"""``screening.threshold`` (``--screen-threshold``)."""


def screen_then_confirm(
    ids: list[int], truth: list[float], rng: random.Random, noise: Noise, confirm_launches: int
) -> Decision:
    """Screening, then the confirm phase on what was measured in full."""
    ref = parse_metric_ref(OBJECTIVE)
    short: dict[int, LevelResult] = {}
    full: dict[int, list[LevelResult]] = {}
    for tid in ids:
        factor = _launches(rng, noise)  # one launch: screening, then maybe the full level
        level = measure(truth[tid - 1], factor, 0, 0, rng, noise, requests=SCREEN_REQUESTS)
        short[tid] = replace(level, screening=True)
        policy = ScreenPolicy(
            ((ref, "max"),), references=_references(full, short), threshold=SCREEN_THRESHOLD[0]
        )
        if screen_reason(policy, [short[tid]]) is None:
            full[tid] = [measure(truth[tid - 1], factor, 0, 0, rng, noise)]
    done = _confirm(full, truth, rng, noise, confirm_launches)
    now, extra = done.best, done.extra
    assert now.trial is not None
    n = len(ids)
    levels = n * SCREEN_REQUESTS / REQUESTS + len(full) + extra
    top = max(truth)
    good = any(truth[t - 1] >= 0.98 * top for t in ids if t not in full)
    return Decision(
        now.trial.id,
        hours(n + extra, levels),
        n + extra,
        now.decided,
        n - len(full),
        good,
        done.equivalent,
        done.dropped,
    )


def run_seed(
    seed: int, n: int, noise: Noise, confirm_launches: int
) -> tuple[list[float], dict[str, Decision]]:
    rng = random.Random(seed)
    truth = landscape(rng, n, SAME[0])
    ids = list(range(1, n + 1))
    # one launch of every configuration, three repeats in it (policies read 1 or 3)
    first: dict[int, list[LevelResult]] = {}
    for tid, true in zip(ids, truth, strict=True):
        factor = _launches(rng, noise)
        first[tid] = [measure(true, factor, r, 0, rng, noise) for r in range(3)]
    out: dict[str, Decision] = {}
    one = {t: [r[0]] for t, r in first.items()}
    means = {t: r[0].metrics["output_throughput"] for t, r in one.items()}
    out["mean"] = Decision(max(means, key=means.__getitem__), hours(n, n), n, True)
    three = {
        t: statistics.fmean(x.metrics["output_throughput"] for x in r) for t, r in first.items()
    }
    out["grid-repeats-3"] = Decision(max(three, key=three.__getitem__), hours(n, 3 * n), n, True)
    best = find_best(_data(one), OBJECTIVE, rules=DECISION[0])
    assert best.trial is not None
    leader = best.ranking[0].trial.id
    out["intervals"] = Decision(
        leader, hours(n, n), n, best.decided, near_dropped=_near_dropped(best, truth)
    )
    # confirm: the driver's decision, round by round, on everything measured so far
    for name, variant in variants().items():
        done = _confirm({t: list(r) for t, r in one.items()}, truth, rng, noise,
                        confirm_launches, variant)  # fmt: skip
        now, extra = done.best, done.extra
        assert now.trial is not None
        out[name] = Decision(
            now.trial.id,
            hours(n + extra, n + extra),
            n + extra,
            now.decided,
            equivalent=done.equivalent,
            near_dropped=done.dropped,
        )
    out["screening+confirm"] = screen_then_confirm(ids, truth, rng, noise, confirm_launches)
    return truth, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--launch-sd", type=float, default=0.02)
    parser.add_argument("--request-sd", type=float, default=0.06)
    parser.add_argument(
        "--confirm-launches",
        type=int,
        default=None,
        help="extra launches the confirm phase may spend (default: what keeps the "
        "GPU-hours within those of a grid with repeats: 3)",
    )
    parser.add_argument(
        "--screen-threshold", type=float, default=0.05, help="screening.threshold (0.05)"
    )
    parser.add_argument("--threshold", type=float, default=0.01, help="decision.threshold (0.01)")
    parser.add_argument(
        "--same",
        type=int,
        default=0,
        help="configurations exactly as fast as the best (differing only in --seed) "
        "instead of the two within 0.5-1.5 %%",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    noise = Noise(args.launch_sd, args.request_sd)
    SCREEN_THRESHOLD[0] = args.screen_threshold
    DECISION[0] = Rules(threshold=args.threshold)
    SAME[0] = args.same
    if args.confirm_launches is None:
        # a grid with repeats 3 measures 2 more levels per configuration; one confirm
        # launch costs a launch and a level
        args.confirm_launches = int(2 * args.configs * LEVEL_MIN // (LAUNCH_MIN + LEVEL_MIN))
    started = time.monotonic()
    wrong: dict[str, int] = {}
    hours: dict[str, list[float]] = {}
    ties: dict[str, int] = {}
    same: dict[str, int] = {}
    near: dict[str, int] = {}
    screened: list[int] = []
    good_out = 0
    for seed in range(args.seeds):
        truth, outcomes = run_seed(seed, args.configs, noise, args.confirm_launches)
        top = max(truth)
        for name, o in outcomes.items():
            wrong[name] = wrong.get(name, 0) + (truth[o.chosen - 1] < 0.98 * top)
            hours.setdefault(name, []).append(o.gpu_hours)
            ties[name] = ties.get(name, 0) + (not o.decided)
            same[name] = same.get(name, 0) + o.equivalent
            near[name] = near.get(name, 0) + o.near_dropped
        screened.append(outcomes["screening+confirm"].screened_out)
        good_out += outcomes["screening+confirm"].good_screened_out
    rows: list[dict[str, Any]] = []
    for name in wrong:
        lo, hi = wilson(wrong[name], args.seeds) or (0.0, 0.0)
        rows.append(
            {
                "policy": name,
                "wrong_winners": wrong[name] / args.seeds,
                "wrong_lo": lo,
                "wrong_hi": hi,
                "gpu_hours": statistics.fmean(hours[name]),
                "undecided": ties[name] / args.seeds,
                "equivalent": same[name] / args.seeds,
                "near_best_dropped": near[name] / args.seeds,
            }
        )
    mean_out = statistics.fmean(screened)
    if args.json:
        extra = {"screened_out": mean_out, "good_screened_out": good_out / args.seeds}
        print(json.dumps({"args": vars(args), "rows": rows, **extra}, indent=2))
        return
    print(
        f"{args.seeds} seeds, {args.configs} configurations, launch sd {args.launch_sd:.1%}, "
        f"request sd {args.request_sd:.1%}, threshold {args.threshold:.1%}, "
        f"{args.same} as fast as the best ({time.monotonic() - started:.0f} s)"
    )
    print(
        "| policy | wrong winners (95 % interval) | GPU-hours | left a tie | "
        "ended equivalent | a config within 0.5 % of the best dropped |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['wrong_winners']:.1%} "
            f"({r['wrong_lo']:.1%}..{r['wrong_hi']:.1%}) "
            f"| {r['gpu_hours']:.1f} | {r['undecided']:.0%} | {r['equivalent']:.0%} "
            f"| {r['near_best_dropped']:.0%} |"
        )
    print(
        f"screening+confirm screened out {mean_out:.1f} of {args.configs} on average; "
        f"a configuration within 2 % of the best in {good_out} of {args.seeds} seeds"
    )


if __name__ == "__main__":
    main()
