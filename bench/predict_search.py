"""Predict, then launch only what can still win: GPU-hours to a near-best configuration
against the grid and servesweep's search, on the search landscape, its mirrors and a
landscape whose acceptance and step cost follow other curves than any the predictor
assumes (issue 34).

The landscapes, the cost model (8 GPUs, 30 s stop, 7 min load, an OOM crash 6 min into
the load, 3-4 min per level), the memory gate (servesweep's memory predictor, calibrated
from what the engine prints), the early stop (``search.prune_reason`` after each level)
and the measure (GPU-hours until a trial of a configuration within 2 % of the true best,
truly feasible, finished ``ok``, against the whole grid's) are those of
bench/search_efficiency.py; the mirrors those of bench/search_variants.py.

``curves``: ``max-num-seqs`` 32-256 x ``max-num-batched-tokens`` 2048-16384 x draft
length 0/1/2/4/8 (80 configurations, the same memory truth). Acceptance per position
follows a log-logistic curve (cumulative rate ``1 / (1 + (i / 3)**1.8)``), not a
geometric one; the step time is ``(6 + 0.045 (c (k + 1))**1.15 + 0.9 k**0.7 + 1.2 [k > 0])
ms`` times a scheduling factor in ``max-num-seqs`` (best near 75) and a chunked-prefill
interference that falls with ``max-num-batched-tokens``; the TTFT at c1 grows with the
batched tokens and the draft length (the constraint ``< 200 ms`` cuts the largest).
Throughput at concurrency ``c`` is ``c * E[L](k) / T``. Levels report the acceptance
length (1 % noise) and, as vLLM's and llama.cpp's counters give them, the accepted
tokens per draft position over 2000 drafts (1 % noise each; ``--no-counters``: not).

``servesweep run`` (rows ``sweep``, :func:`run_sweep`): ``search.strategy: tpe`` with
both gates as the driver places a trial: the memory gate, then the performance gate
(``sweep/core/predict_gate.decide_launch`` on the predictions of every configuration
not finished, with the trust the sweep earned), a skipped proposal told to the search
as the driver tells it; when the search ends, the skipped configurations still open
(``decide.perf.gate.still_open``) are launched, as the driver's last step does. The
search is given the predictor's setting as the driver gives it (``guide_of``): it
launches the design's first configurations and then what the prediction says can
still win (``decide.perf.design``); rows ``before``: the same without it (TPE alone
proposes, as ``servesweep run`` did before), on the same seeds.

The policy ``predict`` (a policy of this benchmark, not what ``servesweep run`` does:
it chooses the next launch itself instead of gating a sampler's proposals;
servesweep.decide.perf, told the draft parameter, the levels' concurrency, and that
acceptance depends on the draft length only):

- a configuration the memory gate predicts not to fit is skipped (as ``+predict``);
- the first launch is a seeded random pick among the rest (nothing is predicted yet);
- then, every step, every configuration not launched is predicted from the trials so
  far; one that can still win is one whose objective interval reaches the leader's
  measured value times ``1 + threshold`` (1 %) and whose constraint interval is not
  wholly past the limit (an unknown one can win);
- the predicted best among them is launched when its predicted value beats the
  leader; else the predicted one whose interval reaches highest; else the unknown one
  nearest the leader (normalized knob distance); so before the end every configuration
  whose interval still reaches the leader's is launched (``--order`` tries others);
- it ends when nothing can still win; ``best`` is then the leader, and a wrong winner
  is a leader more than 2 % below the true best (or truly infeasible);
- each launch's prediction of the objective and the constraint is verified against
  what it measured (``decide.perf.verify``: a miss widens the intervals for the rest).

``--warm``: the policy started from an earlier sweep's trials (the policy on the
landscape as an earlier engine version measured it, another seed): only the new sweep's
GPU-hours count. ``--warm --sweep-only``: ``servesweep run`` started warm from the same
earlier sweep (:func:`warm_sweeps`: the gate and the guide given its trials, against
the gate alone, the guide cold, as before). ``--h100``: issue 34's H100 draft lengths
predicted from a few.

Run:  .venv/bin/python bench/predict_search.py [--seeds 100] [--landscapes L,..] [--order ucb]
                                              [--sweep-only]
      .venv/bin/python bench/predict_search.py --warm | --h100
      .venv/bin/python bench/predict_search.py --warm --sweep-only [--seeds N --first-seed F]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import search_efficiency as se
import search_variants as sv
from landscape_memory import engine_memory

from servesweep.decide.perf import Measured, Prediction, Setting, Trust, predict, verify
from servesweep.decide.perf.gate import still_open
from servesweep.decide.perf.inputs import measured_of
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search import create_search, goal_of
from servesweep.sweep.core.predict_gate import decide_launch, guide_of, leader_of

Key = se.Key
OBJECTIVE = "chat.c8.output_throughput"
CONSTRAINT = "chat.c1.ttft_p99_ms"
THRESHOLD = 0.01
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32}
LATENCY = {"c1": 1.0, "c8": 1.4, "c32": 2.5}
ACCEPTANCE_NOISE = 0.01
ORIGINAL_SPEC = list(se.SPEC_TOKENS)
COUNTERS = True
"""Whether ``curves`` levels carry the engine's per-position acceptance counters, as
vLLM's and llama.cpp's do (``--no-counters``: only the acceptance length)."""
ORDER = "ucb"
"""What to launch when no predicted configuration beats the leader: ``ucb`` the
predicted one whose interval reaches highest, then the unknown one nearest the leader;
``near`` the unknown one nearest the leader first; ``far`` the unknown one farthest from
every launched one first (``--order``)."""


def curves_rate(i: int) -> float:
    """The ``curves`` landscape's cumulative acceptance rate at draft position ``i``."""
    return 1 / (1 + (i / 3) ** 1.8)


