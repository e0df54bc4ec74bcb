"""How many restarts and GPU-hours a search needs to reach a near-best configuration.

A simulated landscape stands in for an inference server: 48 configurations over three
vLLM params (``max-num-seqs`` 4 values x ``max-num-batched-tokens`` 4 x
``speculative_config.num_speculative_tokens`` 3), the memory of a vLLM-like engine
serving a 7.6 B model with an EAGLE-style draft on a 24 GiB GPU (bench/landscape_memory.py)
under which 15 of them fail with CUDA OOM while loading, a latency model under which
more miss the constraint ``chat.c1.ttft_p99_ms < 200``, and an output throughput at
concurrency 8 (the objective) whose ground truth is known. The best feasible
configuration sits next to the OOM cliff and the constraint.

With ``+predict`` (rows ``grid+predict``, ``random+predict``, ``tpe+predict``) every
proposal first goes through servesweep's memory predictor as the driver's memory gate
calls it: the predictor reads the model's and the draft's config.json and the engine's
settings (never the landscape's truth), a configuration predicted not to fit by more
than the margin is skipped (``predicted_oom``, no GPU time) and told to the search as
infeasible, and every configuration that came up calibrates the predictor with the
figures the engine prints while loading. ``oom_started`` counts the OOM crashes
launched before the best was reached. Rows ``NAME+oracle`` (``--strategies
tpe+oracle``) skip exactly the configurations that do not fit, from the landscape's
truth: what a perfect predictor would give. A second table splits the GPU-hours up to
the best by where they went.

Every strategy runs through :class:`servesweep.search.Search` exactly as the driver
calls it (ask, run the levels c1, c8, c32 with :func:`prune_reason` after each, tell),
with no servers: each trial's measurements are the ground truth with noise (1 % on
throughput, 3 % on latency) and its cost comes from a model of a large deployment:
8 GPUs, 30 s to stop and release, 7 min to load, 6 min into the load for an OOM crash,
3-4 min per load level. A strategy has *reached* the best when a trial of a
configuration within 2 % of the true best (and truly feasible) finished ``ok``; the
restarts and GPU-hours spent up to then (that trial included) are reported, over
``--seeds`` seeds, against the GPU-hours of the whole grid (what a grid sweep spends to
know its best). The grid's own order is shown too: where its first near-best
configuration happens to come.

The capacity part runs :func:`servesweep.bench.capacity_search.next_load` on synthetic
load curves with a known capacity, drawn at random over the range: an open-loop queue
(latency ``1/(1 - load/mu)``, the SLO 1.5x to 20x the unloaded latency, an overloaded
level scoring what its queue made it), a closed loop flat until its batch fills and then
growing as a power (0.7 to 3) of the concurrency, and a bare pass/fail step, each
without noise and with 3 % noise on every level's score (a p99 measured from a few
hundred requests). Ranges: rates 0.5-64 req/s, concurrency 1-256; tolerance 5 %,
at most 8 levels.

Run:  .venv/bin/python bench/search_efficiency.py [--seeds 100] [--startup 2,4,8] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from landscape_memory import GPU_BYTES, engine_memory, sweep_server, write_models

from servesweep.bench.capacity_search import Probe, estimate, next_load
from servesweep.models import Evidence, FailureClass, LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search import Search, create_search, prune_reason
from servesweep.servers.memory import Capacity, MemoryModel
from servesweep.servers.memory.calibrate import Calibrator
from servesweep.spec.schema import SweepSpec
from servesweep.spec.schema_search import CapacitySpec

SEQS = [32, 64, 128, 256]
TOKENS = [2048, 4096, 8192, 16384]
SPEC_TOKENS = [0, 2, 4]
SPEC_PARAM = "speculative_config.num_speculative_tokens"
_MODELS = write_models(Path(tempfile.mkdtemp(prefix="servesweep-landscape-")))
LEVELS = (("c1", 180.0), ("c8", 240.0), ("c32", 240.0))
"""Load levels in run order with their bench seconds."""
GPUS = 8
STOP_RELEASE_S = 30.0
LOAD_S = 420.0
OOM_AFTER_S = 360.0
TTFT_LIMIT_MS = 200.0
NEAR = 0.02
THROUGHPUT_NOISE = 0.01
LATENCY_NOISE = 0.03


@dataclass(frozen=True)
class Truth:
    throughput: float
    """Output tokens/s at concurrency 8."""
    oom: bool
    """The engine's memory does not fit (bench/landscape_memory.py)."""
    ttft_ms: float
    """p99 time to first token at concurrency 1."""

    @property
    def feasible(self) -> bool:
        return not self.oom and self.ttft_ms < TTFT_LIMIT_MS