def curves_length(k: int) -> float:
    return 1 + sum(curves_rate(i) for i in range(1, k + 1))


def curves_step_ms(c: int, k: int, seqs: int, tokens: int) -> float:
    base = 6 + 0.045 * (c * (k + 1)) ** 1.15 + 0.9 * k**0.7 + 1.2 * (k > 0)
    sched = 1 + 0.06 * (math.log2(seqs / 32) - 1.2) ** 2
    prefill = 1 + 0.5 * (2048 / tokens) ** 0.8 * min(c, 8) / 8
    return base * sched * prefill


def curves_throughput(c: int, key: Key) -> float:
    seqs, tokens, k = key
    return c * curves_length(k) / curves_step_ms(c, k, seqs, tokens) * 1000


def curves_ttft(key: Key) -> float:
    seqs, tokens, k = key
    return 60 + 0.0105 * tokens * (1 + 0.08 * k) + 0.05 * seqs


@dataclass(frozen=True)
class Landscape:
    name: str
    drafts: tuple[int, ...]
    truth: Mapping[Key, se.Truth]
    level: se.LevelFn


DRAFTS_PER_LEVEL = 2000
"""Drafts a ``curves`` level counts (its per-position counters' denominator)."""


def _curves_level(label: str, key: Key, rng: random.Random) -> LevelResult:
    c, k = CONCURRENCY[label], key[2]
    metrics = {
        "output_throughput": curves_throughput(c, key) * (1 + rng.gauss(0, se.THROUGHPUT_NOISE)),
        "ttft_p99_ms": curves_ttft(key) * LATENCY[label] * (1 + rng.gauss(0, se.LATENCY_NOISE)),
        "error_rate": 0.0,
    }
    info: dict[str, Any] = {}
    if k:
        metrics["acceptance_length"] = curves_length(k) * (1 + rng.gauss(0, ACCEPTANCE_NOISE))
        if COUNTERS:
            per_pos = [
                DRAFTS_PER_LEVEL * curves_rate(i) * (1 + rng.gauss(0, ACCEPTANCE_NOISE))
                for i in range(1, k + 1)
            ]
            info["spec_decode"] = {"drafts": DRAFTS_PER_LEVEL, "accepted_per_position": per_pos}
    return LevelResult(workload="chat", level=label, repeat=0, metrics=metrics, info=info)


def landscape(name: str) -> Landscape:
    """Point bench/search_efficiency's globals at landscape ``name`` and describe it."""
    if name == "curves":
        drafts = (0, 1, 2, 4, 8)
        keys = itertools.product(se.SEQS, se.TOKENS, drafts)
        truth = {
            k: se.Truth(curves_throughput(8, k), engine_memory(*k).oom, curves_ttft(k))
            for k in keys
        }
        level = _curves_level
    else:
        drafts = tuple(ORIGINAL_SPEC)
        sv.use(name)
        truth = dict(se.TRUTH)
        level = se.classic_level
    se.SPEC_TOKENS = list(drafts)
    se.TRUTH = truth
    se.BEST = max(t.throughput for t in truth.values() if t.feasible)
    se.NEAR_BEST = {
        k for k, t in truth.items() if t.feasible and t.throughput >= (1 - se.NEAR) * se.BEST
    }
    return Landscape(name, drafts, truth, level)