def truth(seqs: int, tokens: int, spec_tokens: int) -> Truth:
    """The landscape's ground truth (smooth, with interactions)."""
    i, j, h = math.log2(seqs / 32), math.log2(tokens / 2048), spec_tokens / 2
    throughput = (
        900
        * (1 + 0.24 * i - 0.05 * i * i)
        * (1 + 0.16 * j - 0.035 * j * j)
        * (1 + 0.16 * h - 0.05 * h * h - 0.035 * h * i)
    )
    ttft = 70 + 0.0105 * tokens * (1 + 0.12 * h) + 9 * i
    return Truth(throughput, engine_memory(seqs, tokens, spec_tokens).oom, ttft)


def _key(params: Mapping[str, Any]) -> tuple[int, int, int]:
    return (
        int(params["max-num-seqs"]),
        int(params["max-num-batched-tokens"]),
        int(params[SPEC_PARAM]),
    )


TRUTH = {key: truth(*key) for key in itertools.product(SEQS, TOKENS, SPEC_TOKENS)}
BEST = max(t.throughput for t in TRUTH.values() if t.feasible)
NEAR_BEST = {k for k, t in TRUTH.items() if t.feasible and t.throughput >= (1 - NEAR) * BEST}


def sweep_spec(strategy: str, seed: int, **search: Any) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "landscape",
            "server": sweep_server(*_MODELS),
            "params": {
                "grid": {
                    "max-num-seqs": SEQS,
                    "max-num-batched-tokens": TOKENS,
                    SPEC_PARAM: SPEC_TOKENS,
                }
            },
            "workloads": [{"name": "chat", "concurrency": [1, 8, 32]}],
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 8},
            "constraints": [f"chat.c1.ttft_p99_ms < {TTFT_LIMIT_MS:g}"],
            "search": {"strategy": strategy, "seed": seed, **search},
        }
    )


def _level(label: str, t: Truth, rng: random.Random) -> LevelResult:
    scale = {"c1": 0.25, "c8": 1.0, "c32": 1.6}[label]
    latency = {"c1": 1.0, "c8": 1.4, "c32": 2.5}[label]
    metrics = {
        "output_throughput": t.throughput * scale * (1 + rng.gauss(0, THROUGHPUT_NOISE)),
        "ttft_p99_ms": t.ttft_ms * latency * (1 + rng.gauss(0, LATENCY_NOISE)),
        "error_rate": 0.0,
    }
    return LevelResult(workload="chat", level=label, repeat=0, metrics=metrics)


Key = tuple[int, int, int]
LevelFn = Callable[[str, Key, random.Random], LevelResult]
"""A level as measured: (level label, configuration key, noise) -> its result."""
StopFn = Callable[[Sequence[LevelResult]], str | None]
"""An early stop beside the search's own (``prune_reason``): why to stop, or None."""


def classic_level(label: str, key: Key, rng: random.Random) -> LevelResult:
    """A level of the landscape in :data:`TRUTH` (this module's)."""
    return _level(label, TRUTH[key], rng)