SETTING = Setting(
    metrics=(OBJECTIVE, CONSTRAINT),
    draft_param=se.SPEC_PARAM,
    concurrency={f"chat.{label}": c for label, c in CONCURRENCY.items()},
    invariant={"acceptance_length": frozenset({"max-num-seqs", "max-num-batched-tokens"})},
    noise=0.02,
)


def _params(key: Key) -> dict[str, Any]:
    return {"max-num-seqs": key[0], "max-num-batched-tokens": key[1], se.SPEC_PARAM: key[2]}


def _position(key: Key, land: Landscape) -> tuple[float, float, float]:
    seqs, tokens, k = key
    return (
        math.log2(seqs / se.SEQS[0]) / math.log2(se.SEQS[-1] / se.SEQS[0]),
        math.log2(tokens / se.TOKENS[0]) / math.log2(se.TOKENS[-1] / se.TOKENS[0]),
        land.drafts.index(k) / (len(land.drafts) - 1),
    )


@dataclass(frozen=True)
class Run:
    seed: int
    gpu_hours: float | None
    """GPU-hours until a near-best configuration finished ok (None: never)."""
    restarts: int | None
    launched: int
    total_gpu_hours: float
    """Until the policy ended (every configuration that could still win launched)."""
    wrong_winner: bool
    oom_started: int
    """OOM crashes launched before the best was reached."""
    misses: int
    """Launched configurations whose measured objective fell outside its interval."""
    seconds: float
    """The policy's own time (predictions and decisions)."""
    search_seconds: float = 0.0
    """``servesweep run``: the search's own time in it (asks and tells)."""


def _can_win(p: Mapping[str, Prediction], leader: float | None) -> bool:
    if leader is not None and not p[OBJECTIVE].reaches(leader * (1 + THRESHOLD), True):
        return False
    return p[CONSTRAINT].reaches(se.TTFT_LIMIT_MS, maximize=False)


def run_policy(
    land: Landscape, seed: int, earlier: Sequence[Measured] = (), out: list[Measured] | None = None
) -> Run:
    """The policy on ``land`` with ``earlier`` sweeps' trials as a warm start; the
    trials it measured are added to ``out``."""
    spec = se.sweep_spec("grid", seed, predict="skip")
    pruner = create_search(spec, [])  # its early stop, told every trial as the driver does
    gate = se.Predictor(spec)
    rng, noise = random.Random(f"policy:{seed}"), random.Random(f"noise:{seed}")
    todo = list(land.truth)
    measured: list[Measured] = []
    keys: list[Key] = []
    trust = Trust()
    leader: tuple[float, Key] | None = None
    gpu_s = own = 0.0
    reached: tuple[float, int] | None = None
    launched = oom = misses = 0
    while todo:
        started = time.perf_counter()
        fits = [k for k in todo if gate.skip(ServerConfig.of(_params(k))) is None]
        if not fits:
            own += time.perf_counter() - started
            break
        if not measured and not earlier:
            pick, forecast = rng.choice(fits), None
        else:
            preds = predict(SETTING, [_params(k) for k in fits], measured, earlier, trust)
            best = leader[0] if leader else None
            able = [(k, p) for k, p in zip(fits, preds, strict=True) if _can_win(p, best)]
            if not able:
                own += time.perf_counter() - started
                break
            better = [
                (k, p)
                for k, p in able
                if p[OBJECTIVE].value is not None and (best is None or p[OBJECTIVE].value > best)
            ]
            unknown = [(k, p) for k, p in able if not p[OBJECTIVE].known]
            reaching = [(k, p) for k, p in able if p[OBJECTIVE].known]
            if better:
                pick, forecast = max(better, key=lambda kp: kp[1][OBJECTIVE].value or 0)
            elif ORDER == "ucb" and reaching:
                pick, forecast = max(reaching, key=lambda kp: kp[1][OBJECTIVE].high or 0)
            elif unknown and ORDER == "far":
                pick, forecast = max(
                    unknown,
                    key=lambda kp: (
                        min(math.dist(_position(kp[0], land), _position(m, land)) for m in keys),
                        rng.random(),
                    ),
                )
            elif unknown:
                at = leader[1] if leader else keys[-1] if keys else None
                anchor = _position(at, land) if at else (0.5, 0.5, 0.5)
                pick, forecast = min(
                    unknown,
                    key=lambda kp: (math.dist(_position(kp[0], land), anchor), rng.random()),
                )
            else:
                pick, forecast = max(able, key=lambda kp: kp[1][OBJECTIVE].high or 0)
        own += time.perf_counter() - started
        todo.remove(pick)
        config = ServerConfig.of(_params(pick))
        gate.skip(config)  # the gate's last prediction, which learn() calibrates
        launched += 1
        record, results, seconds = se.run_trial(
            pruner, launched, config, gpu_s / se.GPUS, noise, land.level
        )
        gpu_s += seconds * se.GPUS
        pruner.tell(record, results)
        if record.outcome is Outcome.FAILED:
            oom += reached is None
            continue
        gate.learn(config)
        trial = measured_of([(record, results)])[0]
        metrics = dict(trial.metrics)
        measured.append(trial)
        keys.append(pick)
        started = time.perf_counter()
        if forecast is not None:
            for metric in (OBJECTIVE, CONSTRAINT):
                if metric in metrics:
                    widened = verify(trust, forecast[metric], metrics[metric])
                    misses += metric == OBJECTIVE and widened != trust
                    trust = widened
        own += time.perf_counter() - started
        meets = metrics.get(CONSTRAINT, math.inf) < se.TTFT_LIMIT_MS
        ok = record.outcome is Outcome.OK and meets and OBJECTIVE in metrics
        if ok and (leader is None or metrics[OBJECTIVE] > leader[0]):
            leader = (metrics[OBJECTIVE], pick)
        if record.outcome is Outcome.OK and pick in se.NEAR_BEST and reached is None:
            reached = (gpu_s / 3600, launched)
    wrong = leader is None or leader[1] not in se.NEAR_BEST
    if out is not None:
        out.extend(measured)
    return Run(
        seed,
        reached[0] if reached else None,
        reached[1] if reached else None,
        launched,
        gpu_s / 3600,
        wrong,
        oom,
        misses,
        own,
    )


def run_sweep(
    land: Landscape,
    seed: int,
    guided: bool = True,
    earlier: Sequence[Measured] = (),
    warm_guide: bool = True,
) -> Run:
    """``servesweep run`` with ``search.strategy: tpe`` on ``land``: each proposal
    through the memory gate and then the performance gate (``sweep/core/predict_gate``'s
    :func:`decide_launch`, on the predictions of every configuration not finished yet,
    with the sweep's trust), a skip told to the search as the driver tells it; after the
    search ends, the skipped configurations still open (``decide.perf.gate.still_open``)
    are launched, as the driver's last step does. ``guided``: the search is given the
    predictor's setting, as the driver gives it (``guide_of``: the design's first
    launches, then the predicted best); False: as before it was (TPE alone proposes).
    ``earlier``: an earlier sweep's trials, which the performance gate starts from (a
    warm start) and, with ``warm_guide``, the guide too, as ``run`` gives them
    (``PredictGate.earlier``); without ``warm_guide`` the guide starts cold, as it did
    before it was given them."""
    spec = se.sweep_spec("tpe", seed)
    setting = guide_of(spec, True)
    assert setting is not None
    warm = earlier if guided and warm_guide else ()
    memory = se.Predictor(spec)

    def over(params: Mapping[str, Any], at: float | None = None) -> int | None:
        return memory.model.predict(params).over_by  # no replay here: ``at`` never set

    guide = setting if guided else None
    # the memory prediction as the driver gives it (run.py)
    search = create_search(spec, [], guide=guide, earlier=warm, memory=over if guided else None)
    goal = goal_of(spec)
    noise = random.Random(f"noise:{seed}")
    history: list[tuple[TrialRecord, list[LevelResult]]] = []
    finished: set[Key] = set()
    skipped: dict[Key, TrialRecord] = {}
    trust = Trust()
    gpu_s = own = searching = 0.0
    reached: tuple[float, int] | None = None
    launched = oom = misses = 0

    def launch(seq: int, config: ServerConfig, made: Mapping[str, Prediction] | None) -> None:
        nonlocal gpu_s, own, reached, launched, oom, misses, trust, searching
        key = se._key(config.params)
        launched += 1
        record, results, seconds = se.run_trial(
            search, seq, config, gpu_s / se.GPUS, noise, land.level
        )
        gpu_s += seconds * se.GPUS
        started = time.perf_counter()
        search.tell(record, results)
        searching += time.perf_counter() - started
        history.append((record, results))
        finished.add(key)
        if record.outcome is Outcome.FAILED:
            oom += reached is None
            return
        memory.learn(config)
        started = time.perf_counter()
        measured = measured_of([(record, results)])
        if made is not None and measured:
            for metric, p in made.items():
                if metric in measured[0].metrics:
                    widened = verify(trust, p, measured[0].metrics[metric])
                    misses += metric == OBJECTIVE and widened != trust
                    trust = widened
        own += time.perf_counter() - started
        if record.outcome is Outcome.OK and key in se.NEAR_BEST and reached is None:
            reached = (gpu_s / 3600, launched)

    def predictions(first: Mapping[str, Any]) -> list[dict[str, Prediction]]:
        others = [_params(k) for k in land.truth if k not in finished and _params(k) != first]
        return predict(setting, [dict(first), *others], measured_of(history), earlier, trust)

    for seq in itertools.count(1):
        started = time.perf_counter()
        config = search.ask()
        own += time.perf_counter() - started
        searching += time.perf_counter() - started
        if config is None:
            break
        key = se._key(config.params)
        evidence = memory.skip(config)
        if evidence is not None:
            record = se._skipped(seq, config, evidence, gpu_s / se.GPUS)
            started = time.perf_counter()
            search.tell(record, [])
            searching += time.perf_counter() - started
            history.append((record, []))
            finished.add(key)
            continue
        started = time.perf_counter()
        made = predictions(config.params)
        leader = leader_of(goal, history)
        evidence = decide_launch(made[0], goal, leader, spec.decision.threshold, str(key))
        own += time.perf_counter() - started
        if evidence is not None:
            record = se._skipped(seq, config, evidence, gpu_s / se.GPUS)
            started = time.perf_counter()
            search.tell(record, [])
            searching += time.perf_counter() - started
            history.append((record, []))
            finished.add(key)
            skipped[key] = record
            continue
        launch(seq, config, made[0])
    while True:  # the driver's last step: launch what is still open
        started = time.perf_counter()
        leader = leader_of(goal, history)
        reopen = [
            record
            for record in skipped.values()
            if still_open(predictions(record.params)[0], leader, goal.constraints)
        ]
        own += time.perf_counter() - started
        if not reopen:
            break
        for record in reopen:
            del skipped[se._key(record.params)]
            config = ServerConfig.of(record.params)
            if memory.skip(config) is None:
                launch(record.seq, config, predictions(record.params)[0])
    leader = leader_of(goal, history)
    ran = {r.id: r for r, _ in history if r.outcome is Outcome.OK}
    wrong = leader is None or se._key(ran[leader.trial].params) not in se.NEAR_BEST
    return Run(
        seed,
        reached[0] if reached else None,
        reached[1] if reached else None,
        launched,
        gpu_s / 3600,
        wrong,
        oom,
        misses,
        own,
        searching,
    )