def run_trial(
    search: Search,
    seq: int,
    config: ServerConfig,
    clock: float,
    rng: random.Random,
    level: LevelFn = classic_level,
    stop: StopFn | None = None,
) -> tuple[TrialRecord, list[LevelResult], float]:
    """One trial as a slot would run it: (record, results, seconds it held the GPUs).

    Its levels are ``level``'s (the landscape in :data:`TRUTH` by default); after each
    level but the last, the search's early stop and then ``stop`` may end it."""
    key = _key(config.params)
    t = TRUTH[key]
    seconds = STOP_RELEASE_S
    results: list[LevelResult] = []
    outcome, failure, evidence = Outcome.OK, None, None
    if t.oom:
        seconds += OOM_AFTER_S
        outcome, failure = Outcome.FAILED, FailureClass.START_CRASH
        evidence = Evidence(message="CUDA out of memory while loading", reason="oom")
    else:
        seconds += LOAD_S
        policy = search.prune_policy()
        for index, (label, bench_s) in enumerate(LEVELS):
            results.append(level(label, key, rng))
            seconds += bench_s
            if index == len(LEVELS) - 1:
                break
            reason = prune_reason(policy, results)
            if reason is None and stop is not None:
                reason = stop(results)
            if reason is not None:
                outcome, evidence = Outcome.PRUNED, Evidence(message=reason)
                break
    record = TrialRecord(
        id=seq,
        sweep_id=1,
        seq=seq,
        fingerprint=config.fingerprint,
        params=dict(config.params),
        outcome=outcome,
        failure_class=failure,
        evidence=evidence,
        attempts=1,
        started_at=clock,
        finished_at=clock + seconds,
        gpus=tuple(range(GPUS)),
    )
    return record, results, seconds