def drifted(land: Landscape) -> Landscape:
    """``land`` as an earlier engine version measured it: throughput 5 % lower at the
    smallest ``max-num-seqs`` to 5 % higher at the largest, the TTFT 5 % higher."""

    def level(label: str, key: Key, rng: random.Random) -> dict[str, float]:
        result = land.level(label, key, rng)
        drift = 1 + 0.1 * (_position(key, land)[0] - 0.5)
        metrics = dict(result.metrics)
        metrics["output_throughput"] *= drift
        metrics["ttft_p99_ms"] *= 1.05
        return dataclasses.replace(result, metrics=metrics)

    return Landscape(f"{land.name} (earlier)", land.drafts, land.truth, level)


def warm(name: str, seeds: int) -> dict[str, Any]:
    """The policy started warm: before each seed's sweep, an earlier sweep (the policy
    on the :func:`drifted` landscape, another seed) gives its trials as ``earlier``."""
    land = landscape(name)
    full = se.grid_cost()
    runs = []
    for seed in range(seeds):
        earlier: list[Measured] = []
        run_policy(drifted(land), 1000 + seed, out=earlier)
        runs.append(run_policy(land, seed, earlier))
    hours = _hours([r.gpu_hours for r in runs])
    return {
        "landscape": name,
        "warm_median": statistics.median(hours) / full,
        "warm_p90": _pct(hours, 0.9) / full,
        "warm_total_median": statistics.median(r.total_gpu_hours for r in runs) / full,
        "warm_launched_median": statistics.median(r.launched for r in runs),
        "wrong_winners": sum(r.wrong_winner for r in runs) / len(runs),
        "never": sum(r.gpu_hours is None for r in runs),
        "misses_per_run": statistics.mean(r.misses for r in runs),
    }


def warm_sweeps(name: str, seeds: int, first: int = 0) -> dict[str, Any]:
    """``servesweep run`` started warm, on the seeds ``first`` .. ``first + seeds - 1``:
    before each seed's sweep, the same earlier sweep as :func:`warm` (the ``predict``
    policy on the :func:`drifted` landscape, seed ``1000 + seed``) gives its trials as
    the earlier sweep's; rows ``before``: the gate warm and the guide cold (as ``run``
    was before the guide was given them), ``sweep``: both warm (as it runs now). Only
    the new sweep's GPU-hours count."""
    land = landscape(name)
    before, sweeps = [], []
    for seed in range(first, first + seeds):
        earlier: list[Measured] = []
        run_policy(drifted(land), 1000 + seed, out=earlier)
        before.append(run_sweep(land, seed, earlier=earlier, warm_guide=False))
        sweeps.append(run_sweep(land, seed, earlier=earlier))
    return _sweep_table(name, land, before, sweeps)


def _sweep_table(
    name: str, land: Landscape, before: Sequence[Run], sweeps: Sequence[Run]
) -> dict[str, Any]:
    """The landscape ``name`` and its grid, and the ``servesweep run`` rows ``before``
    and ``sweep`` (now) over the same seeds."""
    full = se.grid_cost()
    grid = se.run_search("grid", 0, predict=True, predict_mode="skip")
    return {
        "landscape": name,
        "configs": len(land.truth),
        "oom": sum(t.oom for t in land.truth.values()),
        "near_best": sorted(se.NEAR_BEST),
        "grid_gpu_hours": full,
        "grid_to_best": (grid.gpu_hours or math.inf) / full,
        **_sweep_rows("before", before, full),
        **_sweep_rows("sweep", sweeps, full),
        "before_runs": [asdict(r) for r in before],
        "sweep_runs": [asdict(r) for r in sweeps],
    }


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _hours(values: Sequence[float | None]) -> list[float]:
    return [v if v is not None else math.inf for v in values]


def _sweep_rows(prefix: str, sweeps: Sequence[Run], full: float) -> dict[str, Any]:
    hours = _hours([r.gpu_hours for r in sweeps])
    return {
        f"{prefix}_median": statistics.median(hours) / full,
        f"{prefix}_p90": _pct(hours, 0.9) / full,
        f"{prefix}_total_median": statistics.median(r.total_gpu_hours for r in sweeps) / full,
        f"{prefix}_launched_median": statistics.median(r.launched for r in sweeps),
        f"{prefix}_restarts_median": statistics.median(r.restarts or math.inf for r in sweeps),
        f"{prefix}_restarts_p90": _pct([r.restarts or math.inf for r in sweeps], 0.9),
        f"{prefix}_wrong_winners": sum(r.wrong_winner for r in sweeps) / len(sweeps),
        f"{prefix}_oom_started_median": statistics.median(r.oom_started for r in sweeps),
        f"{prefix}_oom_started_max": max(r.oom_started for r in sweeps),
        f"{prefix}_ms_per_launch": 1000
        * sum(r.seconds for r in sweeps)
        / max(1, sum(r.launched for r in sweeps)),
        f"{prefix}_search_ms_per_launch": 1000
        * sum(r.search_seconds for r in sweeps)
        / max(1, sum(r.launched for r in sweeps)),
    }