@dataclass(frozen=True)
class Reach:
    strategy: str
    seed: int
    restarts: int | None
    """Trials launched until a near-best one finished ok (None: never)."""
    gpu_hours: float | None
    trials_run: int
    pruned: int
    failed: int
    seconds: float
    """Wall time of the search's own calls (ask, tell, prune decisions)."""
    oom_started: int = 0
    """OOM crashes launched before the best was reached (all of them when never)."""
    skipped: int = 0
    """Configurations the memory prediction did not launch, before the best."""
    skipped_feasible: int = 0
    """Of those, configurations that would have fit (the predictor's false alarms)."""
    skipped_winners: int = 0
    """Of those, configurations that meet the constraint too (a near-best one or not):
    false alarms that could have cost the search something."""
    hours: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Where the GPU-hours up to the best went: OOM crashes, configurations that miss
    the constraint, other feasible configurations (the exploration), the trial that
    reached the best."""


class Predictor:
    """servesweep's memory gate as the driver runs it: predict, skip a certain OOM,
    calibrate from what each configuration that came up reported."""

    def __init__(self, spec: SweepSpec) -> None:
        self.model = MemoryModel.of_sweep(spec, Capacity(GPU_BYTES, "gpu", "landscape"))
        self.calibrator = Calibrator("vllm")

    def skip(self, config: ServerConfig) -> Evidence | None:
        predicted = self.model.predict(config.params)
        self._last = (predicted, self.model.calibration)
        if not predicted.certain_oom:
            return None
        return Evidence(
            message=f"predicted not to fit: {predicted.reason}",
            reason="predicted_oom",
            details={"predicted_memory": predicted.to_json()},
        )

    def learn(self, config: ServerConfig) -> None:
        predicted, applied = self._last
        measured = engine_memory(*_key(config.params)).measured()
        self.model.learn(self.calibrator.add(predicted, measured, applied))


class Oracle(Predictor):
    """The landscape's own memory truth as the prediction (rows ``NAME+oracle``): every
    OOM skipped, nothing else; a bound on what any memory predictor can give."""

    def skip(self, config: ServerConfig) -> Evidence | None:
        super().skip(config)
        if not TRUTH[_key(config.params)].oom:
            return None
        return Evidence(message="the landscape's truth: it does not fit", reason="predicted_oom")


def _skipped(seq: int, config: ServerConfig, evidence: Evidence, clock: float) -> TrialRecord:
    return TrialRecord(
        id=seq,
        sweep_id=1,
        seq=seq,
        fingerprint=config.fingerprint,
        params=dict(config.params),
        outcome=Outcome.SKIPPED,
        evidence=evidence,
        finished_at=clock,
    )


def run_search(
    strategy: str,
    seed: int,
    predict: bool = False,
    predict_mode: str = "auto",
    oracle: bool = False,
    **search: Any,
) -> Reach:
    spec = sweep_spec(strategy, seed, predict=predict_mode, **search)
    engine = create_search(spec, [])
    predictor = (Oracle if oracle else Predictor)(spec) if predict or oracle else None
    rng = random.Random(f"noise:{seed}")
    clock = gpu_seconds = own = 0.0
    pruned = failed = launched = skipped = false_alarms = winners_skipped = 0
    hours = [0.0, 0.0, 0.0, 0.0]
    for seq in itertools.count(1):
        started = time.perf_counter()
        config = engine.ask()
        own += time.perf_counter() - started
        if config is None:
            break
        if predictor is not None:
            started = time.perf_counter()
            evidence = predictor.skip(config)
            if evidence is not None:
                engine.tell(_skipped(seq, config, evidence, clock), [])
                own += time.perf_counter() - started
                skipped += 1
                false_alarms += not TRUTH[_key(config.params)].oom
                winners_skipped += TRUTH[_key(config.params)].feasible
                continue
            own += time.perf_counter() - started
        launched += 1
        record, results, seconds = run_trial(engine, seq, config, clock, rng)
        clock += seconds
        gpu_seconds += seconds * GPUS
        t, reached = TRUTH[_key(config.params)], _key(config.params) in NEAR_BEST
        where = 0 if t.oom else 1 if not t.feasible else 3 if reached else 2
        hours[where] += seconds * GPUS / 3600
        started = time.perf_counter()
        engine.tell(record, results)
        if predictor is not None and record.outcome is not Outcome.FAILED:
            predictor.learn(config)  # it came up: the engine printed its memory
        own += time.perf_counter() - started
        pruned += record.outcome is Outcome.PRUNED
        failed += record.outcome is Outcome.FAILED
        if record.outcome is not Outcome.OK and where == 3:
            hours[2] += hours[3]  # a near-best one pruned by the noise: not reached yet
            hours[3] = 0.0
        if record.outcome is Outcome.OK and _key(config.params) in NEAR_BEST:
            return Reach(
                strategy, seed, launched, gpu_seconds / 3600, launched, pruned, failed, own,
                failed, skipped, false_alarms, winners_skipped, (*hours,),
            )  # fmt: skip
    return Reach(
        strategy, seed, None, None, launched, pruned, failed, own, failed, skipped, false_alarms,
        winners_skipped, (*hours,),
    )  # fmt: skip


def grid_cost() -> float:
    """GPU-hours of the whole grid run as a grid sweep runs it (no pruning)."""
    total = 0.0
    for t in TRUTH.values():
        if t.oom:
            total += STOP_RELEASE_S + OOM_AFTER_S
        else:
            total += STOP_RELEASE_S + LOAD_S + sum(s for _, s in LEVELS)
    return total * GPUS / 3600


HOURS = ("oom crashes", "constraint missed", "exploration", "the reaching trial")
"""Where a strategy's GPU-hours up to the best go (:attr:`Reach.hours`)."""