def compare(name: str, seeds: int, sweep_only: bool = False, first: int = 0) -> dict[str, Any]:
    """The grid, tpe+predict (servesweep's search with the memory gate), the prediction
    policy and ``servesweep run`` (unguided, as before the search was guided, and as it
    runs now) on landscape ``name``, over ``seeds`` seeds (``sweep_only``: the two
    ``servesweep run`` rows alone)."""
    land = landscape(name)
    full = se.grid_cost()
    before = [run_sweep(land, seed, guided=False) for seed in range(first, first + seeds)]
    sweeps = [run_sweep(land, seed) for seed in range(first, first + seeds)]
    out = _sweep_table(name, land, before, sweeps)
    if sweep_only:
        return out
    tpe = [se.run_search("tpe", seed, predict=True) for seed in range(seeds)]
    runs = [run_policy(land, seed) for seed in range(seeds)]
    hours = _hours([r.gpu_hours for r in runs])
    tpe_hours = _hours([r.gpu_hours for r in tpe])
    return out | {
        "tpe_median": statistics.median(tpe_hours) / full,
        "tpe_p90": _pct(tpe_hours, 0.9) / full,
        "tpe_oom_started_median": statistics.median(r.oom_started for r in tpe),
        "predict_median": statistics.median(hours) / full,
        "predict_p90": _pct(hours, 0.9) / full,
        "predict_total_median": statistics.median(r.total_gpu_hours for r in runs) / full,
        "predict_launched_median": statistics.median(r.launched for r in runs),
        "predict_restarts_median": statistics.median(r.restarts or math.inf for r in runs),
        "wrong_winners": sum(r.wrong_winner for r in runs) / len(runs),
        "never": sum(r.gpu_hours is None for r in runs),
        "oom_started_median": statistics.median(r.oom_started for r in runs),
        "oom_started_max": max(r.oom_started for r in runs),
        "misses_per_run": statistics.mean(r.misses for r in runs),
        "ms_per_launch": 1000
        * sum(r.seconds for r in runs)
        / max(1, sum(r.launched for r in runs)),
        "runs": [asdict(r) for r in runs],
    }


H100_ACCEPTANCE = {1: 1.80, 2: 2.42, 4: 3.29, 8: 4.23, 16: 4.79}
H100_THROUGHPUT = {
    1: {0: 809.0, 1: 809.0, 2: 827.0, 4: 877.0, 8: 898.0, 16: 853.0},
    4: {0: 1641.0, 1: 1652.0, 2: 1795.0, 4: 2135.0, 8: 1944.0, 16: 1527.0},
}
"""Issue 34's H100 figures: llama-server, random-weight target and draft, acceptance set
by ``--spec-synth-rates`` to 0.8^i; output tok/s per draft length (0: no draft)."""


def h100(measured: Sequence[int], model: bool) -> list[str]:
    """The H100 landscape predicted from the draft lengths ``measured`` as servesweep
    reads it (on a GPU); ``model``: read as if it had run on CPUs, where a draft model's
    step costs per drafted token (``Setting.cpu``): what that reading costs on a GPU."""
    setting = Setting(
        metrics=("chat.c1.output_throughput", "chat.c4.output_throughput"),
        draft_param="spec_draft_n_max",
        concurrency={"chat.c1": 1, "chat.c4": 4},
        model_drafts=True,  # the server's args named the draft model
        cpu=model,
    )
    trials = []
    for k in measured:
        metrics = {f"chat.c{c}.output_throughput": H100_THROUGHPUT[c][k] for c in (1, 4)}
        if k:
            metrics |= {f"chat.c{c}.acceptance_length": H100_ACCEPTANCE[k] for c in (1, 4)}
        trials.append(Measured({"spec_draft_n_max": k}, metrics))
    drafts = list(H100_THROUGHPUT[1])
    got = predict(setting, [{"spec_draft_n_max": k} for k in drafts], trials)
    lines = []
    for c in (1, 4):
        for k, g in zip(drafts, got, strict=True):
            if k in measured:
                continue
            p, truth = g[f"chat.c{c}.output_throughput"], H100_THROUGHPUT[c][k]
            assert p.value is not None and p.low is not None and p.high is not None
            inside = "yes" if p.low <= truth <= p.high else "no"
            lines.append(
                f"| {'CPU' if model else 'GPU'} | {','.join(map(str, measured))} | c{c} | {k} "
                f"| {truth:.0f} | {p.value:.0f} "
                f"| {p.value / truth - 1:+.1%} | {p.low:.0f}-{p.high:.0f} | {inside} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds first-seed .. first-seed + seeds - 1 (--sweep-only: to split a run)",
    )
    parser.add_argument("--landscapes", default="original,mirror,mirror-seqs,mirror-tokens,curves")
    parser.add_argument("--order", choices=("ucb", "near", "far"), default="ucb")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--sweep-only",
        action="store_true",
        help="only servesweep run, before (unguided) and now (guided by the prediction)",
    )
    parser.add_argument(
        "--no-counters",
        action="store_true",
        help="curves levels without the engine's per-position acceptance counters",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="only the policy started warm from an earlier sweep of a drifted landscape",
    )
    parser.add_argument(
        "--h100", action="store_true", help="only the H100 draft-length figures, predicted"
    )
    args = parser.parse_args(argv)
    global COUNTERS, ORDER
    COUNTERS = not args.no_counters
    ORDER = args.order
    if args.warm and args.sweep_only:
        rows = [
            warm_sweeps(name, args.seeds, args.first_seed)
            for name in args.landscapes.split(",")
            if name
        ]
    elif args.warm:
        print(
            f"{'landscape':<14} {'warm p50':>8} {'p90':>6} {'to its end p50':>14} "
            f"{'launches p50':>12} {'wrong winners':>13} {'never':>5} {'misses/run':>10}"
        )
        for name in (n for n in args.landscapes.split(",") if n):
            w = warm(name, args.seeds)
            print(
                f"{name:<14} {w['warm_median']:>8.1%} {w['warm_p90']:>6.1%} "
                f"{w['warm_total_median']:>14.1%} {w['warm_launched_median']:>12g} "
                f"{w['wrong_winners']:>13.0%} {w['never']:>5} {w['misses_per_run']:>10.2f}"
            )
        return 0
    elif args.h100:
        print(
            "| read as | measured | level | draft | measured tok/s | predicted | error "
            "| interval | in |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for model in (False, True):
            for measured in ((0, 1, 2, 4), (0, 2, 4), (0, 4, 8), (0, 1)):
                print("\n".join(h100(measured, model)))
        return 0
    else:
        rows = [
            compare(name, args.seeds, args.sweep_only, args.first_seed)
            for name in args.landscapes.split(",")
            if name
        ]
    if args.json:
        json.dump(rows, sys.stdout, indent=2, default=str)
        print()
        return 0
    print(
        f"{'landscape':<14} {'configs':>7} {'grid':>6} | servesweep run, before: {'p50':>6} "
        f"{'p90':>6} {'to end':>6} {'launches':>8} {'reach p50':>9} {'p90':>4} {'wrong':>5} "
        f"{'OOM p50':>7} {'max':>4} {'ms':>5} {'search':>6} | now: {'p50':>6} {'p90':>6} "
        f"{'to end':>6} {'launches':>8} {'reach p50':>9} {'p90':>4} {'wrong':>5} {'OOM p50':>7} "
        f"{'max':>4} {'ms':>5} {'search':>6}"
    )
    for r in rows:
        cells = []
        for prefix in ("before", "sweep"):
            cells.append(
                f"{r[f'{prefix}_median']:>6.1%} {r[f'{prefix}_p90']:>6.1%} "
                f"{r[f'{prefix}_total_median']:>6.1%} {r[f'{prefix}_launched_median']:>8g} "
                f"{r[f'{prefix}_restarts_median']:>9g} {r[f'{prefix}_restarts_p90']:>4g} "
                f"{r[f'{prefix}_wrong_winners']:>5.0%} {r[f'{prefix}_oom_started_median']:>7g} "
                f"{r[f'{prefix}_oom_started_max']:>4} {r[f'{prefix}_ms_per_launch']:>5.0f} "
                f"{r[f'{prefix}_search_ms_per_launch']:>6.0f}"
            )
        print(
            f"{r['landscape']:<14} {r['configs']:>7} {r['grid_to_best']:>6.0%} | "
            f"{'':>23}{cells[0]} | {'':>5}{cells[1]}"
        )
    if args.sweep_only:
        return 0
    print(
        f"\n{'landscape':<14} {'tpe+predict p50':>15} {'p90':>6} {'predict p50':>11} {'p90':>6} "
        f"{'to its end p50':>14} {'launches p50':>12} {'wrong winners':>13} {'never':>5} "
        f"{'OOM started p50':>15} {'max':>4} {'misses/run':>10} {'ms/launch':>9}"
    )
    for r in rows:
        print(
            f"{r['landscape']:<14} {r['tpe_median']:>15.1%} {r['tpe_p90']:>6.1%} "
            f"{r['predict_median']:>11.1%} {r['predict_p90']:>6.1%} "
            f"{r['predict_total_median']:>14.1%} {r['predict_launched_median']:>12g} "
            f"{r['wrong_winners']:>13.0%} {r['never']:>5} {r['oom_started_median']:>15g} "
            f"{r['oom_started_max']:>4} {r['misses_per_run']:>10.2f} {r['ms_per_launch']:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