def _pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank, as a p90 of 10 runs is the 9th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(reaches: Sequence[Reach], full: float) -> dict[str, Any]:
    hours = [r.gpu_hours if r.gpu_hours is not None else math.inf for r in reaches]
    restarts = [r.restarts if r.restarts is not None else math.inf for r in reaches]
    return {
        "runs": len(reaches),
        "never": sum(r.restarts is None for r in reaches),
        "restarts_median": statistics.median(restarts),
        "restarts_p90": _pct(restarts, 0.9),
        "gpu_hours_median": statistics.median(hours),
        "gpu_hours_p90": _pct(hours, 0.9),
        "share_of_grid_median": statistics.median(hours) / full,
        "share_of_grid_p90": _pct(hours, 0.9) / full,
        "search_seconds_per_trial": sum(r.seconds for r in reaches)
        / max(1, sum(r.trials_run for r in reaches)),
        "oom_started_median": statistics.median(r.oom_started for r in reaches),
        "oom_started_p90": _pct([r.oom_started for r in reaches], 0.9),
        "oom_started_max": max(r.oom_started for r in reaches),
        "skipped_median": statistics.median(r.skipped for r in reaches),
        "skipped_feasible_total": sum(r.skipped_feasible for r in reaches),
        "skipped_winners_total": sum(r.skipped_winners for r in reaches),
        "hours_mean": dict(
            zip(
                HOURS,
                (statistics.mean(r.hours[i] for r in reaches) for i in range(len(HOURS))),
                strict=True,
            )
        ),
    }


def _queue(capacity: float, slo_multiple: float) -> Any:
    mu = capacity / (1 - 1 / slo_multiple)

    def score(load: float) -> float:
        rho = load / mu
        return 20 + 10 * rho if rho >= 1 else 1 / (1 - rho) / slo_multiple

    return score


def _power(capacity: float, flat_until: float, exponent: float) -> Any:
    return lambda load: max(flat_until**exponent, (load / capacity) ** exponent)


def _step(capacity: float) -> Any:
    return lambda load: 0.6 if load <= capacity else 1.8


def capacity_runs(count: int, seed: int = 0) -> dict[str, Any]:
    """Levels and error of the capacity search on ``count`` random curves per case."""
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    for vary, low, high in (("rate", 0.5, 64.0), ("concurrency", 1.0, 256.0)):
        spec = CapacitySpec(slo={"ttft_ms": 500}, vary=vary, low=low, high=high)
        for shape in ("queue", "power", "step"):
            for noise in (0.0, 0.03):
                levels, errors = [], []
                for _ in range(count):
                    capacity = math.exp(rng.uniform(math.log(low * 1.3), math.log(high / 1.3)))
                    if vary == "concurrency":
                        capacity = math.floor(capacity) + 0.5  # the truth: its floor
                    if shape == "queue":
                        curve = _queue(capacity, rng.uniform(1.5, 20))
                    elif shape == "power":
                        curve = _power(capacity, rng.uniform(0.2, 0.9), rng.uniform(0.7, 3))
                    else:
                        curve = _step(capacity)
                    probes: list[Probe] = []
                    while (load := next_load(spec, probes)) is not None:
                        probes.append(Probe(load, curve(load) * (1 + rng.gauss(0, noise))))
                    truth = math.floor(capacity) if vary == "concurrency" else capacity
                    found = estimate(spec, probes).capacity
                    levels.append(len(probes))
                    errors.append(abs(found - truth) / truth)
                out[f"{vary}/{shape}/noise {noise:.0%}"] = {
                    "curves": count,
                    "within_5pct_in_8_levels": sum(
                        1 for n, e in zip(levels, errors, strict=True) if n <= 8 and e <= 0.05
                    )
                    / count,
                    "levels_mean": statistics.mean(levels),
                    "levels_max": max(levels),
                    "error_median": statistics.median(errors),
                    "error_max": max(errors),
                }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--strategies",
        default="grid,random,tpe,grid+predict,random+predict,tpe+predict,random+oracle,tpe+oracle",
        help="strategies; NAME+predict runs NAME through the memory prediction, "
        "NAME+oracle with the landscape's memory truth as the prediction",
    )
    parser.add_argument(
        "--startup",
        default="",
        help="also run tpe with these startup_trials, e.g. 2,4,8,10 (rows tpe/s=N)",
    )
    parser.add_argument("--curves", type=int, default=200, help="capacity curves per case")
    args = parser.parse_args(argv)
    full = grid_cost()
    out: dict[str, Any] = {
        "landscape": {
            "configs": len(TRUTH),
            "oom": sum(t.oom for t in TRUTH.values()),
            "constraint_violations": sum(not t.oom and not t.feasible for t in TRUTH.values()),
            "best_throughput": round(BEST, 1),
            "near_best": len(NEAR_BEST),
            "grid_gpu_hours": round(full, 2),
        },
        "search": {},
    }
    runs: list[tuple[str, str, dict[str, Any]]] = []
    for name in (s for s in args.strategies.split(",") if s):
        base, _, flag = name.partition("+")
        runs.append((name, base, {flag: True} if flag in ("predict", "oracle") else {}))
    runs += [
        (f"tpe/s={n}", "tpe", {"startup_trials": int(n)}) for n in args.startup.split(",") if n
    ]
    for label, strategy, settings in runs:
        seeds = [0] if strategy == "grid" else list(range(args.seeds))
        if strategy == "grid" and (settings.get("predict") or settings.get("oracle")):
            settings = {**settings, "predict_mode": "skip"}
        reaches = [run_search(strategy, seed, **settings) for seed in seeds]
        out["search"][label] = {
            "summary": summarize(reaches, full),
            "runs": [asdict(r) for r in reaches],
        }
    out["capacity"] = capacity_runs(args.curves)
    if args.json:
        json.dump(out, sys.stdout, indent=2, default=str)
        print()
        return 0
    land = out["landscape"]
    print(
        f"landscape: {land['configs']} configs, {land['oom']} OOM, "
        f"{land['constraint_violations']} violate the constraint, {land['near_best']} within "
        f"{NEAR:.0%} of the best ({land['best_throughput']} tok/s); whole grid "
        f"{land['grid_gpu_hours']} GPU-h"
    )
    print(
        f"{'strategy':<15} {'runs':>4} {'restarts p50':>12} {'p90':>5} "
        f"{'GPU-h p50':>10} {'p90':>6} {'% grid p50':>10} {'p90':>6} "
        f"{'OOM started p50':>15} {'p90':>4} {'max':>4} {'skipped p50':>11} {'false skips':>11}"
    )
    for strategy, data in out["search"].items():
        s = data["summary"]
        print(
            f"{strategy:<15} {s['runs']:>4} {s['restarts_median']:>12} {s['restarts_p90']:>5} "
            f"{s['gpu_hours_median']:>10.1f} {s['gpu_hours_p90']:>6.1f} "
            f"{s['share_of_grid_median']:>10.0%} {s['share_of_grid_p90']:>6.0%} "
            f"{s['oom_started_median']:>15} {s['oom_started_p90']:>4} {s['oom_started_max']:>4} "
            f"{s['skipped_median']:>11} {s['skipped_feasible_total']:>11}"
        )
    print()
    print("GPU-h per seed up to the best, mean, by where they went (false skips: fit / met")
    print("the constraint too):")
    print(f"{'strategy':<15} " + " ".join(f"{h:>18}" for h in HOURS) + f" {'false skips':>12}")
    for strategy, data in out["search"].items():
        s = data["summary"]
        parts = " ".join(f"{v:>18.2f}" for v in s["hours_mean"].values())
        skips = f"{s['skipped_feasible_total']}/{s['skipped_winners_total']}"
        print(f"{strategy:<15} {parts} {skips:>12}")
    print()
    print(
        f"{'capacity case':<32} {'within 5% in <=8':>16} {'levels mean':>11} {'max':>4} "
        f"{'error p50':>9} {'max':>6}"
    )
    for case, c in out["capacity"].items():
        print(
            f"{case:<32} {c['within_5pct_in_8_levels']:>16.0%} {c['levels_mean']:>11.1f} "
            f"{c['levels_max']:>4} {c['error_median']:>9.1%} {c['error_max']:>6.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
